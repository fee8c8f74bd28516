//! Issue 13, "limits that fit real use": a broker started with no tuning
//! flags (only `--listen 127.0.0.1:0` and a temporary `--db`) serves the
//! three default-load scenarios with no HTTP 429, no refusal and nothing
//! lost; and the per-session limits still stop a runaway client, set low,
//! without touching another session from the same address.
//!
//! Every client here comes from 127.0.0.1, as local agents do, so a limit
//! keyed on the client address would refuse them.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::Server;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use taskbroker::defaults;

/// The load tests take turns: each measures the broker alone on the
/// machine's cores (the test harness runs tests in parallel).
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One MCP session that many requests may use at once (the common
/// `Client` takes `&mut self` per request).
#[derive(Clone)]
struct Session {
    http: reqwest::Client,
    url: String,
    id: String,
    next_id: Arc<AtomicUsize>,
}

/// An answer: HTTP status, `Retry-After` if any, the body.
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

impl Answer {
    /// The JSON-RPC result; panics (naming `what`) on any HTTP status but
    /// 200, on a JSON-RPC error, or on a body that is not JSON.
    #[track_caller]
    fn result(&self, what: &str) -> Value {
        assert_eq!(
            self.status, 200,
            "{what}: HTTP {} {}",
            self.status, self.body
        );
        let message: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", self.body));
        assert!(message.get("error").is_none(), "{what}: {message}");
        message["result"].clone()
    }
}

fn headers(session: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    // JSON answers only: every request here is answered at once.
    h.insert("accept", HeaderValue::from_static("application/json"));
    if let Some(id) = session {
        h.insert("mcp-session-id", HeaderValue::from_str(id).unwrap());
        h.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-11-25"),
        );
    }
    h
}

async fn post(http: &reqwest::Client, url: &str, session: Option<&str>, body: Value) -> Answer {
    let r = http
        .post(url)
        .headers(headers(session))
        .body(body.to_string())
        .send()
        .await
        .expect("POST failed");
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = r.text().await.unwrap_or_default();
    Answer {
        status,
        retry_after,
        body,
    }
}

fn initialize_body() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": { "name": "default-limits-test", "version": "0" }
        }
    })
}

/// POST initialize with no session; the raw answer.
async fn try_initialize(http: &reqwest::Client, url: &str) -> Answer {
    post(http, url, None, initialize_body()).await
}

impl Session {
    /// initialize + notifications/initialized, each answered without a 429.
    async fn open(url: &str) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let r = http
            .post(url)
            .headers(headers(None))
            .body(initialize_body().to_string())
            .send()
            .await
            .expect("POST initialize");
        let status = r.status().as_u16();
        let id = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = r.text().await.unwrap_or_default();
        assert_eq!(status, 200, "initialize: HTTP {status} {body}");
        let session = Self {
            http,
            url: url.to_owned(),
            id: id.expect("initialize sets Mcp-Session-Id"),
            next_id: Arc::new(AtomicUsize::new(1)),
        };
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let ack = post(&session.http, url, Some(&session.id), note).await;
        assert_eq!(
            ack.status, 202,
            "initialized: HTTP {} {}",
            ack.status, ack.body
        );
        session
    }

    /// A request on this session; the raw answer.
    async fn send(&self, method: &str, params: Value) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        post(&self.http, &self.url, Some(&self.id), body).await
    }

    /// `sleep` as a task; the new task's id. Panics on a 429 or any refusal.
    async fn create_sleep(&self, seconds: f64) -> String {
        let call = json!({ "name": "sleep", "arguments": { "seconds": seconds }, "task": {} });
        let task = self.send("tools/call", call).await.result("tools/call")["task"].clone();
        task["taskId"].as_str().expect("a taskId").to_owned()
    }
}

async fn count(db: &sqlx::SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db).await.unwrap()
}

/// Wait until `sql` counts `want`, or panic after `timeout` with the last
/// count.
async fn wait_count(db: &sqlx::SqlitePool, sql: &'static str, want: i64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let n = count(db, sql).await;
        if n == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sql}: {n}, not {want}, after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every task id in the database.
