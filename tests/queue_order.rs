//! The order of the queue (issue 27 items 2 and 4), through the real
//! `taskbroker serve` over HTTP on both storage drivers, with command tools
//! that write when they start: claims take the highest priority first
//! (names and numbers, per call in `_meta`, the tool's default from the
//! config); a delayed task says `queued: starts at ...` and does not start
//! before; requestors (principals) take turns, so one with a backlog does
//! not hold back one with a few tasks; `taskbroker tasks list --db` shows
//! priority and start; what the config or the ttl does not allow, and bad
//! values, are -32602 naming them; both protocol generations and
//! `taskbroker call --priority --delay` carry them; a broker without
//! workers queues and another broker's workers run them on one PostgreSQL.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, Driver, Server, create_token};
use serde_json::{Value, json};

const PRIORITY: &str = "taskbroker/priority";
const DELAY: &str = "taskbroker/delay";
const START_AT: &str = "taskbroker/startAt";

/// `step` appends `<its arguments> <start ms>` to `starts.log` and runs one
/// at a time (a blocker waits for a file `go`, so the rest queue behind it);
/// `low` gets priority low unless a call asks otherwise.
const CONFIG: &str = r#"
[[tool]]
name = "step"
description = "writes when it starts"
command = ["sh", "-c", "args=$(cat); echo \"$args $(date +%s%3N)\" >> @DIR@/starts.log; case \"$args\" in *blocker*) while [ ! -f @DIR@/go ]; do sleep 0.02; done;; esac; echo ok"]
task_support = "optional"
concurrency = 1
max_priority = "highest"
max_delay = "1h"

[[tool]]
name = "low"
description = "low priority unless asked"
command = ["sh", "-c", "args=$(cat); echo \"$args $(date +%s%3N)\" >> @DIR@/starts.log; echo ok"]
task_support = "optional"
priority = "low"
"#;

/// The lines of `starts.log` so far: (arguments, start ms).
fn starts(dir: &Path) -> Vec<(Value, i64)> {
    let text = std::fs::read_to_string(dir.join("starts.log")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let (args, ms) = line.rsplit_once(' ').unwrap();
            (serde_json::from_str(args).unwrap(), ms.parse().unwrap())
        })
        .collect()
}

/// Wait until `starts.log` has `n` lines.
async fn wait_starts(dir: &Path, n: usize) -> Vec<(Value, i64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lines = starts(dir);
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} starts: {lines:?}",
            lines.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task call of `tool` with `meta`: the JSON-RPC answer.
async fn call(c: &mut Client, tool: &str, arguments: Value, meta: Value) -> Value {
    c.request(
        "tools/call",
        json!({
            "name": tool, "arguments": arguments, "task": { "ttl": 600_000 }, "_meta": meta,
        }),
    )
    .await
}

fn task_of(answer: &Value) -> Value {
    let task = &answer["result"]["task"];
    assert!(task.is_object(), "a task: {answer}");
    task.clone()
}

/// Queue a blocker through `creator`, then (once it runs in `runner`'s
/// directory, where it waits for a file `go`) six tasks of the one-at-a-time tool asking for priorities
/// by name and number, and none; they start highest first, and in the
/// order made within a priority.
async fn queue_by_priority(creator: &Server, runner: &Server) {
    let mut c = creator.client().await;
    task_of(&call(&mut c, "step", json!({ "n": "blocker" }), json!({})).await);
    wait_starts(&runner.dir, 1).await;
    let asked = [
        ("low", json!("low")),
        ("default", Value::Null),
        ("five", json!(5)),
        ("highest", json!("highest")),
        ("default-2", Value::Null),
        ("high", json!("high")),
    ];
    let mut ids = Vec::new();
    for (name, priority) in &asked {
        let meta = if priority.is_null() {
            json!({})
        } else {
            json!({ PRIORITY: priority })
        };
        let task = task_of(&call(&mut c, "step", json!({ "n": name }), meta).await);
        ids.push(task["taskId"].as_str().unwrap().to_owned());
    }
    std::fs::write(runner.dir.join("go"), "").unwrap();
    for id in &ids {
        let done = c.wait_terminal(id, Duration::from_secs(30)).await;
        assert_eq!(done["status"], "completed", "{done}");
    }
    let order: Vec<Value> = starts(&runner.dir)
        .into_iter()
        .map(|(a, _)| a["n"].clone())
        .collect();
    assert_eq!(
        order,
        vec![
            json!("blocker"),
            json!("highest"),
            json!("high"),
            json!("five"),
            json!("default"),
            json!("default-2"),
            json!("low"),
        ]
    );
}

