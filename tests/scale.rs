//! Pagination over many tasks (T-17, T-18) and concurrent clients.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::Server;
use serde_json::{Value, json};

/// Covers T-17, T-18.
#[tokio::test]
async fn t17_t18_pagination_over_1000_tasks_is_exact_and_stable_under_inserts() {
    // No workers: the tasks stay put while we page.
    // --rate 0 and a higher --max-open-tasks: this test measures pagination,
    // not the abuse limits (they have their own tests).
    let server = Server::start(&[
        "--workers",
        "0",
        "--durability",
        "normal",
        "--rate",
        "0",
        "--max-open-tasks",
        "5000",
    ]);
    let mut c = server.client().await;
    let mut created = HashSet::new();
    for _ in 0..1050 {
        let t = c.call_task("sleep", json!({"seconds": 1})).await;
        created.insert(t["taskId"].as_str().unwrap().to_owned());
    }
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let page = c.ok("tasks/list", params).await;
        pages += 1;
        for t in page["tasks"].as_array().unwrap() {
            let id = t["taskId"].as_str().unwrap().to_owned();
            assert!(seen.insert(id.clone()), "task {id} listed twice");
        }
        // New tasks created between pages must not disturb the walk.
        c.call_task("sleep", json!({"seconds": 1})).await;
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 11, "1050 tasks in pages of 100");
    // Every task created before the walk, exactly once; nothing else.
    assert_eq!(seen, created);
}

#[tokio::test]
async fn two_hundred_task_calls_from_eight_concurrent_clients_all_complete() {
    // --rate 0: eight clients on one address; the rate limit has its own test.
    let server = Server::start(&["--rate", "0"]);
    let mut handles = Vec::new();
    for _ in 0..8 {
        let mut c = server.client().await;
        handles.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..25 {
                let t = c
                    .call_task(
                        "sleep",
                        json!({"seconds": 0.01, "message": format!("n{i}")}),
                    )
                    .await;
                ids.push(t["taskId"].as_str().unwrap().to_owned());
            }
            for (i, id) in ids.iter().enumerate() {
                let msg = c.request("tasks/result", json!({"taskId": id})).await;
                assert_eq!(
                    msg["result"]["content"][0]["text"],
                    format!("n{i}"),
                    "{msg}"
                );
                let t = c.wait_terminal(id, Duration::from_secs(30)).await;
                assert_eq!(t["status"], "completed");
            }
            ids.len()
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    assert_eq!(total, 200);
    // Jobs reach the embedded pool two ways (handed off by the writer in the
    // creating transaction, or claimed by the pool): each ran exactly once,
    // none sat claimed without a slot until its lease ran out.
    let db = server.read_db().await;
    let attempts: Vec<(i64, i64)> =
        sqlx::query_as("SELECT attempt, count(*) FROM jobs GROUP BY attempt")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(attempts, vec![(1, 200)], "every job ran once, first time");
    let log = server.log();
    assert!(!log.contains("lease recovery"), "a lease expired:\n{log}");
    assert!(!log.contains("database is locked"), "lock errors in log");
    assert!(!log.contains("ERROR"), "errors in log:\n{log}");
}