async fn stored_ids(db: &sqlx::SqlitePool) -> HashSet<String> {
    sqlx::query_scalar::<_, String>("SELECT task_id FROM tasks")
        .fetch_all(db)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Issue 13, scenario 1: 16 local clients (16 sessions, all from
/// 127.0.0.1) create 4,000 tasks as fast as they can; no 429, no
/// JSON-RPC error, and every created task completes.
#[tokio::test]
async fn issue13_defaults_serve_16_clients_creating_4000_tasks() {
    const CLIENTS: usize = 16;
    const TASKS: usize = 4000;
    let _turn = HEAVY.lock().await;
    let server = Server::start(&[]);
    let left = Arc::new(AtomicUsize::new(TASKS));
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (url, left) = (server.url.clone(), left.clone());
        clients.push(tokio::spawn(async move {
            let session = Session::open(&url).await;
            let mut ids = Vec::new();
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                ids.push(session.create_sleep(0.0).await);
            }
            ids
        }));
    }
    let mut created = HashSet::new();
    for client in clients {
        created.extend(client.await.unwrap());
    }
    eprintln!(
        "{TASKS} tasks created by {CLIENTS} clients in {:.1?}",
        started.elapsed()
    );
    assert_eq!(created.len(), TASKS, "every call made a distinct task");
    let db = server.read_db().await;
    wait_count(
        &db,
        "SELECT count(*) FROM tasks WHERE status = 'completed'",
        TASKS as i64,
        Duration::from_secs(60),
    )
    .await;
    eprintln!("... all completed after {:.1?}", started.elapsed());
    assert_eq!(
        stored_ids(&db).await,
        created,
        "nothing lost, nothing extra"
    );
}

/// Issue 13, scenario 2: one client (one session) enqueues 10,000 tasks
/// in a burst, 32 requests in flight at once; none is refused (no 429, no
/// "Too many open tasks"), all 10,000 are stored and all complete.
#[tokio::test]
async fn issue13_defaults_serve_one_session_enqueueing_10000_tasks_in_a_burst() {
    const TASKS: usize = 10_000;
    const IN_FLIGHT: usize = 32;
    let _turn = HEAVY.lock().await;
    let server = Server::start(&[]);
    let session = Session::open(&server.url).await;
    let left = Arc::new(AtomicUsize::new(TASKS));
    let started = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..IN_FLIGHT {
        let (session, left) = (session.clone(), left.clone());
        senders.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                ids.push(session.create_sleep(0.0).await);
            }
            ids
        }));
    }
    let mut created = HashSet::new();
    for sender in senders {
        created.extend(sender.await.unwrap());
    }
    eprintln!("{TASKS} tasks enqueued in {:.1?}", started.elapsed());
    assert_eq!(created.len(), TASKS, "every call made a distinct task");
    let db = server.read_db().await;
    let owner = format!("session:{}", session.id);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE owner = ?")
        .bind(&owner)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(stored, TASKS as i64, "all stored, as the session's");
    assert_eq!(
        stored_ids(&db).await,
        created,
        "nothing lost, nothing extra"
    );
    wait_count(
        &db,
        "SELECT count(*) FROM tasks WHERE status = 'completed'",
        TASKS as i64,
        Duration::from_secs(120),
    )
    .await;
    eprintln!("... all completed after {:.1?}", started.elapsed());
}

/// Issue 13, scenario 3: 100 clients (100 sessions opened at once from
/// 127.0.0.1) each poll `tasks/get` of their own task at the pollInterval
/// the task suggests, for 5 seconds; no 429, every poll answered.
#[tokio::test]
async fn issue13_defaults_serve_100_clients_polling_at_the_suggested_interval() {
    const CLIENTS: usize = 100;
    const POLL_FOR: Duration = Duration::from_secs(5);
    let _turn = HEAVY.lock().await;
    let server = Server::start(&[]);
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let url = server.url.clone();
        clients.push(tokio::spawn(async move {
            let session = Session::open(&url).await;
            // Long enough to be working while it is polled.
            let call = json!({ "name": "sleep", "arguments": { "seconds": 60 }, "task": {} });
            let task = session.send("tools/call", call).await.result("tools/call")["task"].clone();
            let task_id = task["taskId"].as_str().unwrap().to_owned();
            let interval = Duration::from_millis(task["pollInterval"].as_u64().unwrap());
            let until = Instant::now() + POLL_FOR;
            let mut polls = 0;
            while Instant::now() < until {
                tokio::time::sleep(interval).await;
                let got = session
                    .send("tasks/get", json!({ "taskId": task_id }))
                    .await
                    .result("tasks/get");
                assert_eq!(got["taskId"], task_id.as_str());
                polls += 1;
            }
            polls
        }));
    }
    let mut polls = 0;
    for client in clients {
        polls += client.await.unwrap();
    }
    // 100 clients, 5 s at the default 1 s interval: about 500 polls.
    assert!(polls >= CLIENTS * 4, "only {polls} polls answered");
}

