//! Task-augmented tools/call and the tasks/* methods (T-2..T-22,
//! T-28..T-30, T-33..T-35) against the real binary over HTTP.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::{Client, Driver, Server, SseReader, parse_time_ms};
use serde_json::{Value, json};

const RELATED: &str = "io.modelcontextprotocol/related-task";

#[track_caller]
fn assert_task_shape(task: &Value) {
    assert!(task["taskId"].is_string(), "{task}");
    assert!(task["status"].is_string(), "{task}");
    // T-13: createdAt and lastUpdatedAt on every task response.
    parse_time_ms(task["createdAt"].as_str().expect("createdAt"));
    parse_time_ms(task["lastUpdatedAt"].as_str().expect("lastUpdatedAt"));
    // T-10: ttl key always present.
    assert!(task.as_object().unwrap().contains_key("ttl"), "{task}");
    // T-30: no related-task _meta on task objects.
    assert!(task.get("_meta").is_none(), "{task}");
}

/// Covers T-7, T-9, T-8.
#[tokio::test]
async fn t7_t9_t8_task_call_answers_at_once_working_with_random_id() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let started = Instant::now();
    let r = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 30}, "task": {"ttl": 60000}}),
        )
        .await;
    // T-7: CreateTaskResult at once (well before the 30 s the tool takes,
    // however slow the machine), no tool result in it.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(r.get("content").is_none());
    let task = &r["task"];
    assert_task_shape(task);
    assert_eq!(task["status"], "working"); // T-9
    assert_eq!(task["ttl"], 60000); // T-10
    assert!(task["pollInterval"].as_i64().unwrap() > 0);
    // T-8: a random UUIDv4 string (122 random bits), unique.
    let id = task["taskId"].as_str().unwrap();
    let parsed = uuid::Uuid::parse_str(id).expect("uuid");
    assert_eq!(parsed.get_version_num(), 4);
    let other = c.call_task("sleep", json!({"seconds": 0})).await;
    assert_ne!(other["taskId"], task["taskId"]);
}

/// Covers T-4, T-5, T-6.
#[tokio::test]
async fn t4_t5_t6_task_support_rules() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    // T-4: task on a forbidden tool -> -32601, and the tool does not run.
    let e = c
        .err(
            "tools/call",
            json!({"name": "echo", "arguments": {}, "task": {}}),
        )
        .await;
    assert_eq!(e["code"], -32601);
    assert!(
        c.ok("tasks/list", json!({})).await["tasks"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // T-5: a required tool without task -> -32601 (a JSON-RPC error).
    let e = c
        .err(
            "tools/call",
            json!({"name": "sleep_as_task", "arguments": {"seconds": 0}}),
        )
        .await;
    assert_eq!(e["code"], -32601);
    // T-5 with task works.
    let t = c.call_task("sleep_as_task", json!({"seconds": 0})).await;
    assert_eq!(
        c.wait_terminal(t["taskId"].as_str().unwrap(), Duration::from_secs(10))
            .await["status"],
        "completed"
    );
    // T-6: optional runs either way.
    let r = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 0, "message": "plain"}}),
        )
        .await;
    assert_eq!(r["content"][0]["text"], "plain");
    let t = c
        .call_task("sleep", json!({"seconds": 0, "message": "task"}))
        .await;
    let id = t["taskId"].as_str().unwrap();
    c.wait_terminal(id, Duration::from_secs(10)).await;
    assert_eq!(
        c.ok("tasks/result", json!({"taskId": id})).await["content"][0]["text"],
        "task"
    );
}

/// Covers T-2.
#[tokio::test]
async fn t2_task_field_on_other_requests_is_ignored() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    assert_eq!(c.ok("ping", json!({"task": {"ttl": 5}})).await, json!({}));
    let r = c.ok("tasks/list", json!({"task": {}})).await;
    assert!(r["tasks"].is_array());
}

/// Covers T-14, T-15, T-16, T-28 (tasks/result carries related-task _meta), T-30.
#[tokio::test]
async fn t14_t15_t16_result_blocks_then_returns_the_exact_result_with_related_meta() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let t = c
        .call_task("sleep", json!({"seconds": 1.5, "message": "hello"}))
        .await;
    let id = t["taskId"].as_str().unwrap().to_owned();
    let started = Instant::now();
    // Blocks over SSE while working (T-14).
    let messages = c
        .request_messages("tasks/result", json!({"taskId": id}))
        .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "returned before the task ended"
    );
    let result = &messages.last().unwrap()["result"];
    assert_eq!(result["content"][0]["text"], "hello"); // T-15
    assert_eq!(result["_meta"][RELATED]["taskId"], json!(id)); // T-16
    // Same answer once terminal, as JSON; tasks/get without related _meta (T-30).
    let again = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(&again, result);
    let task = c.ok("tasks/get", json!({"taskId": id})).await;
    assert_task_shape(&task);
    assert_eq!(task["status"], "completed");
}