/// `turns`: one at a time, 50 ms each, writing when it starts.
const TURNS: &str = r#"
[[tool]]
name = "turns"
description = "one at a time"
command = ["sh", "-c", "args=$(cat); echo \"$args $(date +%s%3N)\" >> @DIR@/starts.log; sleep 0.05; echo ok"]
task_support = "optional"
concurrency = 1
"#;

/// A client of `server` acting as `principal` (a token of its own).
async fn principal(server: &Server, token_db: &Server, principal: &str) -> Client {
    let mut c = Client::new(&server.url);
    c.token = Some(create_token(token_db, principal, &[]));
    c.initialize().await;
    c
}

/// Through `creator`, alice queues 30 tasks of the one-at-a-time tool,
/// then bob 3: bob's start among alice's backlog (alice's starts after his
/// first call and before his last start are counted, not timed). In turns,
/// at most one of alice's per turn of bob's, and the one running.
async fn take_turns(creator: &Server, runner_dir: &Path) {
    let mut alice = principal(creator, creator, "alice").await;
    let mut bob = principal(creator, creator, "bob").await;
    let mut ids = Vec::new();
    for n in 0..30 {
        let task = task_of(
            &call(
                &mut alice,
                "turns",
                json!({ "who": "alice", "n": n }),
                json!({}),
            )
            .await,
        );
        ids.push((task["taskId"].as_str().unwrap().to_owned(), false));
    }
    let mut seen = 0;
    for n in 0..3 {
        let task = task_of(
            &call(
                &mut bob,
                "turns",
                json!({ "who": "bob", "n": n }),
                json!({}),
            )
            .await,
        );
        if n == 0 {
            seen = starts(runner_dir).len();
        }
        ids.push((task["taskId"].as_str().unwrap().to_owned(), true));
    }
    for (id, bobs) in &ids {
        let c = if *bobs { &mut bob } else { &mut alice };
        let done = c.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(done["status"], "completed", "{done}");
    }
    let order: Vec<String> = starts(runner_dir)
        .into_iter()
        .map(|(a, _)| a["who"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(order.len(), 33, "{order:?}");
    let last_bob = order.iter().rposition(|w| w == "bob").unwrap();
    let alice_between = order[seen.min(last_bob)..last_bob]
        .iter()
        .filter(|w| *w == "alice")
        .count();
    assert!(
        alice_between <= 5,
        "bob waited behind {alice_between} of alice's tasks (in turns: at most 5): {order:?} (bob came at {seen})"
    );
}

/// Issue 27 item 4: two principals on one tool take turns.
async fn principals_take_turns(driver: Driver) {
    let server = Server::start_with_config_on(driver, TURNS, &[]);
    take_turns(&server, &server.dir).await;
}
both_drivers!(principals_take_turns);

/// Issue 27 item 2: claims take higher priority first, within the tool's
/// concurrency (one at a time here).
async fn jobs_start_highest_priority_first(driver: Driver) {
    let server = Server::start_with_config_on(driver, CONFIG, &[]);
    queue_by_priority(&server, &server).await;
}
both_drivers!(jobs_start_highest_priority_first);

/// The `queued: starts at <time>` of a task's statusMessage, in ms.
fn starts_at(task: &Value) -> i64 {
    let message = task["statusMessage"].as_str().unwrap_or_default();
    let at = message
        .strip_prefix("queued: starts at ")
        .unwrap_or_else(|| panic!("a delayed task: {task}"));
    let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{at}: {e}"));
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap()
}

fn created_ms(task: &Value) -> i64 {
    let at = time::OffsetDateTime::parse(
        task["createdAt"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap()
}

/// Through `creator`, a task of `low` asked to start in 2 s: it says when
/// it starts, no worker (of `runner`) starts it before, and it completes.
async fn delayed_start(creator: &Server, runner: &Server) -> String {
    let mut c = creator.client().await;
    let task = task_of(&call(&mut c, "low", json!({ "n": "later" }), json!({ DELAY: 2 })).await);
    let id = task["taskId"].as_str().unwrap().to_owned();
    let at = starts_at(&task);
    let created = created_ms(&task);
    assert!(
        (created + 1_900..=created + 2_100).contains(&at),
        "starts 2 s after {created}: {at}"
    );
    let got = c.ok("tasks/get", json!({ "taskId": id })).await;
    assert_eq!(got["status"], "working", "{got}");
    assert_eq!(starts_at(&got), at, "{got}");
    let done = c.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let ran = starts(&runner.dir);
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert!(
        ran[0].1 >= at,
        "started at {} before its start {at}",
        ran[0].1
    );
    id
}

/// Issue 27 item 2: a delayed start, and what `tasks list --db` shows of
/// it (priority low from the config; the start while it is to come).
async fn a_delayed_task_waits_for_its_start(driver: Driver) {
    let server = Server::start_with_config_on(driver, CONFIG, &[]);
    let mut c = server.client().await;
    let task = task_of(
        &call(
            &mut c,
            "low",
            json!({ "n": "listed" }),
            json!({ DELAY: 300 }),
        )
        .await,
    );
    let id = task["taskId"].as_str().unwrap();
    let list = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskbroker"));
        cmd.args(["tasks", "list", "--db", &server.db_arg()]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let table = list(false);
    let line = table
        .lines()
        .find(|l| l.contains(id))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.contains("low (-10)") && line.contains("queued: starts at "),
        "{table}"
    );
    let listed: Value = serde_json::from_str(&list(true)).unwrap();
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["taskId"] == id)
        .unwrap();
    assert_eq!(row["priority"], -10, "{row}");
    assert_eq!(
        row["startsAt"].as_str().unwrap(),
        task["statusMessage"]
            .as_str()
            .unwrap()
            .trim_start_matches("queued: starts at "),
        "{row}"
    );
    c.ok("tasks/cancel", json!({ "taskId": id })).await;
    delayed_start(&server, &server).await;
}
both_drivers!(a_delayed_task_waits_for_its_start);

/// Issue 27 item 2 "refused precisely": an unknown priority name, a number
/// out of range, a priority above the tool's max_priority, a negative
/// delay, a start that is not RFC 3339, a delay and a time at once, a
/// start past max_delay or past the task's ttl, and either asked of a
/// plain call: each -32602 naming what; nothing was created.
#[tokio::test]
async fn what_the_tool_or_the_ttl_does_not_allow_is_refused_by_name() {
    let server = Server::start_with_config(CONFIG, &[]);
    let mut c = server.client().await;
    let cases = [
        (
            "step",
            json!({ PRIORITY: "urgent" }),
            "unknown priority 'urgent'",
        ),
        ("step", json!({ PRIORITY: 101 }), "from -100 to 100"),
        (
            "low",
            json!({ PRIORITY: "normal" }),
            "max_priority low (-10)",
        ),
        ("step", json!({ DELAY: -1 }), "zero or more"),
        ("step", json!({ DELAY: "10" }), DELAY),
        ("step", json!({ START_AT: "tomorrow" }), "RFC 3339"),
        (
            "step",
            json!({ DELAY: 1, START_AT: "2030-01-01T00:00:00Z" }),
            "give one",
        ),
        ("step", json!({ DELAY: 7200 }), "max_delay 3600 s"),
        ("low", json!({ DELAY: 700 }), "ttl"),
    ];
    for (tool, meta, says) in cases {
        let answer = call(&mut c, tool, json!({ "n": "bad" }), meta.clone()).await;
        assert_eq!(answer["error"]["code"], -32602, "{meta}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{meta}: {message}");
    }
    // The ttl of the `low` case above is 600 s; a plain call has no queue.
    let plain = c
        .request(
            "tools/call",
            json!({ "name": "step", "arguments": {}, "_meta": { DELAY: 5 } }),
        )
        .await;
    assert_eq!(plain["error"]["code"], -32602, "{plain}");
    assert!(
        plain["error"]["message"]
            .as_str()
            .unwrap()
            .contains("runs at once"),
        "{plain}"
    );
    let listed = c.ok("tasks/list", json!({})).await;
    assert_eq!(listed["tasks"], json!([]), "nothing was created: {listed}");
    assert!(starts(&server.dir).is_empty());
}

/// Issue 27 item 2 in MCP 2026-07-28: the priority and the start go beside
/// the envelope in `_meta`; the task answered says when it starts.
#[tokio::test]
async fn a_2026_call_asks_for_its_start_and_priority() {
    let server = Server::start_with_config(CONFIG, &[]);
    let at = "2099-01-01T00:00:00Z";
    let body = |start_at: &str| {
        json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {
                "name": "step", "arguments": { "n": "modern" },
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities":
                        { "extensions": { "io.modelcontextprotocol/tasks": {} } },
                    PRIORITY: "high",
                    START_AT: start_at,
                },
            },
        })
    };
    let post = |body: Value| {
        reqwest::Client::new()
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "step")
            .body(body.to_string())
            .send()
    };
    // 2099 is past the broker's ttl (1 h by default): refused.
    let far: Value = post(body(at)).await.unwrap().json().await.unwrap();
    assert_eq!(far["error"]["code"], -32602, "{far}");
    let soon = time::OffsetDateTime::now_utc() + time::Duration::minutes(10);
    let soon = soon
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let answer: Value = post(body(&soon)).await.unwrap().json().await.unwrap();
    assert_eq!(answer["result"]["resultType"], "task", "{answer}");
    let message = answer["result"]["statusMessage"]
        .as_str()
        .unwrap_or_default();
    let expected = soon.trim_end_matches('Z');
    assert!(
        message.starts_with("queued: starts at ") && message.contains(expected),
        "{answer}"
    );
    let db = server.db_reader().await;
    let priority: i64 = db.scalar("SELECT priority FROM jobs", &[]).await;
    db.close().await;
    assert_eq!(priority, 10);
}