/// Issue 13: the per-session limit still bites, set low. With `--rate 5
/// --rate-burst 5` a session sending back to back is refused with 429 and
/// `Retry-After` within a few requests, while a second session from the
/// same address is served at once.
#[tokio::test]
async fn issue13_low_rate_refuses_a_runaway_session_but_not_its_neighbour() {
    let server = Server::start(&["--rate", "5", "--rate-burst", "5"]);
    let runaway = Session::open(&server.url).await;
    let neighbour = Session::open(&server.url).await;
    let mut refused = None;
    for sent in 1..=20 {
        let answer = runaway.send("ping", json!({})).await;
        if answer.status == 429 {
            refused = Some((sent, answer));
            break;
        }
        answer.result("ping");
    }
    let (sent, answer) = refused.expect("a runaway session is refused within 20 requests");
    assert!(sent <= 10, "refused only at request {sent}");
    let retry: u64 = answer
        .retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "Retry-After: {retry}");
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        body["error"]["data"]["retryAfter"],
        json!(retry),
        "issue 27 item 6: the same in the error's data: {body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Too Many Requests") && message.contains("per session"),
        "{message}"
    );
    // Same address, another session: its own bucket.
    for _ in 0..3 {
        assert_eq!(
            neighbour.send("ping", json!({})).await.result("ping"),
            json!({})
        );
    }
}

/// Issue 27 item 6 (back-pressure that says when), T-38: a call refused by
/// the open-task limit says when to come back, in the JSON-RPC error's
/// data (`retryAfter`, seconds: the suggested poll interval, since tasks
/// end at their own pace) and in `Retry-After`; the answer stays HTTP 200
/// (a JSON-RPC error, as MCP clients read it).
#[tokio::test]
async fn issue27_the_open_task_limit_says_when_to_come_back() {
    let server = Server::start(&["--max-open-tasks", "2"]);
    let session = Session::open(&server.url).await;
    let call = json!({ "name": "sleep", "arguments": { "seconds": 30 }, "task": {} });
    for _ in 0..2 {
        session
            .send("tools/call", call.clone())
            .await
            .result("under the limit");
    }
    let refused = session.send("tools/call", call).await;
    assert_eq!(refused.status, 200, "{}", refused.body);
    let body: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["error"]["code"], -32000, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Too many open tasks"),
        "{body}"
    );
    assert_eq!(body["error"]["data"]["retryAfter"], 1, "{body}");
    assert_eq!(refused.retry_after.as_deref(), Some("1"));
}

/// Issue 13: initialize (no session yet) is limited per client address by
/// a bucket of its own, so a flood of new sessions from one address is
/// slowed while the sessions it already has are served.
#[tokio::test]
async fn issue13_initialize_flood_from_one_address_is_limited() {
    let server = Server::start(&["--initialize-rate", "1", "--initialize-burst", "3"]);
    let first = Session::open(&server.url).await;
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(try_initialize(&http, &server.url).await);
    }
    let refused = statuses
        .iter()
        .position(|a| a.status == 429)
        .expect("a flood of initializes is refused");
    assert!(refused <= 2, "refused only at initialize {}", refused + 2);
    let answer = &statuses[refused];
    assert!(answer.retry_after.is_some(), "Retry-After");
    assert!(
        answer.body.contains("initialize-rate"),
        "the error names the limit: {}",
        answer.body
    );
    // The session it opened before is not slowed by its address.
    for _ in 0..10 {
        first.send("ping", json!({})).await.result("ping");
    }
}

/// Issue 13: the defaults `serve --help` and README's Commands table state
/// for the limits the three loads reach are those the broker uses
/// (`taskbroker::defaults`), so the documented numbers are the tested ones.
#[test]
fn issue13_help_and_readme_state_the_defaults_in_force() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["serve", "--help"])
        .env_clear()
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for (flag, variable, value) in [
        ("--rate", "RATE", defaults::RATE.to_string()),
        (
            "--rate-burst",
            "RATE_BURST",
            defaults::RATE_BURST.to_string(),
        ),
        (
            "--initialize-rate",
            "INITIALIZE_RATE",
            defaults::INITIALIZE_RATE.to_string(),
        ),
        (
            "--initialize-burst",
            "INITIALIZE_BURST",
            defaults::INITIALIZE_BURST.to_string(),
        ),
        (
            "--max-open-tasks",
            "MAX_OPEN_TASKS",
            defaults::MAX_OPEN_TASKS.to_string(),
        ),
    ] {
        let start = help
            .find(&format!("{flag} <"))
            .unwrap_or_else(|| panic!("{flag} not in --help"));
        let entry = &help[start..];
        let entry = &entry[..entry.find("[env:").unwrap()];
        assert!(
            entry.contains(&format!("[default: {value}]")),
            "--help says for {flag}: {entry}"
        );
        let row = format!("| `{flag}` | `TASKBROKER_{variable}` | `{value}` |");
        assert!(readme.contains(&row), "README has no row {row}");
    }
}