/// Covers T-14.
#[tokio::test]
async fn t14_result_blocks_for_json_only_clients_too() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let t = c.call_task("sleep", json!({"seconds": 1})).await;
    let id = t["taskId"].as_str().unwrap();
    let mut h = c.headers();
    h.insert("accept", "application/json".parse().unwrap());
    let body =
        json!({"jsonrpc": "2.0", "id": 77, "method": "tasks/result", "params": {"taskId": id}});
    let raw = c.post_raw(h, body.to_string()).await;
    assert!(
        raw.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    assert_eq!(raw.json()["result"]["content"][0]["text"], "slept 1 s");
}

/// Covers T-12.
#[tokio::test]
async fn t12_is_error_makes_the_task_failed_with_a_status_message() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let t = c
        .call_task("fail", json!({"message": "disk on fire"}))
        .await;
    let id = t["taskId"].as_str().unwrap();
    let task = c.wait_terminal(id, Duration::from_secs(10)).await;
    assert_eq!(task["status"], "failed");
    assert!(
        task["statusMessage"]
            .as_str()
            .unwrap()
            .contains("disk on fire")
    );
    // T-15: tasks/result returns the CallToolResult (isError) as a success.
    let r = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["isError"], true);
    assert_eq!(r["content"][0]["text"], "disk on fire");
    assert_eq!(r["_meta"][RELATED]["taskId"], id);
}

/// Covers H-10.
#[tokio::test]
async fn h10_invalid_arguments_on_a_task_call_end_the_task_failed_without_running() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let t = c.call_task("sleep", json!({"seconds": -1})).await;
    let id = t["taskId"].as_str().unwrap();
    let task = c.wait_terminal(id, Duration::from_secs(5)).await;
    assert_eq!(task["status"], "failed");
    let r = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["isError"], true);
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("seconds")
    );
}

/// Covers T-11, T-13.
#[tokio::test]
async fn t11_t13_status_only_moves_forward_and_last_updated_moves() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let t = c.call_task("sleep", json!({"seconds": 1})).await;
    let id = t["taskId"].as_str().unwrap();
    let done = c.wait_terminal(id, Duration::from_secs(10)).await;
    assert_eq!(done["createdAt"], t["createdAt"]);
    assert!(
        parse_time_ms(done["lastUpdatedAt"].as_str().unwrap())
            > parse_time_ms(t["lastUpdatedAt"].as_str().unwrap())
    );
    // T-11: cancel of the completed task is refused (T-20) and status stays.
    let e = c.err("tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(e["code"], -32602);
    assert_eq!(
        e["message"],
        "Cannot cancel task: already in terminal status 'completed'"
    );
    assert_eq!(
        c.ok("tasks/get", json!({"taskId": id})).await["status"],
        "completed"
    );
}

