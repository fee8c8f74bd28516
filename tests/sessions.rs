//! Session lifetime (issue 14): sessions that go unused expire, unless they
//! own a task whose ttl has not run out; expired sessions answer 404 and
//! stop counting against `--max-sessions` at once; the sweeper ends and
//! deletes them in the background. The real binary over HTTP.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use common::{Client, Server};
use serde_json::json;

/// Five sessions never DELETEd fill `--max-sessions 5`; once idle past
/// `--session-idle`, a sixth initialize succeeds, an expired session's
/// requests answer 404, and the sweeper removes the rows.
#[tokio::test]
async fn issue14_idle_sessions_expire_and_free_their_place() {
    let server = Server::start(&["--max-sessions", "5", "--session-idle", "1"]);
    let mut idle = Vec::new();
    for _ in 0..5 {
        let mut c = Client::new(&server.url);
        c.initialize().await;
        idle.push(c);
    }
    let mut sixth = Client::new(&server.url);
    let refused = sixth
        .post_raw(
            sixth.headers(),
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "t", "version": "1"}}})
            .to_string(),
        )
        .await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.body.contains("--session-idle"), "{}", refused.body);

    tokio::time::sleep(Duration::from_millis(1500)).await;
    sixth.initialize().await;
    sixth.ok("tools/list", json!({})).await;

    let expired = &idle[0];
    let raw = expired
        .post_raw(
            expired.headers(),
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}).to_string(),
        )
        .await;
    assert_eq!(
        raw.status, 404,
        "an expired session is not found: {}",
        raw.body
    );

    // The sweeper (every 5 s) ends the idle ones and deletes ended rows.
    let db = server.read_db().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions")
            .fetch_one(&db)
            .await
            .unwrap();
        if left <= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} sessions left, wanted the live one"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A session that owns a working task with a long ttl does not expire
/// while idle: after the idle time it still answers, tasks/result included.
#[tokio::test]
async fn issue14_a_session_owning_an_open_task_does_not_expire() {
    let server = Server::start(&["--session-idle", "1"]);
    let mut c = server.client().await;
    let task = c.call_task("sleep", json!({"seconds": 3})).await;
    let id = task["taskId"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let got = c.ok("tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["taskId"], id.as_str());
    let result = c.ok("tasks/result", json!({"taskId": id})).await;
    assert!(result["content"].is_array(), "{result}");
    // Its task is done but its ttl (1 h) has not run out: still its own.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.ok("tasks/get", json!({"taskId": id})).await;
}
