//! Benchmark 3 on PostgreSQL (scripts/bench-drivers): the store ceiling.
//! The claim and completion statements of the PostgreSQL driver, run in a
//! tight loop straight on one connection (sqlx without its macros,
//! prepared statements, the same server, the same synchronous_commit) and
//! through the broker's store layer (the driver's pool, as the worker pool
//! and the writer call it). The ratio says what the store layer costs; the
//! same measure as benches/store_ceiling.rs on SQLite.
//!
//! Two shapes, each on a fresh database holding the same queued jobs:
//! - `one`: claim one job, complete it (its own transaction), repeat.
//! - `batch16`: claim 16 jobs in one statement, complete the 16 in one group
//!   commit (the writer's grouped statements), repeat.
//!
//! Each (shape, side) gets a database of its own on the server, created,
//! migrated by the store, filled, measured, checked and dropped.
//!
//! usage: cargo bench --bench store_ceiling_pg -- [--jobs N] [--durability full|normal]
//!        [--server postgres://postgres@127.0.0.1:5432]
//! prints one JSON object per line: {"shape","durability","side","jobs_per_s",...}

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: fail loudly

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::time::Instant;

use futures_util::FutureExt;
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use taskbroker::store::{
    self, Durability, OneWrite, ResultKind, TaskOutcome, TaskStatus, ToolQuota, Write, Written,
};

const LEASE_MS: i64 = 30_000;
const T0: i64 = 1_700_000_000_000;
const SERVER: &str = "postgres://postgres@127.0.0.1:5432";

// The statements below are the PostgreSQL driver's own, copied from
// crates/postgres/src/jobs.rs (`claim_in`, `complete_in`) and batch.rs
// (`complete_many`): sqlx's macros keep their SQL
// to themselves. Run here with `sqlx::query`, which prepares each statement
// once per connection and caches it, as the macros do.

/// `claim_in`'s statement. Bound as the driver binds it when no quota may
/// bind (one tool, free = limit, no global limit): head ($7) = limit.
const CLAIM: &str = r#"WITH quota AS (SELECT tool, free, global_limit
                            FROM jsonb_to_recordset($6::jsonb)
                                 AS q(tool text, free bigint, global_limit bigint)),
                running AS (SELECT r.tool, count(*) AS n
                              FROM jobs r JOIN tasks t ON t.seq = r.task_seq
                             WHERE r.state = 'running' AND t.status = 'working'
                               AND r.tool IN (SELECT tool FROM quota WHERE global_limit IS NOT NULL)
                             GROUP BY r.tool),
                cap AS (SELECT q.tool,
                               LEAST(q.free, COALESCE(q.global_limit - COALESCE(r.n, 0), q.free)) AS n
                          FROM quota q LEFT JOIN running r ON r.tool = q.tool),
                head AS (SELECT task_seq, priority, tool FROM jobs
                          WHERE state = 'queued' AND run_after <= $4
                            AND tool IN (SELECT tool FROM cap WHERE n > 0)
                          ORDER BY priority, task_seq LIMIT $7
                          FOR UPDATE SKIP LOCKED),
                ranked AS (SELECT task_seq, priority, tool,
                                  row_number() OVER (PARTITION BY tool ORDER BY priority, task_seq) AS rn
                             FROM head),
                picked AS (SELECT k.task_seq FROM ranked k JOIN cap c ON c.tool = k.tool
                            WHERE k.rn <= c.n
                            ORDER BY k.priority, k.task_seq LIMIT $5)
           UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = $1,
                  lease_token = $2, lease_expires_at = $3, changed_at = $4
             FROM tasks t
            WHERE jobs.task_seq IN (SELECT task_seq FROM picked) AND jobs.state = 'queued'
              AND t.seq = jobs.task_seq
           RETURNING jobs.task_seq AS "task_seq!", t.task_id AS "task_id!", jobs.tool AS "tool!",
                     t.arguments AS "arguments!", t.progress_token AS "progress_token?",
                     jobs.attempt AS "attempt!", jobs.max_attempts AS "max_attempts!",
                     jobs.priority AS "priority!", jobs.lease_token AS "lease_token!""#;

