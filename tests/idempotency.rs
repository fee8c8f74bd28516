//! Idempotent task creation (issue 27 item 1), through the real
//! `taskbroker serve` over HTTP on both storage drivers: a task call with
//! the client's key in `_meta` (`taskbroker/idempotencyKey`) made again
//! gets the same task instead of a second run, for the same owner and
//! tool; other arguments with the key are refused; another owner, another
//! tool or no key make new tasks; bad keys are refused precisely; both
//! protocol generations and `taskbroker call --idempotency-key` carry it;
//! two brokers on one PostgreSQL, asked at once, make one task (the
//! database's unique index, not a map in a process).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::process::Command;
use std::time::Duration;

use common::{Arg, Client, Driver, Server, create_token};
use serde_json::{Value, json};

const KEY_META: &str = "taskbroker/idempotencyKey";

/// `tools/call` of `tool` as a task with `key` in `_meta`: the JSON-RPC
/// answer (result or error).
async fn keyed_call(c: &mut Client, tool: &str, arguments: Value, key: Value) -> Value {
    c.request(
        "tools/call",
        json!({
            "name": tool,
            "arguments": arguments,
            "task": { "ttl": 600_000 },
            "_meta": { KEY_META: key },
        }),
    )
    .await
}

fn task_id_of(answer: &Value) -> String {
    answer["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {answer}"))
        .to_owned()
}

/// How many tasks of `tool` the database holds.
async fn tasks_of(server: &Server, tool: &str) -> i64 {
    let db = server.db_reader().await;
    let n = db
        .scalar(
            "SELECT COUNT(*) FROM tasks WHERE tool = $1",
            &[Arg::Text(tool.to_owned())],
        )
        .await;
    db.close().await;
    n
}

/// Issue 27 item 1: the same call with the same key is the same task (the
/// tool ran once: one row), also after it completed; other arguments are
/// -32602 naming the task; another tool or another owner (another
/// session, no tokens) with the key, or no key, make new tasks; keys that
/// are not non-empty strings of at most 255 bytes are -32602.
async fn a_repeated_call_with_its_key_is_the_same_task(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut c = server.client().await;
    let first = keyed_call(&mut c, "sleep", json!({ "seconds": 0 }), json!("order-42")).await;
    let id = task_id_of(&first);
    let again = keyed_call(&mut c, "sleep", json!({ "seconds": 0 }), json!("order-42")).await;
    assert_eq!(task_id_of(&again), id, "{again}");
    let done = c.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let after = keyed_call(&mut c, "sleep", json!({ "seconds": 0 }), json!("order-42")).await;
    assert_eq!(task_id_of(&after), id);
    assert_eq!(
        after["result"]["task"]["status"], "completed",
        "the task as it is now: {after}"
    );
    assert_eq!(tasks_of(&server, "sleep").await, 1, "the tool ran once");

    let other = keyed_call(&mut c, "sleep", json!({ "seconds": 1 }), json!("order-42")).await;
    assert_eq!(other["error"]["code"], -32602, "{other}");
    let message = other["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("other arguments") && message.contains(&id),
        "{message}"
    );

    let other_tool = keyed_call(
        &mut c,
        "sleep_as_task",
        json!({ "seconds": 0 }),
        json!("order-42"),
    )
    .await;
    assert_ne!(task_id_of(&other_tool), id);
    let mut someone_else = server.client().await;
    let theirs = keyed_call(
        &mut someone_else,
        "sleep",
        json!({ "seconds": 0 }),
        json!("order-42"),
    )
    .await;
    assert_ne!(task_id_of(&theirs), id, "keys are per owner");
    let plain = c.call_task("sleep", json!({ "seconds": 0 })).await;
    assert_ne!(plain["taskId"], json!(id), "no key, a new task");
    assert_eq!(tasks_of(&server, "sleep").await, 3);

    for bad in [json!(""), json!(7), json!("k".repeat(256))] {
        let refused = keyed_call(&mut c, "sleep", json!({ "seconds": 0 }), bad.clone()).await;
        assert_eq!(refused["error"]["code"], -32602, "{bad}: {refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains(KEY_META),
            "{refused}"
        );
    }
    assert_eq!(
        tasks_of(&server, "sleep").await,
        3,
        "nothing made of bad keys"
    );
}
both_drivers!(a_repeated_call_with_its_key_is_the_same_task);

/// Issue 27 item 1 for MCP 2026-07-28: the key in the call's `_meta`
/// beside the envelope; the second call answers the same task.
#[tokio::test]
async fn a_2026_call_with_its_key_is_the_same_task() {
    let server = Server::start(&[]);
    let http = reqwest::Client::new();
    let call = |key: &str| {
        let body = json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {
                "name": "sleep", "arguments": { "seconds": 0 },
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities":
                        { "extensions": { "io.modelcontextprotocol/tasks": {} } },
                    KEY_META: key,
                },
            },
        });
        http.post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "sleep")
            .body(body.to_string())
            .send()
    };
    let first: Value = call("k-2026").await.unwrap().json().await.unwrap();
    let second: Value = call("k-2026").await.unwrap().json().await.unwrap();
    assert_eq!(first["result"]["resultType"], "task", "{first}");
    assert_eq!(
        first["result"]["taskId"], second["result"]["taskId"],
        "{second}"
    );
    assert_eq!(tasks_of(&server, "sleep").await, 1);
}

/// Issue 27 item 1: `taskbroker call --task --idempotency-key` sent twice
/// prints one task id; without --task the flag is refused by the parser.
#[test]
fn the_cli_sends_the_key() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .current_dir(dir.path())
            .args([
                "call",
                "sleep",
                "--args",
                r#"{"seconds":0}"#,
                "--url",
                &server.url,
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let ids: Vec<String> = (0..2)
        .map(|_| {
            let out = run(&["--task", "--detach", "--idempotency-key", "cli-1"]);
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        })
        .collect();
    assert!(!ids[0].is_empty());
    assert_eq!(ids[0], ids[1]);
    let out = run(&["--idempotency-key", "cli-1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--task"),
        "{out:?}"
    );
}

/// Issue 27 item 1 "across brokers (a database constraint, not a process
/// map)": two brokers on one PostgreSQL, one principal (a token), the same
/// keyed call sent to both at once, 20 times with 20 keys: each key makes
/// one task, and both brokers answer its id.
#[tokio::test]
async fn two_brokers_asked_at_once_make_one_task_per_key() {
    if !common::pg::available() {
        return;
    }
    let first = Server::start_on(Driver::Postgres, &[]);
    let second = Server::start_sharing(&first, &[]);
    let token = create_token(&first, "alice", &[]);
    let mut a = Client::new(&first.url);
    a.token = Some(token.clone());
    a.initialize().await;
    let mut b = Client::new(&second.url);
    b.token = Some(token);
    b.initialize().await;
    for i in 0..20 {
        let key = json!(format!("race-{i}"));
        let args = json!({ "seconds": 0 });
        let (x, y) = tokio::join!(
            keyed_call(&mut a, "sleep", args.clone(), key.clone()),
            keyed_call(&mut b, "sleep", args.clone(), key.clone()),
        );
        assert_eq!(task_id_of(&x), task_id_of(&y), "key {key}: {x} {y}");
    }
    assert_eq!(tasks_of(&first, "sleep").await, 20);
}
