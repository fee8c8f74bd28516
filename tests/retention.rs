//! Retention (issue 27 item 3), through the real `taskbroker serve` over
//! HTTP and the real `taskbroker prune` on both storage drivers: past its
//! ttl a task is kept (for operators only: it answers as expired, T-33),
//! archived with its status history, or deleted, as the rule of its status
//! and tool says (`[server]` for every tool, `[[tool]]` for its own);
//! `prune --dry-run` says what would go and changes nothing; kept rows are
//! not looked at again until they are due. Retention shorter than the
//! longest ttl is refused at start (tests/command_tools.rs).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::process::Command;
use std::time::Duration;

use common::{Driver, Server};
use serde_json::{Value, json};

/// Every task lives 3 s; failed ones are then kept an hour, and the rest
/// archived, except `job`'s: completed ones kept 30 minutes, the rest
/// deleted.
const CONFIG: &str = r#"
[server]
max_ttl = "3s"
retain_failed = "1h"
archive = true

[[tool]]
name = "job"
description = "answers ok"
command = ["sh", "-c", "cat > /dev/null; echo ok"]
task_support = "optional"
retain_completed = "30m"
archive = false
"#;

/// `taskbroker prune [extra] --json --db <server's>`: its JSON answer.
fn prune(server: &Server, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .arg("prune")
        .args(extra)
        .args(["--json", "--db", &server.db_arg()])
        .env_remove("TASKBROKER_DB")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "prune {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The dry run's groups as `(tool, status, action, tasks)`.
fn groups(plan: &Value) -> Vec<(String, String, String, u64)> {
    plan.as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["tool"].as_str().unwrap().to_owned(),
                g["status"].as_str().unwrap().to_owned(),
                g["action"].as_str().unwrap().to_owned(),
                g["tasks"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn rules_of_status_and_tool_keep_archive_or_delete(driver: Driver) {
    let mut server = Server::start_with_config_on(driver, CONFIG, &[]);
    let mut c = server.client().await;
    let sleep_done = c.call_task("sleep", json!({ "seconds": 0 })).await;
    let failed = c.call_task("fail", json!({ "message": "boom" })).await;
    let job_done = c.call_task("job", json!({})).await;
    let cancelled = c.call_task("sleep", json!({ "seconds": 30 })).await;
    let id = |t: &Value| t["taskId"].as_str().unwrap().to_owned();
    c.ok("tasks/cancel", json!({ "taskId": id(&cancelled) }))
        .await;
    for (task, status) in [
        (&sleep_done, "completed"),
        (&failed, "failed"),
        (&job_done, "completed"),
    ] {
        let done = c.wait_terminal(&id(task), Duration::from_secs(20)).await;
        assert_eq!(done["status"], status, "{done}");
        assert_eq!(done["ttl"], 3000, "ttl capped by max_ttl: {done}");
    }
    // No broker runs while prune does: what it reports is all there is.
    server.kill9();
    tokio::time::sleep(Duration::from_millis(3_200)).await;

    let plan = prune(&server, &["--dry-run"]);
    assert_eq!(
        groups(&plan),
        vec![
            ("fail".into(), "failed".into(), "keep".into(), 1),
            ("job".into(), "completed".into(), "keep".into(), 1),
            ("sleep".into(), "cancelled".into(), "archive".into(), 1),
            ("sleep".into(), "completed".into(), "archive".into(), 1),
        ],
        "{plan}"
    );
    let db = server.db_reader().await;
    let rows: i64 = db.scalar("SELECT COUNT(*) FROM tasks", &[]).await;
    assert_eq!(rows, 4, "the dry run changed nothing");

    assert_eq!(
        prune(&server, &[]),
        json!({ "deleted": 0, "archived": 2, "kept": 2 })
    );
    // Kept: the failed task an hour after it failed, job's 30 minutes
    // after it completed.
    let kept: Vec<(String, i64, i64)> = db
        .all(
            "SELECT task_id, keep_until - updated_at, keep_until FROM tasks ORDER BY seq",
            &[],
        )
        .await;
    let by_id = |task: &Value| kept.iter().find(|k| k.0 == id(task)).map(|k| k.1);
    assert_eq!(by_id(&failed), Some(3_600_000));
    assert_eq!(by_id(&job_done), Some(1_800_000));
    assert_eq!(kept.len(), 2);
    // Archived with their status history, readable through the view.
    let archived: Vec<(String, String, String)> = db
        .all(
            "SELECT task_id, status, CAST(history AS TEXT) FROM v_tasks_archive ORDER BY seq",
            &[],
        )
        .await;
    assert_eq!(archived.len(), 2, "{archived:?}");
    let (_, status, history) = archived
        .iter()
        .find(|a| a.0 == id(&cancelled))
        .unwrap()
        .clone();
    assert_eq!(status, "cancelled");
    let history: Value = serde_json::from_str(&history).unwrap();
    let steps: Vec<(Value, Value)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["from"].clone(), h["to"].clone()))
        .collect();
    assert_eq!(
        steps,
        vec![
            (Value::Null, json!("working")),
            (json!("working"), json!("cancelled"))
        ]
    );
    let jobs: i64 = db.scalar("SELECT COUNT(*) FROM jobs", &[]).await;
    assert_eq!(jobs, 2, "archived tasks' jobs went with them");
    db.close().await;

    // Kept rows are not due: nothing more to do.
    assert_eq!(prune(&server, &["--dry-run"]), json!([]));
    assert_eq!(
        prune(&server, &[]),
        json!({ "deleted": 0, "archived": 0, "kept": 0 })
    );

    // T-33: past its ttl a kept task is not served, an archived one is
    // gone; tasks/list shows neither.
    server.kill_and_restart();
    c.reconnect(&server.url);
    let expired = c.err("tasks/get", json!({ "taskId": id(&failed) })).await;
    assert_eq!(expired["code"], -32602, "{expired}");
    assert!(
        expired["message"].as_str().unwrap().contains("expired"),
        "{expired}"
    );
    let gone = c
        .err("tasks/get", json!({ "taskId": id(&sleep_done) }))
        .await;
    assert_eq!(gone["code"], -32602, "{gone}");
    assert!(
        gone["message"].as_str().unwrap().contains("not found"),
        "{gone}"
    );
    let list = c.ok("tasks/list", json!({})).await;
    assert_eq!(list["tasks"], json!([]), "{list}");
}
both_drivers!(rules_of_status_and_tool_keep_archive_or_delete);

/// The broker's own maintenance applies the rules too: 30 completed tasks
/// past their ttl, all kept by the running broker, which counts them in
/// its metrics.
async fn the_running_broker_applies_the_rules(driver: Driver) {
    let server = Server::start_with_config_on(
        driver,
        "[server]\nmax_ttl = \"1s\"\nretain_completed = \"1d\"\n",
        &[],
    );
    let mut c = server.client().await;
    let mut ids = Vec::new();
    for _ in 0..30 {
        let t = c.call_task("sleep", json!({ "seconds": 0 })).await;
        ids.push(t["taskId"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        c.wait_terminal(id, Duration::from_secs(20)).await;
    }
    // The purge runs every 5 s.
    let db = server.db_reader().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let kept: i64 = db
            .scalar(
                "SELECT COUNT(*) FROM tasks WHERE keep_until IS NOT NULL",
                &[],
            )
            .await;
        if kept == 30 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{kept} of 30 kept: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.close().await;
    assert!(
        server.log().contains("expired tasks purged"),
        "{}",
        server.log()
    );
    // And counts them: taskbroker_expired_tasks_total{fate="kept"}.
    let base = server.url.trim_end_matches("/mcp");
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("taskbroker_expired_tasks_total{fate=\"kept\"} 30"),
        "{metrics}"
    );
}
both_drivers!(the_running_broker_applies_the_rules);
