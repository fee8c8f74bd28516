//! Execution that never starves (issue 13): limits per tool and across
//! processes, tasks waiting for their client hold no slot, and defaults
//! sized for tools that mostly wait. Each test runs the real binary on real
//! SQLite files; overlaps are measured from the tools' own start and end
//! times.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use common::{Client, Server, SseReader, WorkerProc};
use serde_json::{Value, json};

/// A command tool that sleeps `secs` and prints its start and end times
/// (ns since the epoch), with `extra` lines added to its `[[tool]]`.
fn timed_tool(name: &str, secs: &str, extra: &str) -> String {
    format!(
        r#"
[[tool]]
name = "{name}"
description = "Sleep {secs} s; print start and end times"
command = ["sh", "-c", "s=$(date +%s%N); sleep {secs}; e=$(date +%s%N); echo \"$s $e\""]
{extra}
"#
    )
}

/// Create `n` tasks of `tool` from `clients` sessions at once; their ids.
async fn create_tasks(
    server: &Server,
    tool: &str,
    args: Value,
    n: usize,
    clients: usize,
) -> Vec<String> {
    let mut handles = Vec::new();
    for k in 0..clients {
        let url = server.url.clone();
        let args = args.clone();
        let tool = tool.to_owned();
        let count = n / clients + usize::from(k < n % clients);
        handles.push(tokio::spawn(async move {
            let mut c = Client::new(&url);
            c.initialize().await;
            let mut ids = Vec::new();
            for _ in 0..count {
                let t = c.call_task(&tool, args.clone()).await;
                ids.push((t["taskId"].as_str().unwrap().to_owned(), c.session.clone()));
            }
            ids
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap().into_iter().map(|(id, _)| id));
    }
    all
}

/// Wait until every task in `ids` is completed (checked in the database).
async fn wait_all_completed(server: &Server, ids: &[String], limit: Duration) {
    let db = server.read_db().await;
    let deadline = Instant::now() + limit;
    loop {
        let mut done = 0;
        for chunk in ids.chunks(500) {
            let list = serde_json::to_string(chunk).unwrap();
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tasks WHERE status = 'completed' AND task_id IN (SELECT value FROM json_each(?))",
            )
            .bind(list)
            .fetch_one(&db)
            .await
            .unwrap();
            done += n as usize;
        }
        if done == ids.len() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {} tasks completed after {limit:?}",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The (start, end) times a timed tool printed, per task, from the stored
/// results.
async fn intervals(server: &Server, ids: &[String]) -> Vec<(u128, u128)> {
    let db = server.read_db().await;
    let mut out = Vec::new();
    for id in ids {
        let result: String = sqlx::query_scalar("SELECT result FROM tasks WHERE task_id = ?")
            .bind(id)
            .fetch_one(&db)
            .await
            .unwrap();
        let result: Value = serde_json::from_str(&result).unwrap();
        let text = result["content"][0]["text"].as_str().unwrap();
        let mut parts = text.split_whitespace().map(|p| p.parse::<u128>().unwrap());
        out.push((parts.next().unwrap(), parts.next().unwrap()));
    }
    out
}

/// The most intervals open at one instant.
fn max_overlap(intervals: &[(u128, u128)]) -> usize {
    let mut edges: Vec<(u128, i32)> = intervals
        .iter()
        .flat_map(|(s, e)| [(*s, 1), (*e, -1)])
        .collect();
    // An end at the same instant as a start closes first.
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    most as usize
}

/// Default settings, command tools declaring no limit: ten 2-second tasks
/// submitted at once all run at the same time (they mostly wait; the
/// default is not one per core).
#[tokio::test]
async fn issue13_ten_command_tasks_on_defaults_all_overlap() {
    let server = Server::start_with_config(&timed_tool("wait2", "2", ""), &[]);
    let ids = create_tasks(&server, "wait2", json!({}), 10, 10).await;
    wait_all_completed(&server, &ids, Duration::from_secs(30)).await;
    let spans = intervals(&server, &ids).await;
    assert_eq!(max_overlap(&spans), 10, "{spans:?}");
}

/// `concurrency = 2` on a tool: of 20 one-second tasks at most 2 run at
/// once in the embedded pool; meanwhile another tool's tasks run at once,
/// unhindered by the busy one.
#[tokio::test]
async fn issue13_tool_concurrency_caps_that_tool_and_no_other() {
    let config = timed_tool("heavy", "1", "concurrency = 2") + &timed_tool("light", "0.2", "");
    let server = Server::start_with_config(&config, &[]);
    let heavy = create_tasks(&server, "heavy", json!({}), 20, 4).await;
    let submitted = Instant::now();
    let light = create_tasks(&server, "light", json!({}), 10, 2).await;
    wait_all_completed(&server, &light, Duration::from_secs(20)).await;
    let light_took = submitted.elapsed();
    wait_all_completed(&server, &heavy, Duration::from_secs(60)).await;
    let heavy_spans = intervals(&server, &heavy).await;
    assert_eq!(max_overlap(&heavy_spans), 2, "{heavy_spans:?}");
    let first_heavy = heavy_spans.iter().map(|s| s.0).min().unwrap();
    let last_heavy = heavy_spans.iter().map(|s| s.1).max().unwrap();
    assert!(
        last_heavy - first_heavy >= 9_000_000_000,
        "20 one-second runs two at a time take about 10 s"
    );
    let light_spans = intervals(&server, &light).await;
    assert_eq!(max_overlap(&light_spans), 10, "{light_spans:?}");
    assert!(
        light_took < Duration::from_secs(5),
        "the light tool waited behind the heavy one: {light_took:?}"
    );
}

/// `global_concurrency = 2` holds across worker processes: three, each
/// allowed one gpu job at once (`concurrency = 1`), could run three
/// together; they run at most two. Since each runs at most one, reaching
/// two at once means two processes ran gpu jobs side by side (whichever
/// wins each claim race: nothing here depends on it). Another tool runs
/// beside it.
#[tokio::test]
async fn issue13_global_concurrency_holds_across_worker_processes() {
    let config = timed_tool("gpu", "1", "global_concurrency = 2\nconcurrency = 1")
        + &timed_tool("light", "0.2", "");
    let server = Server::start_with_config(&config, &["--workers", "0"]);
    let cfg = server.config_path();
    let _workers: Vec<WorkerProc> = (0..3)
        .map(|n| WorkerProc::start(&server, n, &["--config", &cfg]))
        .collect();
    let gpu = create_tasks(&server, "gpu", json!({}), 12, 3).await;
    let light = create_tasks(&server, "light", json!({}), 6, 2).await;
    wait_all_completed(&server, &light, Duration::from_secs(20)).await;
    wait_all_completed(&server, &gpu, Duration::from_secs(60)).await;
    let spans = intervals(&server, &gpu).await;
    assert_eq!(max_overlap(&spans), 2, "{spans:?}");
    let db = server.read_db().await;
    let workers: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT worker) FROM v_job_history WHERE tool = 'gpu' AND event = 'claimed'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert!(workers >= 2, "two at once took two processes: {workers}");
}

/// Open tasks/result of a task waiting for its client and read until the
/// pending request arrives.
async fn pending_request(c: &mut Client, task_id: &str) -> Value {
    let (_, response) = c
        .post_stream("tasks/result", json!({"taskId": task_id}))
        .await;
    let mut sse = SseReader::new(response);
    loop {
        let (_, m) = sse.next_message().await.expect("a request on the stream");
        if m.get("method").is_some() && m.get("id").is_some() {
            return m;
        }
    }
}

/// `n` `approve` tasks from one session that declared elicitation; the
/// client and the task ids.
async fn ask_approvals(server: &Server, n: usize) -> (Client, Vec<String>) {
    let mut asker = Client::new(&server.url);
    asker.initialize_with(json!({"elicitation": {}})).await;
    let mut ids = Vec::new();
    for i in 0..n {
        let t = asker
            .call_task("approve", json!({"question": format!("deploy {i}?")}))
            .await;
        ids.push(t["taskId"].as_str().unwrap().to_owned());
    }
    (asker, ids)
}

/// Answer each approval's pending request with "approved".
async fn approve_all(asker: &mut Client, ids: &[String]) {
    for id in ids {
        let request = pending_request(asker, id).await;
        let body = json!({"jsonrpc": "2.0", "id": request["id"],
                          "result": {"action": "accept", "content": {"approved": true}}});
        let raw = asker.post_raw(asker.headers(), body.to_string()).await;
        assert_eq!(raw.status, 202, "{}", raw.body);
    }
}

/// Default settings: 200 tasks waiting for a person (`approve`, left
/// input_required) delay none of 500 other tasks; answered afterwards, the
/// approvals complete too.
#[tokio::test]
async fn issue13_waiting_tasks_hold_no_slot() {
    let server = Server::start(&[]);
    let (mut asker, approvals) = ask_approvals(&server, 200).await;
    let db = server.read_db().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'input_required'")
                .fetch_one(&db)
                .await
                .unwrap();
        if n == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "{n} of 200 asked their client");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sleeps = create_tasks(&server, "sleep", json!({"seconds": 0}), 500, 8).await;
    wait_all_completed(&server, &sleeps, Duration::from_secs(60)).await;
    let still_waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'input_required'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(still_waiting, 200, "nobody answered yet");
    approve_all(&mut asker, &approvals).await;
    wait_all_completed(&server, &approvals, Duration::from_secs(60)).await;
}

/// The same with a pool of 2 slots: 50 tasks waiting for their client hold
/// neither slot, so 100 other tasks run; answered, the 50 complete (each
/// takes a slot again to go on).
#[tokio::test]
async fn issue13_waiting_tasks_hold_no_slot_in_a_small_pool() {
    let server = Server::start(&["--workers", "2"]);
    let (mut asker, approvals) = ask_approvals(&server, 50).await;
    let sleeps = create_tasks(&server, "sleep", json!({"seconds": 0}), 100, 4).await;
    wait_all_completed(&server, &sleeps, Duration::from_secs(60)).await;
    approve_all(&mut asker, &approvals).await;
    wait_all_completed(&server, &approvals, Duration::from_secs(60)).await;
}