/// `complete_in`, the fenced job.
const COMPLETE_JOB: &str =
    "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                finished_at = $1, changed_at = $1, last_error = NULL
          WHERE task_seq = $2 AND lease_token = $3 AND state = 'running'";

/// `complete_in`, the task's outcome.
const COMPLETE_TASK: &str =
    "UPDATE tasks SET status = $1, status_message = $2, result = $3, result_kind = $4,
                updated_at = GREATEST(updated_at, $5)
          WHERE seq = $6 AND status IN ('working', 'input_required')";

/// `complete_many`, the fenced jobs.
const COMPLETE_JOBS_GROUPED: &str =
    "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                finished_at = $1, changed_at = $1, last_error = NULL
           FROM unnest($2::bigint[], $3::text[]) AS c(seq, token)
          WHERE jobs.task_seq = c.seq AND jobs.lease_token = c.token AND jobs.state = 'running'
         RETURNING jobs.task_seq";

/// `complete_many`, the tasks' outcomes.
const COMPLETE_TASKS_GROUPED: &str =
    "UPDATE tasks SET status = c.status, status_message = c.message, result = c.result,
                result_kind = c.kind, updated_at = GREATEST(tasks.updated_at, $1)
           FROM jsonb_to_recordset($2::jsonb)
                AS c(seq bigint, status text, message text, result text, kind text)
          WHERE tasks.seq = c.seq AND tasks.status IN ('working', 'input_required')
         RETURNING tasks.seq";

fn outcome() -> TaskOutcome {
    TaskOutcome {
        status: TaskStatus::Completed,
        status_message: None,
        result: r#"{"content":[{"type":"text","text":"done"}]}"#.to_owned(),
        result_kind: ResultKind::Result,
        tool_error: false,
    }
}

async fn execute(conn: &mut PgConnection, sql: String) {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(conn)
        .await
        .unwrap();
}

/// A fresh database `name` on `server` with the broker's schema and `jobs`
/// queued tasks (the rows benches/store_ceiling.rs inserts); its URL.
async fn fresh(
    admin: &mut PgConnection,
    server: &str,
    name: &str,
    jobs: usize,
    durability: Durability,
) -> String {
    execute(
        admin,
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .await;
    execute(admin, format!("CREATE DATABASE {name}")).await;
    let url = format!("{server}/{name}");
    let store = store::open(Path::new(&url), durability).await.unwrap();
    store.close().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let inserted = sqlx::query(
        r#"WITH t AS (INSERT INTO tasks (task_id, owner, tool, arguments, created_at, updated_at,
                                        poll_interval_ms)
                      SELECT 'task-' || i, 'bench', 'sleep', '{"seconds":0}', $1, $1, 1000
                        FROM generate_series(0, $2 - 1) AS i ORDER BY i
                      RETURNING seq)
           INSERT INTO jobs (task_seq, tool, max_attempts, run_after)
           SELECT seq, 'sleep', 3, $1 FROM t"#,
    )
    .bind(T0)
    .bind(jobs as i64)
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(inserted.rows_affected(), jobs as u64);
    tx.commit().await.unwrap();
    // Statistics now, so that autovacuum does not re-plan one side mid-run.
    execute(&mut conn, "ANALYZE".into()).await;
    conn.close().await.unwrap();
    url
}