/// Covers T-20, T-21, T-22.
#[tokio::test]
async fn t20_t21_t22_cancel_is_immediate_final_and_stops_the_work() {
    let server = Server::start(&["--lease", "1.5"]);
    let mut c = server.client().await;
    let t = c.call_task("sleep", json!({"seconds": 3})).await;
    let id = t["taskId"].as_str().unwrap();
    // Cancelled while its job runs (T-22 is about stopping the work): the
    // worker says when it starts it, at the machine's pace.
    server
        .wait_for_log(
            &format!("job started task_id={id}"),
            Duration::from_secs(20),
        )
        .await;
    // T-21: cancelled in the response itself.
    let cancelled = c.ok("tasks/cancel", json!({"taskId": id})).await;
    assert_task_shape(&cancelled);
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["statusMessage"].is_string());
    // T-20: cancelling again is -32602.
    let e = c.err("tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(e["code"], -32602);
    assert!(e["message"].as_str().unwrap().contains("'cancelled'"));
    // T-22: still cancelled once its worker has stopped the job, after
    // which no outcome can come.
    server
        .wait_for_log(
            &format!("job stopped: task cancelled task_id={id}"),
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(
        c.ok("tasks/get", json!({"taskId": id})).await["status"],
        "cancelled"
    );
    // tasks/result of a cancelled task: the documented error.
    let e = c.err("tasks/result", json!({"taskId": id})).await;
    assert_eq!(e["code"], -32800);
    // The job was stopped (not completed) by its worker.
    let log = server.log();
    assert!(log.contains("job stopped: task cancelled"), "{log}");
    assert!(!log.contains(&format!("task_id={id} status=\"completed\"")));
}

/// Covers T-14.
#[tokio::test]
async fn t14_a_waiting_result_returns_the_cancellation() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let t = c.call_task("sleep", json!({"seconds": 30})).await;
    let id = t["taskId"].as_str().unwrap().to_owned();
    let mut waiter = Client::new(&server.url);
    waiter.session = c.session.clone();
    let (wait_id, response) = waiter
        .post_stream("tasks/result", json!({"taskId": id}))
        .await;
    // The server waits: its stream is open (the priming event came).
    let mut stream = SseReader::new(response);
    stream.next_event().await.expect("the priming event");
    c.ok("tasks/cancel", json!({"taskId": id})).await;
    let msg = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let (_, m) = stream.next_message().await.expect("the response");
            if m["id"] == wait_id {
                return m;
            }
        }
    })
    .await
    .expect("woken");
    assert_eq!(msg["error"]["code"], -32800);
}

/// Covers T-35, T-36.
async fn t35_t36_unknown_and_foreign_task_ids_are_not_found(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let mut a = server.client().await;
    let mut b = server.client().await;
    let t = a.call_task("sleep", json!({"seconds": 0})).await;
    let id = t["taskId"].as_str().unwrap();
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let e = a.err(method, json!({"taskId": "no-such-task"})).await;
        assert_eq!(e["code"], -32602, "{method}");
        assert!(
            e["message"].as_str().unwrap().ends_with("Task not found"),
            "{e}"
        );
        // Another session's task is not visible (T-36 with sessions as context).
        let e = b.err(method, json!({"taskId": id})).await;
        assert_eq!(e["code"], -32602, "{method}");
    }
    assert_eq!(
        a.err("tasks/get", json!({"taskId": "x"})).await["message"],
        "Failed to retrieve task: Task not found"
    );
    // T-18: each session lists exactly its own tasks.
    assert_eq!(
        a.ok("tasks/list", json!({})).await["tasks"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert!(
        b.ok("tasks/list", json!({})).await["tasks"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

both_drivers!(t35_t36_unknown_and_foreign_task_ids_are_not_found);

/// Covers T-29.
#[tokio::test]
async fn t29_task_id_param_wins_over_related_task_meta() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let t1 = c.call_task("sleep", json!({"seconds": 0})).await;
    let t2 = c.call_task("sleep", json!({"seconds": 0})).await;
    let got = c
        .ok(
            "tasks/get",
            json!({"taskId": t1["taskId"], "_meta": {RELATED: {"taskId": t2["taskId"]}}}),
        )
        .await;
    assert_eq!(got["taskId"], t1["taskId"]);
}

/// Covers T-17, T-19.
async fn t17_t19_list_cursor_is_opaque_and_invalid_cursors_are_32602(driver: Driver) {
    let server = Server::start_on(driver, &["--page-size", "2", "--workers", "0"]);
    let mut a = server.client().await;
    let mut b = server.client().await;
    for _ in 0..3 {
        a.call_task("sleep", json!({"seconds": 0})).await;
    }
    let page = a.ok("tasks/list", json!({})).await;
    assert_eq!(page["tasks"].as_array().unwrap().len(), 2);
    let cursor = page["nextCursor"]
        .as_str()
        .expect("T-17: nextCursor while more exist")
        .to_owned();
    let last = a.ok("tasks/list", json!({"cursor": cursor})).await;
    assert_eq!(last["tasks"].as_array().unwrap().len(), 1);
    assert!(last.get("nextCursor").is_none());
    for bad in ["", "garbage", "AAAA", &format!("{cursor}x")] {
        let e = a.err("tasks/list", json!({"cursor": bad})).await;
        assert_eq!(e["code"], -32602, "cursor {bad:?}");
    }
    // A cursor of another session is foreign: -32602.
    assert_eq!(
        b.err("tasks/list", json!({"cursor": cursor})).await["code"],
        -32602
    );
    for task in page["tasks"].as_array().unwrap() {
        assert_task_shape(task);
    }
}

both_drivers!(t17_t19_list_cursor_is_opaque_and_invalid_cursors_are_32602);

/// Covers T-17, T-18: a walk through the pages lists every task of the
/// session once, newest first, while tasks are created between pages (they
/// are not in the walk); another session's walk lists none of them.
async fn t17_t18_paging_lists_each_task_once_newest_first_under_inserts(driver: Driver) {
    let server = Server::start_on(driver, &["--page-size", "7", "--workers", "0"]);
    let mut a = server.client().await;
    let mut b = server.client().await;
    let mut created = Vec::new();
    for _ in 0..40 {
        created.push(a.call_task("sleep", json!({"seconds": 0})).await["taskId"].clone());
    }
    b.call_task("sleep", json!({"seconds": 0})).await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let page = a.ok("tasks/list", params).await;
        pages += 1;
        let tasks = page["tasks"].as_array().unwrap();
        assert!(tasks.len() <= 7, "{page}");
        seen.extend(tasks.iter().map(|t| t["taskId"].clone()));
        // Created between pages: not in this walk.
        a.call_task("sleep", json!({"seconds": 0})).await;
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 6, "40 tasks in pages of 7");
    created.reverse();
    assert_eq!(seen, created, "every task once, newest first");
    // The other session pages through its one task only.
    let page = b.ok("tasks/list", json!({})).await;
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1, "{page}");
    assert!(page.get("nextCursor").is_none());
}

both_drivers!(t17_t18_paging_lists_each_task_once_newest_first_under_inserts);

/// Covers T-10, T-34.
#[tokio::test]
async fn t10_t34_ttl_is_clamped_to_the_maximum_and_defaulted() {
    let server = Server::start(&["--max-ttl", "60", "--default-ttl", "30"]);
    let mut c = server.client().await;
    let r = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 0}, "task": {"ttl": 999_999_999}}),
        )
        .await;
    assert_eq!(r["task"]["ttl"], 60_000);
    let r = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 0}, "task": {}}),
        )
        .await;
    assert_eq!(r["task"]["ttl"], 30_000);
    let id = r["task"]["taskId"].as_str().unwrap();
    c.wait_terminal(id, Duration::from_secs(5)).await;
    // The actual ttl on every later response (T-10).
    assert_eq!(
        c.ok("tasks/get", json!({"taskId": id})).await["ttl"],
        30_000
    );
    let listed = c.ok("tasks/list", json!({})).await;
    assert!(
        listed["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["ttl"].is_i64())
    );
}

