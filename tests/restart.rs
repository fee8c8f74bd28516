//! Durability: kill -9 the server and start it again on the same file.
//! Sessions, tasks, results and history survive; a task whose worker died
//! with the server is run again, or failed with a reason once its attempts
//! are spent. Never stuck in `working`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::{DbReader, Driver, Server};
use serde_json::{Value, json};

/// (state, attempt) of a task's job, read with plain SQL as an operator would.
async fn job_state(db: &DbReader, task_id: &str) -> (String, i64) {
    db.one(
        "SELECT j.state, j.attempt FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = $1",
        &[task_id.into()],
    )
    .await
}

async fn wait_running_attempt(db: &DbReader, task_id: &str, attempt: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (state, a) = job_state(db, task_id).await;
        if state == "running" && a == attempt {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "attempt {attempt} never ran (state {state}, attempt {a})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn restart_after_kill9_keeps_sessions_tasks_results_and_reruns_working_tasks(driver: Driver) {
    let mut server = Server::start_on(driver, &["--lease", "2", "--workers", "2"]);
    let mut c = server.client().await;
    let completed = c
        .call_task("sleep", json!({"seconds": 0, "message": "kept"}))
        .await;
    let failed = c
        .call_task("fail", json!({"message": "kept failure"}))
        .await;
    let cancelled = c.call_task("sleep", json!({"seconds": 60})).await;
    let working = c
        .call_task("sleep", json!({"seconds": 3, "message": "rerun"}))
        .await;
    let id = |t: &Value| t["taskId"].as_str().unwrap().to_owned();
    let (completed, failed, cancelled, working) =
        (id(&completed), id(&failed), id(&cancelled), id(&working));
    c.ok("tasks/cancel", json!({"taskId": cancelled})).await;
    c.wait_terminal(&completed, Duration::from_secs(10)).await;
    c.wait_terminal(&failed, Duration::from_secs(10)).await;
    let db = server.db_reader().await;
    wait_running_attempt(&db, &working, 1).await;

    let mut before = Vec::new();
    for t in [&completed, &failed, &cancelled] {
        before.push((
            c.ok("tasks/get", json!({"taskId": t})).await,
            c.request("tasks/result", json!({"taskId": t})).await,
        ));
    }
    let list_before = c.ok("tasks/list", json!({})).await;

    server.kill_and_restart();
    c.reconnect(&server.url);

    // The old session id works, and every terminal task answers the same.
    for (t, (get, result)) in [&completed, &failed, &cancelled].into_iter().zip(before) {
        assert_eq!(c.ok("tasks/get", json!({"taskId": t})).await, get);
        let mut again = c.request("tasks/result", json!({"taskId": t})).await;
        let mut result = result;
        again["id"] = Value::Null;
        result["id"] = Value::Null;
        assert_eq!(again, result);
    }
    let list_after = c.ok("tasks/list", json!({})).await;
    let ids = |l: &Value| {
        l["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["taskId"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&list_after), ids(&list_before));

    // The task that was working is run again (attempt 2) to completion
    // within lease + backoff + its own 3 s + slack.
    let started = Instant::now();
    let done = c.wait_terminal(&working, Duration::from_secs(15)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let result = c.ok("tasks/result", json!({"taskId": working})).await;
    assert_eq!(result["content"][0]["text"], "rerun");
    assert_eq!(job_state(&db, &working).await, ("done".to_owned(), 2));
    eprintln!("rerun completed {:?} after restart", started.elapsed());
    assert!(
        server.log().contains("lease recovery"),
        "lease recovery logged"
    );
}

both_drivers!(restart_after_kill9_keeps_sessions_tasks_results_and_reruns_working_tasks);

async fn a_task_whose_worker_dies_on_every_attempt_fails_with_the_reason(driver: Driver) {
    let mut server = Server::start_on(driver, &["--lease", "1", "--workers", "1"]);
    let mut c = server.client().await;
    let t = c.call_task("sleep", json!({"seconds": 60})).await;
    let task_id = t["taskId"].as_str().unwrap().to_owned();
    let db = server.db_reader().await;
    // The demo tools allow 3 attempts: kill the server during each one.
    for attempt in 1..=3 {
        wait_running_attempt(&db, &task_id, attempt).await;
        server.kill_and_restart();
    }
    c.reconnect(&server.url);
    let task = c.wait_terminal(&task_id, Duration::from_secs(15)).await;
    assert_eq!(task["status"], "failed");
    let message = task["statusMessage"].as_str().unwrap();
    assert!(message.contains("worker lost 3 time"), "{message}");
    // tasks/result returns the JSON-RPC error of the failed request.
    let e = c.err("tasks/result", json!({"taskId": task_id})).await;
    assert_eq!(e["code"], -32603);
    assert!(
        e["message"].as_str().unwrap().contains("worker lost"),
        "{e}"
    );
    // History shows each step, readable by an operator.
    let history: Vec<(Option<String>, String)> = db
        .all(
            "SELECT from_status, to_status FROM v_task_history WHERE task_id = $1 ORDER BY id",
            &[(&task_id).into()],
        )
        .await;
    assert_eq!(
        history,
        vec![
            (None, "working".to_owned()),
            (Some("working".to_owned()), "failed".to_owned())
        ]
    );
}

both_drivers!(a_task_whose_worker_dies_on_every_attempt_fails_with_the_reason);

/// PostgreSQL ends every connection of a running broker
/// (`pg_terminate_backend`: what a server restart or a failover does to
/// them). After a pause the broker serves the next requests without an
/// error: its pool checks a connection that sat idle before handing it out
/// and replaces a dead one, and its change feed listens again.
#[tokio::test]
async fn postgres_ending_the_brokers_connections_fails_no_later_request() {
    if !common::pg::available() {
        return;
    }
    let server = Server::start_on(Driver::Postgres, &[]);
    let mut c = server.client().await;
    for _ in 0..5 {
        sleep_zero(&mut c).await;
    }
    let ended: i64 = server
        .pg()
        .unwrap()
        .psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(ended >= 2, "the broker's pool and its listener: {ended}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..20 {
        sleep_zero(&mut c).await;
    }
    server
        .wait_for_log("change feed: listener", Duration::from_secs(10))
        .await;
}

/// One `sleep` task of 0 s, through to its result.
async fn sleep_zero(c: &mut common::Client) {
    let task_id = c.call_task("sleep", json!({"seconds": 0})).await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let result = c.ok("tasks/result", json!({"taskId": task_id})).await;
    assert_eq!(result["content"][0]["text"], "slept 0 s", "{result}");
}
