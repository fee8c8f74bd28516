//! Benchmark 3 of scripts/bench: the store ceiling. The claim and
//! completion statements of the broker, run in a tight loop straight on
//! SQLite (rusqlite, prepared statements, the same bundled SQLite library,
//! the same file settings) and through the broker's store layer (sqlx, as
//! the worker pool and the writer call it). The ratio says what the store
//! layer costs.
//!
//! Two shapes, each on a fresh database holding the same queued jobs:
//! - `one`: claim one job, complete it (its own transaction), repeat.
//! - `batch16`: claim 16 jobs in one statement, complete the 16 in one group
//!   commit (the writer's grouped statements), repeat.
//!
//! usage: cargo bench --bench store_ceiling -- [--jobs N] [--durability full|normal]
//! prints one JSON object per line: {"shape","durability","side","jobs_per_s",...}

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: fail loudly

use std::path::Path;
use std::time::Instant;

use rusqlite::{Connection, TransactionBehavior, params};
use serde_json::{Value, json};
use taskbroker::store::{
    self, Durability, OneWrite, ResultKind, TaskOutcome, TaskStatus, ToolQuota, Write, Written,
};

const LEASE_MS: i64 = 30_000;
const T0: i64 = 1_700_000_000_000;

// The statements below are the store's own (src/store/jobs.rs and
// src/store/batch.rs), copied: sqlx's macros keep their SQL to themselves.

const CLAIM: &str = "WITH quota AS (SELECT value ->> 'tool' AS tool, value ->> 'free' AS free,
                             value ->> 'global' AS global
                        FROM json_each(?6)),
             running AS (SELECT r.tool, count(*) AS n
                           FROM jobs r JOIN tasks t ON t.seq = r.task_seq
                          WHERE r.state = 'running' AND t.status = 'working'
                            AND r.tool IN (SELECT tool FROM quota WHERE global IS NOT NULL)
                          GROUP BY r.tool),
             cap AS (SELECT q.tool,
                            min(q.free, coalesce(q.global - coalesce(r.n, 0), q.free)) AS n
                       FROM quota q LEFT JOIN running r ON r.tool = q.tool),
             head AS (SELECT task_seq, priority, tool FROM jobs
                       WHERE state = 'queued' AND run_after <= ?4
                         AND tool IN (SELECT tool FROM cap WHERE n > 0)
                       ORDER BY priority, task_seq LIMIT ?7),
             ranked AS (SELECT task_seq, priority, tool,
                               row_number() OVER (PARTITION BY tool ORDER BY priority, task_seq) AS rn
                          FROM head)
        UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = ?1,
               lease_token = ?2, lease_expires_at = ?3, changed_at = ?4
         WHERE task_seq IN (SELECT k.task_seq FROM ranked k JOIN cap c ON c.tool = k.tool
                             WHERE k.rn <= c.n
                             ORDER BY k.priority, k.task_seq LIMIT ?5)
        RETURNING task_seq,
                  (SELECT task_id FROM tasks WHERE seq = task_seq),
                  tool,
                  (SELECT arguments FROM tasks WHERE seq = task_seq),
                  (SELECT progress_token FROM tasks WHERE seq = task_seq),
                  attempt, max_attempts, priority, lease_token";

/// The quota the store builds for one tool with N free slots.
const QUOTA: &str = r#"[{"tool":"sleep","free":N,"global":null}]"#;

const COMPLETE_JOB: &str =
    "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
        finished_at = ?1, changed_at = ?1, last_error = NULL
  WHERE task_seq = ?2 AND lease_token = ?3 AND state = 'running'";

const COMPLETE_TASK: &str =
    "UPDATE tasks SET status = ?, status_message = ?, result = ?, result_kind = ?,
        updated_at = MAX(updated_at, ?)
  WHERE seq = ? AND status IN ('working', 'input_required')";

const COMPLETE_JOBS_GROUPED: &str =
    "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
        finished_at = ?1, changed_at = ?1, last_error = NULL
   FROM (SELECT value ->> 'seq' AS seq, value ->> 'token' AS token FROM json_each(?2)) AS c
  WHERE jobs.task_seq = c.seq AND jobs.lease_token = c.token AND +jobs.state = 'running'
 RETURNING task_seq";

const COMPLETE_TASKS_GROUPED: &str =
    "UPDATE tasks SET status = c.status, status_message = c.message, result = c.result,
        result_kind = c.kind, updated_at = MAX(updated_at, ?1)
   FROM (SELECT value ->> 'seq' AS seq, value ->> 'status' AS status,
                value ->> 'message' AS message, value ->> 'result' AS result,
                value ->> 'kind' AS kind
           FROM json_each(?2)) AS c
  WHERE tasks.seq = c.seq AND +tasks.status IN ('working', 'input_required')
 RETURNING seq";

fn outcome() -> TaskOutcome {
    TaskOutcome {
        status: TaskStatus::Completed,
        status_message: None,
        result: r#"{"content":[{"type":"text","text":"done"}]}"#.to_owned(),
        result_kind: ResultKind::Result,
        tool_error: false,
    }
}

fn raw_connection(path: &Path, durability: Durability) -> Connection {
    let conn = Connection::open(path).unwrap();
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA busy_timeout = 10000; PRAGMA foreign_keys = ON;"
    ))
    .unwrap();
    conn
}