/// Straight on one connection: the driver's statements, prepared, in a loop.
async fn raw_loop(url: &str, durability: Durability, batch: usize) -> usize {
    let mut conn = PgConnection::connect(url).await.unwrap();
    if durability == Durability::Normal {
        // What the driver sets on each of its connections.
        execute(&mut conn, "SET synchronous_commit = off".into()).await;
    }
    let out = outcome();
    let quotas = json!([{"tool": "sleep", "free": batch as i64, "global_limit": null}]);
    let mut done = 0;
    let mut round = 0u64;
    loop {
        round += 1;
        let token = format!("lease-{round}");
        let now = T0 + 1;
        // Autocommit, as the driver claims when no quota has a global limit.
        let claimed: Vec<i64> = sqlx::query(CLAIM)
            .bind("bench")
            .bind(&token)
            .bind(now + LEASE_MS)
            .bind(now)
            .bind(batch as i64)
            .bind(&quotas)
            .bind(batch as i64)
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        if claimed.is_empty() {
            conn.close().await.unwrap();
            return done;
        }
        let mut tx = conn.begin().await.unwrap();
        if batch == 1 {
            // `job_complete`: its own transaction, `complete_in`'s two statements.
            for seq in &claimed {
                let fenced = sqlx::query(COMPLETE_JOB)
                    .bind(now)
                    .bind(seq)
                    .bind(&token)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                assert_eq!(fenced.rows_affected(), 1);
                let took = sqlx::query(COMPLETE_TASK)
                    .bind(out.status.as_str())
                    .bind(&out.status_message)
                    .bind(&out.result)
                    .bind(out.result_kind.as_str())
                    .bind(now)
                    .bind(seq)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                assert_eq!(took.rows_affected(), 1);
            }
        } else {
            // `write_batch` of completions: `complete_many`'s two statements.
            let tokens: Vec<String> = claimed.iter().map(|_| token.clone()).collect();
            let fenced: Vec<i64> = sqlx::query_scalar(COMPLETE_JOBS_GROUPED)
                .bind(now)
                .bind(&claimed)
                .bind(&tokens)
                .fetch_all(&mut *tx)
                .await
                .unwrap();
            let outcomes: Vec<Value> = fenced
                .iter()
                .map(|seq| {
                    json!({"seq": seq, "status": out.status.as_str(), "message": out.status_message,
                           "result": out.result, "kind": out.result_kind.as_str()})
                })
                .collect();
            let took: Vec<i64> = sqlx::query_scalar(COMPLETE_TASKS_GROUPED)
                .bind(now)
                .bind(Value::Array(outcomes))
                .fetch_all(&mut *tx)
                .await
                .unwrap();
            assert_eq!(took.len(), claimed.len());
        }
        tx.commit().await.unwrap();
        done += claimed.len();
    }
}

/// Through the store layer, as the worker pool and the writer use it.
async fn store_loop(url: &str, durability: Durability, batch: usize) -> usize {
    let store = store::open_existing(Path::new(url), durability)
        .await
        .unwrap();
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

/// Every job claimed once and done, every task completed, one claim and
/// one finish in each job's history.
async fn check(url: &str, jobs: usize) {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let (done, claims, finishes): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM jobs j JOIN tasks t ON t.seq = j.task_seq
                  WHERE j.state = 'done' AND j.attempt = 1 AND t.status = 'completed'),
                (SELECT count(*) FROM job_events WHERE event = 'claimed'),
                (SELECT count(*) FROM job_events WHERE event = 'finished')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    let jobs = jobs as i64;
    assert_eq!(
        (done, claims, finishes),
        (jobs, jobs, jobs),
        "every job claimed and completed once"
    );
}

/// One (shape, side) on the database at `url`: its JSON line.
async fn case(
    url: &str,
    shape: &str,
    batch: usize,
    side: &str,
    jobs: usize,
    durability: Durability,
    label: &str,
) -> Value {
    let t0 = Instant::now();
    let done = if side == "raw" {
        raw_loop(url, durability, batch).await
    } else {
        store_loop(url, durability, batch).await
    };
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(done, jobs, "every job claimed and completed once");
    check(url, jobs).await;
    json!({"shape": shape, "durability": label, "side": side, "jobs": done,
           "seconds": secs, "jobs_per_s": done as f64 / secs})
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
    let server = arg(&args, "--server").unwrap_or_else(|| SERVER.into());
    let server = server.trim_end_matches('/');
    let label = match durability {
        Durability::Full => "full",
        Durability::Normal => "normal",
    };
    let mut admin = PgConnection::connect(&format!("{server}/postgres"))
        .await
        .expect("a PostgreSQL server at --server");
    for (shape, batch) in [("one", 1usize), ("batch16", 16)] {
        for side in ["raw", "store"] {
            let name = format!("tb_ceiling_{}_{shape}_{side}", std::process::id());
            let url = fresh(&mut admin, server, &name, jobs, durability).await;
            // Dropped whatever happens, then a failure fails the bench.
            let line = AssertUnwindSafe(case(&url, shape, batch, side, jobs, durability, label))
                .catch_unwind()
                .await;
            execute(&mut admin, format!("DROP DATABASE {name} WITH (FORCE)")).await;
            let line = line.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            println!("{line}");
        }
    }
    admin.close().await.unwrap();
}