/// Issue 27 item 2: `taskbroker call --task --priority --delay` sends them
/// (the task is queued with both); a bad priority is refused by the
/// parser, and the flags need --task.
#[test]
fn the_cli_sends_priority_and_delay() {
    let server = Server::start_with_config(CONFIG, &[]);
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .args([
                "call",
                "step",
                "--args",
                r#"{"n":"cli"}"#,
                "--url",
                &server.url,
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["--task", "--detach", "--priority", "high", "--delay", "10m"]);
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let shown = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["tasks", "list", "--db", &server.db_arg(), "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["taskId"] == id.as_str());
    let row = row.unwrap_or_else(|| panic!("{id}: {listed}"));
    assert_eq!(row["priority"], 10, "{row}");
    assert!(row["startsAt"].is_string(), "{row}");
    let bad = run(&["--task", "--priority", "urgent"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("unknown priority"),
        "{bad:?}"
    );
    let plain = run(&["--delay", "1s"]);
    assert!(!plain.status.success());
    assert!(
        String::from_utf8_lossy(&plain.stderr).contains("--task"),
        "{plain:?}"
    );
}

/// Issue 27 item 2 with two brokers on one PostgreSQL: one without workers
/// takes the calls, the other's workers run them, by priority, and a
/// delayed one not before its start.
#[tokio::test]
async fn across_brokers_priorities_and_starts_hold() {
    if !common::pg::available() {
        return;
    }
    let front = Server::start_with_config_on(Driver::Postgres, CONFIG, &["--workers", "0"]);
    let config = front.config_path();
    // The same file: the tools write into the first broker's directory.
    let back = Server::start_sharing(&front, &["--config", &config]);
    queue_by_priority(&front, &front).await;
    std::fs::remove_file(front.dir.join("starts.log")).unwrap();
    delayed_start(&front, &front).await;
    let db = front.db_reader().await;
    let elsewhere: i64 = db
        .scalar(
            "SELECT COUNT(*) FROM jobs WHERE lease_owner NOT LIKE $1",
            &[common::Arg::Text(format!("%:{}:%", back.pid()))],
        )
        .await;
    db.close().await;
    assert_eq!(elsewhere, 0, "every job ran in the broker with workers");
}

/// Issue 27 item 4 with two brokers on one PostgreSQL: calls to one
/// without workers, run by the other's, still in turns.
#[tokio::test]
async fn across_brokers_principals_take_turns() {
    if !common::pg::available() {
        return;
    }
    let front = Server::start_with_config_on(Driver::Postgres, TURNS, &["--workers", "0"]);
    let config = front.config_path();
    let _back = Server::start_sharing(&front, &["--config", &config]);
    take_turns(&front, &front.dir).await;
}