/// A fresh database with the broker's schema and `jobs` queued tasks.
async fn fresh(dir: &Path, name: &str, jobs: usize, durability: Durability) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.db"));
    let store = store::open(&path, durability).await.unwrap();
    store.close().await;
    let mut conn = raw_connection(&path, durability);
    let tx = conn.transaction().unwrap();
    {
        let mut task = tx
            .prepare(
                "INSERT INTO tasks (task_id, owner, tool, arguments, created_at, updated_at, poll_interval_ms)
                 VALUES (?, 'bench', 'sleep', '{\"seconds\":0}', ?, ?, 1000)",
            )
            .unwrap();
        let mut job = tx
            .prepare("INSERT INTO jobs (task_seq, tool, max_attempts, run_after) VALUES (?, 'sleep', 3, ?)")
            .unwrap();
        for i in 0..jobs {
            task.execute(params![format!("task-{i}"), T0, T0]).unwrap();
            job.execute(params![tx.last_insert_rowid(), T0]).unwrap();
        }
    }
    tx.commit().unwrap();
    path
}

/// Straight on SQLite: prepared statements in a loop.
fn raw_loop(path: &Path, durability: Durability, batch: usize) -> usize {
    let mut conn = raw_connection(path, durability);
    let out = outcome();
    let mut done = 0;
    let mut round = 0u64;
    loop {
        round += 1;
        let token = format!("lease-{round}");
        let now = T0 + 1;
        let claimed: Vec<i64> = {
            let mut claim = conn.prepare_cached(CLAIM).unwrap();
            claim
                .query_map(
                    params![
                        "bench",
                        token,
                        now + LEASE_MS,
                        now,
                        batch as i64,
                        QUOTA.replace("N", &batch.to_string()),
                        4 * batch as i64
                    ],
                    |r| r.get(0),
                )
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        if claimed.is_empty() {
            return done;
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        if batch == 1 {
            let mut job = tx.prepare_cached(COMPLETE_JOB).unwrap();
            let mut task = tx.prepare_cached(COMPLETE_TASK).unwrap();
            for seq in &claimed {
                assert_eq!(job.execute(params![now, seq, token]).unwrap(), 1);
                task.execute(params![
                    out.status.as_str(),
                    out.status_message,
                    out.result,
                    out.result_kind.as_str(),
                    now,
                    seq
                ])
                .unwrap();
            }
        } else {
            let leases: Vec<Value> = claimed
                .iter()
                .map(|seq| json!({"seq": seq, "token": token}))
                .collect();
            let fenced: Vec<i64> = {
                let mut jobs = tx.prepare_cached(COMPLETE_JOBS_GROUPED).unwrap();
                jobs.query_map(params![now, Value::Array(leases).to_string()], |r| r.get(0))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap()
            };
            let outcomes: Vec<Value> = fenced
                .iter()
                .map(|seq| {
                    json!({"seq": seq, "status": out.status.as_str(), "message": out.status_message,
                           "result": out.result, "kind": out.result_kind.as_str()})
                })
                .collect();
            let mut tasks = tx.prepare_cached(COMPLETE_TASKS_GROUPED).unwrap();
            let n = tasks
                .query_map(params![now, Value::Array(outcomes).to_string()], |r| {
                    r.get::<_, i64>(0)
                })
                .unwrap()
                .count();
            assert_eq!(n, claimed.len());
        }
        tx.commit().unwrap();
        done += claimed.len();
    }
}

/// Through the store layer, as the worker pool and the writer use it.
async fn store_loop(path: &Path, durability: Durability, batch: usize) -> usize {
    let store = store::open_existing(path, durability).await.unwrap();
    let mut done = 0;
    let mut round = 0u64;
    loop {
        round += 1;
        let token = format!("lease-{round}");
        let now = T0 + 1;
        let claimed = store
            .job_claim_available(
                "bench",
                &token,
                &[ToolQuota {
                    tool: "sleep".into(),
                    free: batch as i64,
                    global: None,
                }],
                batch as i64,
                LEASE_MS,
                now,
            )
            .await
            .unwrap();
        if claimed.is_empty() {
            store.close().await;
            return done;
        }
        if batch == 1 {
            for job in &claimed {
                assert!(
                    store
                        .job_complete(job.task_seq, &token, &outcome(), now)
                        .await
                        .unwrap()
                );
            }
        } else {
            let ops: Vec<Write> = claimed
                .iter()
                .map(|job| Write::Complete {
                    task_seq: job.task_seq,
                    task_id: job.task_id.clone(),
                    lease_token: token.clone(),
                    outcome: outcome(),
                })
                .collect();
            for done in store.write_batch(&ops, now).await.unwrap() {
                assert!(matches!(done, Ok(Written::Completed(true))));
            }
        }
        done += claimed.len();
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let jobs: usize = arg(&args, "--jobs")
        .map(|v| v.parse().expect("--jobs N"))
        .unwrap_or(5_000);
    let durability: Durability = arg(&args, "--durability")
        .unwrap_or_else(|| "full".into())
        .parse()
        .expect("--durability full|normal");
    let label = match durability {
        Durability::Full => "full",
        Durability::Normal => "normal",
    };
    let dir = tempfile::tempdir().unwrap();
    for (shape, batch) in [("one", 1usize), ("batch16", 16)] {
        for side in ["raw", "store"] {
            let path = fresh(dir.path(), &format!("{shape}-{side}"), jobs, durability).await;
            let t0 = Instant::now();
            let done = if side == "raw" {
                raw_loop(&path, durability, batch)
            } else {
                store_loop(&path, durability, batch).await
            };
            let secs = t0.elapsed().as_secs_f64();
            assert_eq!(done, jobs, "every job claimed and completed once");
            println!(
                "{}",
                json!({"shape": shape, "durability": label, "side": side, "jobs": done,
                       "seconds": secs, "jobs_per_s": done as f64 / secs})
            );
        }
    }
}
