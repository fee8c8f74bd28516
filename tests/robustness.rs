//! No input panics the server or corrupts a row (H-8), and the command line
//! creates and migrates databases on its own.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::Command;

use common::Server;
use serde_json::{Value, json};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

/// A tiny deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

fn random_value(rng: &mut Rng, depth: u32) -> Value {
    match rng.next() % if depth > 2 { 6 } else { 8 } {
        0 => Value::Null,
        1 => json!(rng.next().is_multiple_of(2)),
        2 => json!(rng.next() as i64),
        3 => json!(-1.5e300),
        4 => json!(*rng.pick(&[
            "",
            "working",
            "\u{0}",
            "é",
            "' OR 1=1 --",
            "x".repeat(3000).as_str()
        ])),
        5 => json!(-((rng.next() % 10) as i64)),
        6 => Value::Array(
            (0..rng.next() % 4)
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "taskId",
                "cursor",
                "name",
                "arguments",
                "task",
                "ttl",
                "_meta",
                "progressToken",
                "seconds",
            ];
            let mut m = serde_json::Map::new();
            for _ in 0..rng.next() % 5 {
                m.insert((*rng.pick(&keys)).to_owned(), random_value(rng, depth + 1));
            }
            Value::Object(m)
        }
    }
}

/// Covers H-8: hundreds of malformed or hostile messages; every answer is a
/// JSON-RPC or HTTP error (never a 5xx, never a dropped connection), the
/// server stays up, and the database passes its integrity check.
#[tokio::test]
async fn h8_random_hostile_input_never_breaks_the_server_or_the_database() {
    let server = Server::start(&["--lease", "1", "--rate", "0"]);
    let mut c = server.client().await;
    let real = c.call_task("sleep", json!({"seconds": 0})).await;
    let methods = [
        "tools/call",
        "tasks/get",
        "tasks/result",
        "tasks/list",
        "tasks/cancel",
        "tools/list",
        "ping",
        "initialize",
        "nope",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut streamed = 0;
    for i in 0..400 {
        let method = *rng.pick(&methods);
        let mut params = random_value(&mut rng, 0);
        if method == "tools/call" && rng.next().is_multiple_of(2) {
            params = json!({"name": *rng.pick(&["sleep", "fail", "echo", "sleep_as_task"]),
                            "arguments": random_value(&mut rng, 1), "task": random_value(&mut rng, 1)});
        }
        if method.starts_with("tasks/") && rng.next().is_multiple_of(3) {
            params = json!({"taskId": real["taskId"], "cursor": random_value(&mut rng, 1)});
        }
        let body = match i % 5 {
            0 => json!({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).to_string(),
            1 => json!({"jsonrpc": "2.0", "id": i, "method": method}).to_string(),
            2 => json!({"jsonrpc": random_value(&mut rng, 2), "id": random_value(&mut rng, 2), "method": method}).to_string(),
            3 => {
                let s = json!({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).to_string();
                let cut = (rng.next() as usize) % s.len().max(1);
                s[..s.floor_char_boundary(cut)].to_owned()
            }
            _ => random_value(&mut rng, 0).to_string(),
        };
        let raw = c.post_raw(c.headers(), body.clone()).await;
        assert!(
            raw.status < 500,
            "HTTP {} for {body}: {}",
            raw.status,
            raw.body
        );
        if raw.status != 202 && raw.status != 200 || !raw.body.is_empty() {
            // JSON or SSE: a tasks/result of the task while it still runs
            // (a slow machine), or a call, is answered with a stream.
            streamed += usize::from(raw.is_sse());
            let v = raw.response();
            assert!(
                v.get("result").is_some() || v["error"]["code"].is_i64(),
                "{body} -> {v}"
            );
        }
    }
    eprintln!("h8: {streamed} of 400 answers came as SSE streams");
    assert_eq!(c.ok("ping", json!({})).await, json!({}));
    c.ok("tasks/get", json!({"taskId": real["taskId"]})).await;
    let db = SqlitePool::connect_with(
        SqliteConnectOptions::new()
            .filename(server.db())
            .read_only(true),
    )
    .await
    .unwrap();
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(check, "ok");
    assert!(!server.log().contains("panicked"), "a panic in the log");
}

/// Issue item 5: the broker may answer a POST with JSON or with an SSE
/// stream (`tasks/result` of a task still running streams; once it has
/// ended, JSON). The tests' client reads the same response from both, so a
/// test like the one above does not depend on how fast the task ran.
#[tokio::test]
async fn item5_the_test_client_reads_the_response_from_json_and_from_sse_alike() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let task = c.call_task("sleep", json!({"seconds": 3})).await;
    let request = json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/result",
                         "params": {"taskId": task["taskId"]}});
    // 3 s: still running when asked, however slow the machine.
    let streamed = c.post_raw(c.headers(), request.to_string()).await;
    assert!(
        streamed.is_sse(),
        "a running task's result streams: {streamed:?}"
    );
    let from_sse = streamed.response_to(&json!(7));
    assert_eq!(
        from_sse["result"]["content"][0]["text"], "slept 3 s",
        "{from_sse}"
    );
    let plain = c.post_raw(c.headers(), request.to_string()).await;
    assert!(!plain.is_sse(), "an ended task's result is JSON: {plain:?}");
    assert_eq!(plain.response_to(&json!(7)), from_sse);
}

#[test]
fn migrate_creates_the_schema_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ops.db");
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .args(["migrate", "--db"])
            .arg(&db)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // As many as there are files in migrations/sqlite.
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".sql")
        })
        .count();
    assert!(run().contains(&format!("{files} migration(s) applied")));
    assert!(run().contains("0 migration(s) applied"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&db))
            .await
            .unwrap();
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type IN ('table','view') ORDER BY name",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        for want in [
            "jobs",
            "sessions",
            "task_events",
            "tasks",
            "v_queue",
            "v_task_history",
            "v_tasks",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(mode, "wal");
    });
}

#[test]
fn serve_refuses_bad_flags_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["serve", "--lease", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lease"));
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["serve", "--durability", "sometimes"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("durability"));
}

/// Covers H-8 as a property: any byte string sent as a body (random bytes,
/// random printable text, truncated real requests) gets an HTTP or
/// JSON-RPC error with a body, never a 5xx, never a panic, and the server
/// goes on answering.
#[tokio::test]
async fn h8_any_byte_string_as_a_body_gets_an_error_with_a_body() {
    let server = Server::start(&["--rate", "0"]);
    let c = server.client().await;
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let real = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sleep","arguments":{"seconds":0},"task":{"ttl":1000}}}"#;
    for i in 0..600 {
        let len = (rng.next() % 2048) as usize;
        let body: Vec<u8> = match i % 3 {
            0 => (0..len).map(|_| rng.next() as u8).collect(),
            1 => (0..len).map(|_| b' ' + (rng.next() % 95) as u8).collect(),
            _ => {
                let mut b = real[..(rng.next() as usize % real.len())].to_vec();
                if !b.is_empty() {
                    let at = rng.next() as usize % b.len();
                    b[at] = rng.next() as u8;
                }
                b
            }
        };
        let raw = c.post_raw(c.headers(), body.clone()).await;
        assert!(
            raw.status < 500,
            "HTTP {} for {:?}",
            raw.status,
            String::from_utf8_lossy(&body)
        );
        if raw.status != 202 {
            let v = raw.response();
            assert!(
                v.get("result").is_some() || v["error"]["code"].is_i64(),
                "no JSON-RPC answer for {:?}: {v}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    let mut c = c;
    assert_eq!(c.ok("ping", json!({})).await, json!({}));
    assert!(!server.log().contains("panicked"));
}