/// Covers T-33.
#[tokio::test]
async fn t33_expired_tasks_answer_expired_then_are_purged() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let r = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 0}, "task": {"ttl": 700}}),
        )
        .await;
    let id = r["task"]["taskId"].as_str().unwrap().to_owned();
    // The ttl (700 ms) must run out: time passing is what this tests.
    tokio::time::sleep(Duration::from_millis(900)).await;
    // Expired: "Task has expired" (or already purged: "Task not found").
    let e = c.err("tasks/get", json!({"taskId": id})).await;
    assert_eq!(e["code"], -32602);
    let m = e["message"].as_str().unwrap();
    assert!(
        m.ends_with("Task has expired") || m.ends_with("Task not found"),
        "{m}"
    );
    assert!(
        c.ok("tasks/list", json!({})).await["tasks"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // Purged in the background (every 5 s) with its history.
    let deadline = Instant::now() + Duration::from_secs(12);
    loop {
        let e = c.err("tasks/result", json!({"taskId": id})).await;
        if e["message"].as_str().unwrap().ends_with("Task not found") {
            break;
        }
        assert!(Instant::now() < deadline, "not purged: {e}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let log = server.log();
    assert!(log.contains("expired tasks purged"), "{log}");
}

/// A task's progress shows in its statusMessage while it runs (progress
/// notifications for tasks, T-32, come with the command-tool work).
#[tokio::test]
async fn task_progress_shows_in_status_message() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let r = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 3}, "task": {}, "_meta": {"progressToken": 42}}),
        )
        .await;
    let id = r["task"]["taskId"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let t = c.ok("tasks/get", json!({"taskId": id})).await;
        // Until a worker starts it the task may say it is queued (a busy
        // machine); the first word of the tool itself is its progress.
        if let Some(m) = t["statusMessage"].as_str()
            && !m.starts_with("queued")
        {
            assert!(m.contains("of 3 s"), "{m}");
            break;
        }
        assert!(Instant::now() < deadline, "no progress in statusMessage");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
