//! Worker processes against real processes: chaos with kill -9, exactly-once
//! visible completion, cancellation reaching the tool process, graceful
//! SIGTERM release, schema checks, the workers table.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, Driver, Server, SseReader, WorkerProc, pid_alive};
use serde_json::{Value, json};

/// A command tool that records the start and end of every execution
/// (task id, attempt) in a file, and returns the attempt it ran as.
const RECORDING_TOOL: &str = r#"
[[tool]]
name = "record"
description = "Record each execution in a file"
command = ["sh", "-c", "echo \"start $TASKBROKER_TASK_ID $TASKBROKER_ATTEMPT\" >> \"$RECORD\"; sleep 0.1; echo \"end $TASKBROKER_TASK_ID $TASKBROKER_ATTEMPT\" >> \"$RECORD\"; echo \"ran as attempt $TASKBROKER_ATTEMPT\""]
task_support = "required"
max_attempts = 20
env = { RECORD = "@DIR@/executions.log" }

[[tool]]
name = "hang"
description = "Write its pid, then sleep for a minute"
command = ["sh", "-c", "echo $$ > \"@DIR@/hang.$TASKBROKER_TASK_ID.pid\"; exec sleep 60"]
task_support = "required"
max_attempts = 1

[[tool]]
name = "slow"
description = "Sleep for the given seconds"
command = ["sh", "-c", "sleep \"$(cat | sed 's/[^0-9.]//g')\"; echo \"slow done on attempt $TASKBROKER_ATTEMPT\""]
task_support = "required"
input_schema = { type = "object", properties = { s = { type = "number" } }, required = ["s"] }
"#;

fn id(t: &Value) -> String {
    t["taskId"].as_str().unwrap().to_owned()
}

/// Acceptance: 1,000 tasks, 3 worker processes, one killed -9 every few
/// hundred ms and replaced. Every task ends terminal, none is lost, none
/// completes twice, reruns show their attempt numbers, and no attempt of a
/// job ever ran twice (T-22 fencing, lease recovery).
async fn chaos_kill9_workers_exactly_once_visible_completion(driver: Driver) {
    // The chaos is about workers, not the abuse limits.
    let server = Server::start_with_config_on(
        driver,
        RECORDING_TOOL,
        &[
            "--workers",
            "0",
            "--durability",
            "normal",
            "--rate",
            "0",
            "--max-open-tasks",
            "5000",
        ],
    );
    let cfg = server.config_path();
    let flags = [
        "--config",
        &cfg,
        "--lease",
        "1",
        "--concurrency",
        "4",
        "--grace",
        "0",
    ];
    let mut workers: Vec<WorkerProc> = (0..3)
        .map(|n| WorkerProc::start(&server, n, &flags))
        .collect();
    let mut c = server.client().await;
    // The tasks are created while the chaos goes on (the workers keep up
    // with the client: chaos after the last creation would find little
    // left to disturb).
    let mut creator = Client::new(&server.url);
    creator.session = c.session.clone();
    let creating = tokio::spawn(async move {
        let mut ids = Vec::new();
        for _ in 0..1000 {
            ids.push(id(&creator.call_task("record", json!({})).await));
        }
        ids
    });
    // Chaos: kill a random worker every 300 ms and start a new one, until
    // every task is created and terminal.
    let db = server.db_reader().await;
    let mut next = 3;
    let mut kills = 0;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let open: i64 = db
            .scalar(
                "SELECT count(*) FROM tasks WHERE status IN ('working', 'input_required')",
                &[],
            )
            .await;
        if open == 0 && creating.is_finished() {
            break;
        }
        assert!(Instant::now() < deadline, "{open} tasks still open");
        tokio::time::sleep(Duration::from_millis(300)).await;
        if kills < 40 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let victim = (seed % workers.len() as u64) as usize;
            workers[victim].kill9();
            workers[victim] = WorkerProc::start(&server, next, &flags);
            next += 1;
            kills += 1;
        }
    }
    let ids = creating.await.unwrap();
    // Outcomes as the client sees them.
    let mut completed = 0;
    let mut failed = 0;
    let mut recorded_attempt: HashMap<String, i64> = HashMap::new();
    for task_id in &ids {
        let task = c.ok("tasks/get", json!({"taskId": task_id})).await;
        match task["status"].as_str().unwrap() {
            "completed" => completed += 1,
            "failed" => failed += 1,
            other => panic!("task {task_id} ended {other}"),
        }
        if task["status"] == "completed" {
            let r = c.ok("tasks/result", json!({"taskId": task_id})).await;
            let text = r["content"][0]["text"].as_str().unwrap().trim().to_owned();
            let attempt: i64 = text.trim_start_matches("ran as attempt ").parse().unwrap();
            recorded_attempt.insert(task_id.clone(), attempt);
        }
    }
    // One terminal transition per task in the history (no double completion).
    let terminal: Vec<(String, i64)> = db
        .all(
            "SELECT task_id, count(*) FROM task_events WHERE to_status IN ('completed','failed','cancelled') GROUP BY task_id",
            &[],
        )
        .await;
    assert_eq!(terminal.len(), 1000, "every task has a terminal transition");
    assert!(
        terminal.iter().all(|(_, n)| *n == 1),
        "a task completed twice"
    );

    // Execution records: no attempt started twice; the recorded outcome is
    // the outcome of the job's last attempt, which really ran to its end.
    let log = std::fs::read_to_string(server.dir.join("executions.log")).unwrap();
    let mut starts: HashSet<(String, i64)> = HashSet::new();
    let mut ends: HashSet<(String, i64)> = HashSet::new();
    let mut runs: HashMap<String, usize> = HashMap::new();
    for line in log.lines() {
        let mut parts = line.split(' ');
        let (kind, task, attempt) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let key = (task.to_owned(), attempt.parse::<i64>().unwrap());
        if kind == "start" {
            assert!(starts.insert(key), "attempt started twice: {line}");
            *runs.entry(task.to_owned()).or_default() += 1;
        } else {
            ends.insert(key);
        }
    }
    let final_attempts: HashMap<String, i64> = db
        .all::<(String, i64)>(
            "SELECT t.task_id, j.attempt FROM tasks t JOIN jobs j ON j.task_seq = t.seq",
            &[],
        )
        .await
        .into_iter()
        .collect();
    for (task, attempt) in &recorded_attempt {
        assert_eq!(
            final_attempts[task], *attempt,
            "task {task}: result of a stale attempt"
        );
        assert!(
            ends.contains(&(task.clone(), *attempt)),
            "task {task}: recorded attempt never finished"
        );
    }
    let reran: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    for (task, n) in &reran {
        // Attempt numbers show why: 1..=n, each a distinct attempt.
        let attempts: HashSet<i64> = starts
            .iter()
            .filter(|(t, _)| t == *task)
            .map(|(_, a)| *a)
            .collect();
        assert_eq!(attempts.len(), **n);
    }
    let lost_leases = log.lines().filter(|l| l.starts_with("start")).count() - ends.len();
    eprintln!(
        "chaos: 1000 tasks, {kills} workers killed: {completed} completed, {failed} failed, \
         {} ran more than once, {} executions, {lost_leases} cut short",
        reran.len(),
        starts.len()
    );
    assert_eq!(completed + failed, 1000);
    assert!(completed > 900, "too many failures: {failed}");
}

both_drivers!(
    chaos_kill9_workers_exactly_once_visible_completion;
    flavor = "multi_thread",
    worker_threads = 2
);

/// Acceptance: cancel of a running task stops the tool process (T-21), the
/// task stays cancelled (T-22), and the job is not retried. Prints the
/// measured delay from the cancel response to the process being gone.
async fn cancel_stops_the_tool_process_quickly_and_is_not_retried(driver: Driver) {
    let server = Server::start_with_config_on(driver, RECORDING_TOOL, &["--workers", "0"]);
    let cfg = server.config_path();
    // Lease 30 s: a heartbeat every 10 s, which the change feed must beat
    // with room for a slow machine.
    let _w = WorkerProc::start(&server, 0, &["--config", &cfg, "--lease", "30"]);
    let mut c = server.client().await;
    let task_id = id(&c.call_task("hang", json!({})).await);
    let pid_file = server.dir.join(format!("hang.{task_id}.pid"));
    let deadline = Instant::now() + Duration::from_secs(15);
    let pid: i32 = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file)
            && let Ok(pid) = text.trim().parse()
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "tool never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(pid_alive(pid));
    let cancelled = c.ok("tasks/cancel", json!({"taskId": task_id})).await;
    let t0 = Instant::now();
    assert_eq!(cancelled["status"], "cancelled");
    while pid_alive(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "tool process still alive after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("cancel -> tool process gone in {:?}", t0.elapsed());
    // The heartbeat is every lease/3 = 10 s; the change feed is faster.
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "as slow as the heartbeat: {:?}",
        t0.elapsed()
    );
    // Closed for good: the job is done on its first attempt (a job left
    // open would be rerun when its lease ran out).
    assert_eq!(
        c.ok("tasks/get", json!({"taskId": task_id})).await["status"],
        "cancelled"
    );
    let db = server.db_reader().await;
    let (state, attempt, cancel): (String, i64, i64) = db
        .one(
            "SELECT j.state, j.attempt, j.cancel_requested FROM jobs j JOIN tasks t ON t.seq = j.task_seq WHERE t.task_id = $1",
            &[(&task_id).into()],
        )
        .await;
    assert_eq!(
        (state.as_str(), attempt, cancel),
        ("done", 1, 1),
        "job closed, not retried"
    );
}

both_drivers!(cancel_stops_the_tool_process_quickly_and_is_not_retried);

/// Acceptance: SIGTERM of a worker with jobs in flight. A job that fits in
/// the grace period finishes there; one that does not is released and taken
/// by another worker at once, long before its 30 s lease would expire.
async fn sigterm_finishes_or_releases_jobs_to_another_worker_at_once(driver: Driver) {
    let server = Server::start_with_config_on(driver, RECORDING_TOOL, &["--workers", "0"]);
    let cfg = server.config_path();
    let a = WorkerProc::start(
        &server,
        0,
        &[
            "--config",
            &cfg,
            "--lease",
            "30",
            "--grace",
            "1.5",
            "--concurrency",
            "2",
        ],
    );
    let mut c = server.client().await;
    let short = id(&c.call_task("slow", json!({"s": 0.5})).await);
    let long = id(&c.call_task("slow", json!({"s": 4})).await);
    let db = server.db_reader().await;
    let running = || async {
        let n: i64 = db
            .scalar("SELECT count(*) FROM jobs WHERE state = 'running'", &[])
            .await;
        n
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while running().await < 2 {
        assert!(Instant::now() < deadline, "jobs never started on worker A");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _b = WorkerProc::start(&server, 1, &["--config", &cfg, "--lease", "30"]);
    a.term();
    let t0 = Instant::now();
    let done_short = c.wait_terminal(&short, Duration::from_secs(10)).await;
    assert_eq!(done_short["status"], "completed");
    let r = c.ok("tasks/result", json!({"taskId": short})).await;
    assert_eq!(
        r["content"][0]["text"], "slow done on attempt 1\n",
        "finished on A within the grace period"
    );
    let done_long = c.wait_terminal(&long, Duration::from_secs(20)).await;
    assert_eq!(done_long["status"], "completed");
    let r = c.ok("tasks/result", json!({"taskId": long})).await;
    assert_eq!(
        r["content"][0]["text"], "slow done on attempt 1\n",
        "released by A, rerun by B; the release counted no attempt"
    );
    // grace 1.5 s + a rerun of 4 s; the 30 s lease never came into it.
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    let log = a.log();
    assert!(
        log.contains("job released: queued for another worker"),
        "{log}"
    );
    let state: String = db
        .scalar(
            "SELECT state FROM workers WHERE pid = $1",
            &[a.pid().into()],
        )
        .await;
    assert_eq!(state, "stopped");
}

both_drivers!(sigterm_finishes_or_releases_jobs_to_another_worker_at_once);

/// Acceptance: workers never migrate; a schema newer or older than they
/// know is refused with a clear error, and `migrate` brings an old one up.
/// (SQLite only: it builds and edits database files by hand.)
#[tokio::test]
async fn worker_refuses_newer_or_older_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("broker.db");
    let worker = |db: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .args(["worker", "--db"])
            .arg(db)
            .output()
            .unwrap()
    };
    let migrate = |db: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .args(["migrate", "--db"])
            .arg(db)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    // No database at all.
    let out = worker(&db);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    assert!(!db.exists(), "the worker created nothing");

    migrate(&db);
    let pool =
        sqlx::SqlitePool::connect_with(sqlx::sqlite::SqliteConnectOptions::new().filename(&db))
            .await
            .unwrap();
    // Newer: a migration this build does not know.
    sqlx::query("INSERT INTO refinery_schema_history (version, name, applied_on, checksum) VALUES (99, 'future', '2030-01-01T00:00:00Z', '1')")
        .execute(&pool)
        .await
        .unwrap();
    let out = worker(&db);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("its schema (version 99) is newer than this taskbroker knows")
            && err.contains("(upgrade taskbroker)"),
        "{err}"
    );

    // Older: only V1 applied (built from the V1 file and its recorded row).
    let v1: (i64, String, String, String) = sqlx::query_as(
        "SELECT version, name, applied_on, checksum FROM refinery_schema_history WHERE version = 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    let old = dir.path().join("old.db");
    let pool = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&old)
            .create_if_missing(true),
    )
    .await
    .unwrap();
    sqlx::raw_sql(include_str!("../migrations/sqlite/V1__init.sql"))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE refinery_schema_history (version int4 PRIMARY KEY, name VARCHAR(255), applied_on VARCHAR(255), checksum VARCHAR(255))",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO refinery_schema_history VALUES (?, ?, ?, ?)")
        .bind(v1.0)
        .bind(&v1.1)
        .bind(&v1.2)
        .bind(&v1.3)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let out = worker(&old);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("older than this taskbroker's")
            && err.contains(&format!("taskbroker migrate --db {}", old.display())),
        "{err}"
    );
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite"))
        .unwrap()
        .count();
    assert!(migrate(&old).contains(&format!("{} migration(s) applied", files - 1)));
}

/// The workers table shows live pools, marks a killed one dead after two
/// missed leases, and a cleanly stopped one stopped.
async fn workers_table_tracks_live_stopped_and_dead_workers(driver: Driver) {
    let server =
        Server::start_with_config_on(driver, RECORDING_TOOL, &["--workers", "1", "--lease", "1"]);
    let cfg = server.config_path();
    let mut killed = WorkerProc::start(&server, 0, &["--config", &cfg, "--lease", "1"]);
    let stopped = WorkerProc::start(&server, 1, &["--config", &cfg, "--lease", "1"]);
    let db = server.db_reader().await;
    let state_of = |pid: i32| {
        let db = db.clone();
        async move {
            db.scalar_optional::<String>(
                "SELECT state FROM v_workers WHERE pid = $1",
                &[pid.into()],
            )
            .await
        }
    };
    let wait_state = |pid: i32, want: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let s = state_of(pid).await;
            if s.as_deref() == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "worker {pid}: {s:?}, wanted {want}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    wait_state(killed.pid(), "live").await;
    wait_state(stopped.pid(), "live").await;
    let kinds: Vec<String> = db
        .scalars("SELECT kind FROM v_workers ORDER BY kind", &[])
        .await;
    assert_eq!(kinds, ["embedded", "process", "process"]);
    killed.kill9();
    stopped.term();
    wait_state(stopped.pid(), "stopped").await;
    wait_state(killed.pid(), "dead").await;
}

both_drivers!(workers_table_tracks_live_stopped_and_dead_workers);

/// Issue 26: a worker process records in its row the tools it claims (its
/// config's, and the demo tools unless `--no-demo-tools`), which claim
/// signals name it by (a worker serving other tools is not asked to claim
/// a job it cannot run: `store::feed::a_queued_job_is_named_for_a_worker_serving_its_tool`).
async fn a_worker_process_records_the_tools_it_claims(driver: Driver) {
    let server = Server::start_with_config_on(driver, RECORDING_TOOL, &["--workers", "0"]);
    let cfg = server.config_path();
    let config_only = WorkerProc::start(&server, 0, &["--config", &cfg, "--no-demo-tools"]);
    let with_demo = WorkerProc::start(&server, 1, &["--config", &cfg]);
    let db = server.db_reader().await;
    let tools_sql = match driver {
        Driver::Sqlite => "SELECT tools FROM workers WHERE pid = $1",
        Driver::Postgres => "SELECT array_to_json(tools)::text FROM workers WHERE pid = $1",
    };
    let tools_of = async |pid: i32| -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text: Option<Option<String>> = db.scalar_optional(tools_sql, &[pid.into()]).await;
            if let Some(Some(text)) = text {
                return serde_json::from_str(&text).unwrap();
            }
            assert!(Instant::now() < deadline, "worker {pid} recorded no tools");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(
        tools_of(config_only.pid()).await,
        ["hang", "record", "slow"]
    );
    let all = tools_of(with_demo.pid()).await;
    for tool in ["echo", "hang", "record", "sleep", "slow"] {
        assert!(all.iter().any(|t| t == tool), "{tool} in {all:?}");
    }
}

both_drivers!(a_worker_process_records_the_tools_it_claims);

/// Statements of a server's sqlx log (`RUST_LOG=sqlx::query=debug`) whose
/// text contains `text`: reads counted, not timed.
fn statements_with(log: &str, text: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("sqlx::query") && l.contains(text))
        .count()
}

/// The text of a change-feed read (`task_events` joined to `tasks`).
const FEED_READ: &str = "FROM task_events e JOIN";
/// The text of a progress read.
const PROGRESS_READ: &str = "FROM task_progress";

/// Two PostgreSQL brokers on one database, A and B (B logs its statements),
/// neither with a pool of its own, and a worker process.
fn two_brokers_and_a_worker() -> (Server, Server, WorkerProc) {
    let a = Server::start_on(Driver::Postgres, &["--workers", "0"]);
    let b = Server::start_sharing_env(
        &a,
        &["--workers", "0"],
        &[("RUST_LOG", "info,sqlx::query=debug")],
    );
    let worker = WorkerProc::start(&a, 0, &["--concurrency", "8"]);
    (a, b, worker)
}

/// A client of `url` in the session of `other` (a client of another broker).
fn in_session_of(other: &Client, url: &str) -> Client {
    let mut c = Client::new(url);
    c.session.clone_from(&other.session);
    c
}

/// `clients` clients at once, each calling `sleep` 0 s as a task `each`
/// times in turn and waiting in tasks/result for its result.
async fn sleep_zero_tasks(server: &Server, clients: usize, each: usize) {
    let clients = (0..clients).map(|_| async move {
        let mut c = server.client().await;
        for _ in 0..each {
            let task_id = id(&c.call_task("sleep", json!({"seconds": 0})).await);
            let result = c.ok("tasks/result", json!({"taskId": task_id})).await;
            assert_eq!(result["content"][0]["text"], "slept 0 s", "{result}");
        }
    });
    futures_util::future::join_all(clients).await;
}

/// Issue 26: adding worker processes adds no work to every task. A worker
/// process's change feed is woken only by cancellations and answers (and
/// catches up once a second), not by the other processes' creations and
/// completions: with 4 worker processes and 400 tasks from 16 clients, the
/// feed reads of all the workers (counted in their sqlx statement logs)
/// stay within 4 x (seconds of the run + 3). Before, each worker read the
/// feed after every commit of any process: hundreds per second. And the
/// claims and looks at the queue of all the workers stay within a bound
/// per task (below).
async fn worker_processes_read_the_feed_per_second_not_per_commit(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let workers: Vec<WorkerProc> = (0..4)
        .map(|n| {
            WorkerProc::start_logging(
                &server,
                n,
                &["--concurrency", "8"],
                "warn,sqlx::query=debug",
            )
        })
        .collect();
    let started = Instant::now();
    sleep_zero_tasks(&server, 16, 25).await;
    let seconds = started.elapsed().as_secs_f64();
    let mut reads = 0usize;
    let mut statements = 0usize;
    let mut claims = 0usize;
    let mut looks = 0usize;
    for w in &workers {
        let log = std::fs::read(&w.log).unwrap();
        let log = String::from_utf8_lossy(&log);
        reads += log.matches("FROM task_events e JOIN").count();
        for line in log.lines().filter(|l| l.contains("sqlx::query")) {
            statements += 1;
            if line.contains("WITH quota AS") {
                claims += 1;
            } else if line.contains("FROM jobs WHERE state = 'queued' AND run_after <=") {
                looks += 1;
            }
        }
    }
    let bound = (4.0 * (seconds + 3.0)) as usize;
    let per_task = |n: usize| n as f64 / 400.0;
    eprintln!(
        "{driver:?}: 400 tasks in {seconds:.1} s; the 4 workers read the feed {reads} times \
         (bound {bound}), ran {statements} statements ({:.2} per task), {claims} claims and \
         {looks} looks ({:.2} and {:.2} per task)",
        per_task(statements),
        per_task(claims),
        per_task(looks),
    );
    assert!(
        reads <= bound,
        "worker feeds read {reads} times in {seconds:.1} s (bound {bound})"
    );
    // The claim herd. A commit that queued jobs names as many live worker
    // processes as it takes to run them (by the room each reported), and
    // the others look only 50 ms after the last such signal if still idle.
    // On SQLite each claim costs a look and maybe a claim statement, and
    // the live workers are read once a second (the first second names
    // no one): at most 2 per task (measured 0.54-0.90; 0.7-1.0 when every
    // idle worker looked at once; every commit waking every worker,
    // completions too, would be about 2.7: 4 workers for each of about 2
    // commits per 3 tasks). On PostgreSQL: at most 1.1 per task (measured
    // 0.74-0.81; 1.22-1.45 when every idle worker claimed at once).
    let bound = match driver {
        Driver::Sqlite => 2.0,
        Driver::Postgres => 1.1,
    };
    assert!(
        per_task(claims + looks) <= bound,
        "{claims} claims and {looks} looks for 400 tasks: more than {bound} per task"
    );
}
both_drivers!(worker_processes_read_the_feed_per_second_not_per_commit);

/// 10 `sleep` 0.3 s tasks one after the other, each waited for in
/// tasks/result: how many times the server read a task by id meanwhile
/// (counted in its sqlx statement log).
async fn task_reads_while_waiting(server: &Server) -> usize {
    let reads = |log: &str| log.matches("FROM tasks_as_served WHERE task_id").count();
    let mut c = server.client().await;
    let before = reads(&server.log());
    for _ in 0..10 {
        let task_id = id(&c.call_task("sleep", json!({"seconds": 0.3})).await);
        let result = c.ok("tasks/result", json!({"taskId": task_id})).await;
        assert_eq!(result["content"][0]["text"], "slept 0.3 s", "{result}");
    }
    reads(&server.log()) - before
}

/// Issue 26: a client waiting in tasks/result for a task that ends later
/// gets the outcome with the word of its end: the server reads the task
/// once (when the wait starts), not again when the outcome is committed.
/// With the defaults (the pool in the server) the word is the writer's;
/// with a worker process it is the change feed's row, which carries a
/// small outcome. 10 tasks waited for: at most 12 reads of a task by id
/// (20 when the waiter read the row again).
async fn a_waiting_client_gets_the_outcome_without_a_second_read(driver: Driver) {
    let env = [("RUST_LOG", "info,sqlx::query=debug")];
    let server = Server::start_with_config_on_env(driver, "", &[], &env);
    let n = task_reads_while_waiting(&server).await;
    eprintln!("{driver:?}, defaults: 10 tasks waited for; the task read by id {n} times");
    assert!(n <= 12, "tasks read {n} times for 10 waits (defaults)");
    drop(server);

    let server = Server::start_with_config_on_env(driver, "", &["--workers", "0"], &env);
    let _worker = WorkerProc::start(&server, 0, &["--concurrency", "4"]);
    let n = task_reads_while_waiting(&server).await;
    eprintln!("{driver:?}, worker process: 10 tasks waited for; the task read by id {n} times");
    assert!(
        n <= 12,
        "tasks read {n} times for 10 waits (worker process)"
    );
}
both_drivers!(a_waiting_client_gets_the_outcome_without_a_second_read);

/// Issue 26: a worker process reports, soon after, that it filled up or
/// has room again (its `workers.jobs_running`, which claim signals name
/// processes by), not only at its periodic heartbeat. With a 600 s lease
/// the periodic heartbeat comes every 200 s; the process fills its 2 slots
/// with `sleep` tasks and the row says 2 within 30 s, then 1 once one of
/// them is cancelled (a look every 100 ms; a bound on a wait, not a speed:
/// without the report both would wait 200 s).
async fn a_worker_reports_at_once_that_it_filled_up_or_has_room(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let _worker = WorkerProc::start(&server, 0, &["--concurrency", "2", "--lease", "600"]);
    let db = server.db_reader().await;
    let reported = async |want: i64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let running: Vec<i64> = db
                .scalars(
                    "SELECT jobs_running FROM workers WHERE kind = 'process' AND state = 'live'",
                    &[],
                )
                .await;
            if running == [want] {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the worker reports {running:?} jobs running, not {want}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // Registered, idle.
    reported(0).await;
    let mut c = server.client().await;
    let first = id(&c.call_task("sleep", json!({"seconds": 120})).await);
    let _second = id(&c.call_task("sleep", json!({"seconds": 120})).await);
    reported(2).await;
    c.ok("tasks/cancel", json!({"taskId": first})).await;
    reported(1).await;
}
both_drivers!(a_worker_reports_at_once_that_it_filled_up_or_has_room);

/// Issue 26: a job waiting for its client's answer holds no slot, and the
/// room a worker process reports says so: a worker of concurrency 1 whose
/// one job asks a question (`approve`, input_required) reports 0 slots held
/// after it filled up (a heartbeat after the claim, with a 600 s lease: the
/// fullness reports), not 1 for as long as the person takes.
async fn a_worker_whose_jobs_wait_for_their_client_reports_room(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let _worker = WorkerProc::start(&server, 0, &["--concurrency", "1", "--lease", "600"]);
    let db = server.db_reader().await;
    let row = async || -> Option<(i64, i64)> {
        db.optional::<(i64, i64)>(
            "SELECT jobs_running, heartbeat_at FROM workers WHERE kind = 'process' AND state = 'live'",
            &[],
        )
        .await
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let registered = loop {
        if let Some((_, at)) = row().await {
            break at;
        }
        assert!(Instant::now() < deadline, "the worker never registered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut c = Client::new(&server.url);
    c.initialize_with(json!({"elicitation": {}})).await;
    let task = id(&c
        .call_task("approve", json!({"question": "Ship it?"}))
        .await);
    loop {
        let t = c.ok("tasks/get", json!({"taskId": task})).await;
        if t["status"] == "input_required" {
            break;
        }
        assert!(Instant::now() < deadline, "never input_required: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    loop {
        let (held, at) = row().await.unwrap();
        // A heartbeat a second or more after registering is a fullness
        // report (the periodic one comes at registering, then 200 s on).
        if at >= registered + 1000 && held == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker reports {held} slots held (heartbeat {at}, registered {registered})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
both_drivers!(a_worker_whose_jobs_wait_for_their_client_reports_room);

/// Issue 26: a job whose signal names a worker process that cannot claim
/// it is not stranded. Two worker processes; one is stopped (SIGSTOP: its
/// heartbeat stays fresh, so PostgreSQL keeps naming it for about half the
/// jobs); 20 tasks one after the other all complete, run by the other
/// worker, which looks shortly after a signal that named the stopped one.
async fn a_job_named_for_a_stopped_worker_is_claimed_by_another(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let stopped = WorkerProc::start(&server, 0, &["--concurrency", "4"]);
    let _running = WorkerProc::start(&server, 1, &["--concurrency", "4"]);
    // Both registered and idle.
    sleep_zero_tasks(&server, 2, 2).await;
    let pid = stopped.child.id().to_string();
    let signal = |sig: &str| {
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    // On SQLite, not in the middle of a write: a process stopped while it
    // holds the file's one write lock holds every other writer (SQLite's
    // rule, not the claim signal's), so it is let go and stopped again
    // until the lock is free.
    let mut attempts = 0;
    loop {
        signal("-STOP");
        if driver == Driver::Postgres || sqlite_write_lock_is_free(&server.db(), true).await {
            break;
        }
        signal("-CONT");
        attempts += 1;
        assert!(
            attempts < 100,
            "the worker held the write lock at each of 100 stops"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sleep_zero_tasks(&server, 1, 20).await;
    signal("-CONT");
}

/// Whether a write transaction on the SQLite file `db` can begin at once
/// (within 100 ms), as an operator's `BEGIN IMMEDIATE` would, and, with
/// `turn`, whether no taskbroker process holds its turn to write
/// (`<db>-writer`).
async fn sqlite_write_lock_is_free(db: &std::path::Path, turn: bool) -> bool {
    use sqlx::Connection;
    if turn {
        let mut path = db.as_os_str().to_owned();
        path.push("-writer");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("<db>-writer beside the database");
        if file.try_lock().is_err() {
            return false;
        }
        file.unlock().expect("unlock");
    }
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .busy_timeout(Duration::from_millis(100));
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .expect("the database file opens");
    let free = sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .is_ok();
    if free {
        sqlx::query("ROLLBACK")
            .execute(&mut conn)
            .await
            .expect("rollback of an empty transaction");
    }
    free
}
both_drivers!(a_job_named_for_a_stopped_worker_is_claimed_by_another);

/// Issue 26: progress that a worker process reports reaches the client
/// through the broker (a task of `sleep` 2 s streams progress 1 then 2 on
/// its tasks/result, before the result), and a PostgreSQL broker reads
/// `task_progress` only after a commit that added progress (its
/// notification says so), not after every status change the worker
/// processes commit: over 200 `sleep 0` tasks it reads progress at most 5
/// times (counted in its sqlx statement log). SQLite reads it at each
/// wake-up, as before.
async fn progress_of_a_worker_process_reaches_the_client_and_is_read_only_when_written(
    driver: Driver,
) {
    let server = Server::start_with_config_on_env(
        driver,
        "",
        &["--workers", "0"],
        &[("RUST_LOG", "info,sqlx::query=debug")],
    );
    let _workers: Vec<WorkerProc> = (0..2)
        .map(|n| WorkerProc::start(&server, n, &["--concurrency", "8"]))
        .collect();
    let progress_reads = |log: &str| statements_with(log, PROGRESS_READ);
    let before = progress_reads(&server.log());
    sleep_zero_tasks(&server, 8, 25).await;
    let reads = progress_reads(&server.log()) - before;
    eprintln!("{driver:?}: 200 tasks without progress; the broker read progress {reads} times");
    if driver == Driver::Postgres {
        assert!(
            reads <= 5,
            "progress read {reads} times for 200 tasks that reported none"
        );
    }

    let mut c = server.client().await;
    let task = c
        .ok(
            "tools/call",
            json!({"name": "sleep", "arguments": {"seconds": 2}, "task": {},
                   "_meta": {"progressToken": "w-1"}}),
        )
        .await;
    let task_id = id(&task["task"]);
    let messages = c
        .request_messages("tasks/result", json!({"taskId": task_id}))
        .await;
    let progress: Vec<f64> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            assert_eq!(m["params"]["progressToken"], "w-1", "{m}");
            m["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    assert_eq!(progress, [1.0, 2.0], "{messages:?}");
    let last = messages.last().unwrap();
    assert_eq!(last["result"]["content"][0]["text"], "slept 2 s", "{last}");
}
both_drivers!(progress_of_a_worker_process_reaches_the_client_and_is_read_only_when_written);

/// The text of a read of one task by id (`tasks/get`, the first look of
/// `tasks/result`).
const TASK_READ: &str = "FROM tasks_as_served WHERE task_id";

/// Issue 26: a broker that created a task with a job due now knows the
/// task as created, or as it ended, until it sees another change of it,
/// so the first look of the task's `tasks/result` reads nothing. Whoever
/// runs the job: the broker's own pool (handed the job in the creating
/// commit, as `serve` does by default), or worker processes (whose claim
/// and end the broker's feed reads at once for a task it keeps). Over 200
/// `sleep 0` tasks from 8 clients the broker reads at most 40 tasks by id
/// (counted in its sqlx statement log; 200 before, one per `tasks/result`;
/// 0 to 14 seen here with its own pool), and every result is right; on
/// PostgreSQL the creation's own notice does not wake its feed. A task
/// cancelled before its `tasks/result` is asked for is answered as
/// cancelled (a row kept from its creation would make that call wait for
/// the task's ttl).
async fn tasks_result_of_a_task_created_here_reads_no_task(driver: Driver) {
    let server = Server::start_with_config_on_env(
        driver,
        "",
        &[],
        &[("RUST_LOG", "info,sqlx::query=debug")],
    );
    let reads = |log: &str| statements_with(log, TASK_READ);
    let before = reads(&server.log());
    sleep_zero_tasks(&server, 8, 25).await;
    let read = reads(&server.log()) - before;
    assert!(
        read <= 40,
        "{driver:?}: {read} reads of a task by id for 200 tasks"
    );

    let mut c = server.client().await;
    for _ in 0..5 {
        let task_id = id(&c.call_task("sleep", json!({"seconds": 30})).await);
        let cancelled = c.ok("tasks/cancel", json!({"taskId": task_id})).await;
        assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
        // A bound on a wait that must not happen (the sleep lasts 30 s).
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            c.request("tasks/result", json!({"taskId": task_id})),
        )
        .await
        .expect("tasks/result of a cancelled task answers");
        assert_eq!(answer["error"]["data"]["status"], "cancelled", "{answer}");
    }
    drop(server);

    let server = Server::start_with_config_on_env(
        driver,
        "",
        &["--workers", "0"],
        &[("RUST_LOG", "info,sqlx::query=debug")],
    );
    let _workers = [0, 1].map(|i| WorkerProc::start(&server, i, &["--concurrency", "4"]));
    let feed_reads = |log: &str| statements_with(log, FEED_READ);
    let (before, feed_before) = (reads(&server.log()), feed_reads(&server.log()));
    let started = Instant::now();
    sleep_zero_tasks(&server, 8, 25).await;
    let read = reads(&server.log()) - before;
    let feed_read = feed_reads(&server.log()) - feed_before;
    eprintln!(
        "{driver:?}, 2 worker processes: {read} reads of a task by id, {feed_read} feed reads \
         for 200 tasks"
    );
    assert!(
        read <= 40,
        "{driver:?}: {read} reads of a task by id for 200 tasks run by worker processes"
    );
    // PostgreSQL's notices name the task: a kept task's changes by the
    // workers are read at once, but not its creation's own notice (106-113
    // feed reads seen here; 165-179 when the creation's notice woke the
    // feed too). SQLite's feed reads on every commit's poke, whatever it
    // names.
    // Plus one catch-up read a second.
    if driver == Driver::Postgres {
        let bound = 150 + started.elapsed().as_secs() as usize;
        assert!(
            feed_read <= bound,
            "{feed_read} feed reads for 200 tasks (bound {bound}): a creation's own notice \
             wakes the feed"
        );
    }
}
both_drivers!(tasks_result_of_a_task_created_here_reads_no_task);

/// Issue 26: a PostgreSQL broker reads its change feed once per commit
/// that notified, its own commits included, and not a second time after
/// its own (its listener hears them as it hears the others'). One client
/// runs 50 `sleep 0` tasks one after the other on a worker process: each
/// task is two commits of status history (the broker's creation, the
/// worker's completion), so at most 2 reads per task and a few more (the
/// listener's reconnections, the catch-up ticks after a missed
/// notification); kicking the tailer after its own creation too read about
/// 3 per task. (SQLite has no notifications: its broker reads after its
/// own commits and when the file says another process wrote.)
#[tokio::test]
async fn postgres_broker_reads_its_feed_once_per_commit() {
    if !common::pg::available() {
        return;
    }
    let server = Server::start_with_config_on_env(
        Driver::Postgres,
        "",
        &["--workers", "0"],
        &[("RUST_LOG", "info,sqlx::query=debug")],
    );
    let _worker = WorkerProc::start(&server, 0, &["--concurrency", "8"]);
    let feed_reads = |log: &str| statements_with(log, FEED_READ);
    // The worker is up and the first task done before counting.
    sleep_zero_tasks(&server, 1, 1).await;
    let before = feed_reads(&server.log());
    sleep_zero_tasks(&server, 1, 50).await;
    let reads = feed_reads(&server.log()) - before;
    eprintln!("50 tasks one after the other; the broker read its feed {reads} times");
    assert!(
        reads <= 2 * 50 + 10,
        "the feed read {reads} times for 50 tasks of 2 commits each"
    );
}

/// Issue 26: a broker is woken to read its feed by the changes its own
/// clients wait for, not by every commit of the tasks other brokers serve.
/// Two brokers on one PostgreSQL database and a worker process; a client
/// runs 40 tasks one after the other through A, whose log counts nothing
/// here. B, with no client of its own, catches up on them about once a
/// second: its feed reads (counted in its sqlx log) stay within the
/// seconds of the run + 3 (before: one read per commit, 80 for 40 tasks).
/// Then the same client holds a GET stream on B (its session's owner is
/// followed there): B reads at once again, at least once per task, and
/// the stream gets each task's status notifications (T-31); and so does
/// a console stream of every change open on B.
#[tokio::test]
async fn a_broker_reads_its_feed_for_its_own_clients_not_for_another_brokers() {
    if !common::pg::available() {
        return;
    }
    let (a, b, _worker) = two_brokers_and_a_worker();
    let feed_reads = |log: &str| statements_with(log, FEED_READ);
    async fn run(c: &mut Client) -> String {
        let task_id = id(&c.call_task("sleep", json!({"seconds": 0})).await);
        let result = c.ok("tasks/result", json!({"taskId": task_id})).await;
        assert_eq!(result["content"][0]["text"], "slept 0 s", "{result}");
        task_id
    }
    let mut c = a.client().await;
    // The worker is up and the first task done before counting.
    run(&mut c).await;
    let before = feed_reads(&b.log());
    let started = Instant::now();
    for _ in 0..40 {
        run(&mut c).await;
    }
    let seconds = started.elapsed().as_secs();
    let reads = feed_reads(&b.log()) - before;
    eprintln!("40 tasks through A in {seconds} s; B read its feed {reads} times");
    assert!(
        reads as u64 <= seconds + 3,
        "B, with no client of its own, read its feed {reads} times in {seconds} s for 40 tasks of A's"
    );

    // A GET stream of the client's session, held on B.
    let on_b = in_session_of(&c, &b.url);
    let mut h = on_b.headers();
    h.insert(
        "accept",
        reqwest::header::HeaderValue::from_static("text/event-stream"),
    );
    let r = on_b.http.get(&on_b.url).headers(h).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut get = SseReader::new(r);
    get.next_event().await.unwrap(); // priming: the stream is open
    let before = feed_reads(&b.log());
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(run(&mut c).await);
    }
    for task_id in &ids {
        loop {
            let (_, m) = tokio::time::timeout(Duration::from_secs(30), get.next_message())
                .await
                .unwrap_or_else(|_| panic!("no completed notification on B for {task_id}"))
                .expect("the GET stream stays open");
            assert_eq!(m["method"], "notifications/tasks/status", "{m}");
            if m["params"]["taskId"] == json!(task_id) && m["params"]["status"] == "completed" {
                break;
            }
        }
    }
    let reads = feed_reads(&b.log()) - before;
    eprintln!("10 tasks with a GET stream of their owner on B; B read its feed {reads} times");
    assert!(
        reads >= 10,
        "B read its feed {reads} times for 10 tasks of an owner it follows"
    );
    drop(get);

    // The console's stream of every change, open on B (loopback, no
    // tokens): B reads at once for every task again, and shows each end.
    // A new session's tasks, so that no GET stream B may still hold
    // follows their owner.
    let mut c = a.client().await;
    let events_url = b.url.replace("/mcp", "/ui/api/events");
    let r = reqwest::get(&events_url).await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{events_url}");
    let mut console = SseReader::new(r);
    let before = feed_reads(&b.log());
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(run(&mut c).await);
    }
    let mut ended = HashSet::new();
    while !ids.iter().all(|id| ended.contains(id)) {
        let event = tokio::time::timeout(Duration::from_secs(30), console.next_event())
            .await
            .unwrap_or_else(|_| panic!("the console on B did not show every end: {ended:?}"))
            .expect("the console stream stays open");
        let Ok(changes) = serde_json::from_str::<Value>(&event.data) else {
            continue; // a keep-alive
        };
        for change in changes["status"].as_array().into_iter().flatten() {
            if change["to"] == "completed" {
                ended.insert(id(change));
            }
        }
    }
    let reads = feed_reads(&b.log()) - before;
    eprintln!("10 tasks with a console stream open on B; B read its feed {reads} times");
    assert!(
        reads >= 10,
        "B read its feed {reads} times for 10 tasks while its console follows every change"
    );
}

/// Issue 26: progress, like status changes, makes a broker read only for
/// the tasks its own clients wait on. Two brokers on one PostgreSQL
/// database and a worker process; through A, 8 tasks that report progress
/// (`sleep 2`: at 1 and 2 s, each under a progress token) run at once,
/// started a quarter of a second apart so that their reports commit
/// apart: B, with no client of its own, reads no progress (counted in its
/// sqlx log; before: a read per progress commit, 16 here). Then a client
/// of the same session waits on B for a task created on A: B reads its
/// progress and streams it before the result, under the original
/// progress token (T-32, H-11).
#[tokio::test]
async fn a_broker_reads_progress_only_for_its_own_clients() {
    if !common::pg::available() {
        return;
    }
    let (a, b, _worker) = two_brokers_and_a_worker();
    let progress_reads = |log: &str| statements_with(log, PROGRESS_READ);
    async fn start(c: &mut Client, token: &str) -> String {
        let created = c
            .ok(
                "tools/call",
                json!({"name": "sleep", "arguments": {"seconds": 2}, "task": {},
                       "_meta": {"progressToken": token}}),
            )
            .await;
        id(&created["task"])
    }
    let mut c = a.client().await;
    // The worker is up before counting.
    let first = start(&mut c, "warm-up").await;
    c.ok("tasks/result", json!({"taskId": first})).await;

    let before = progress_reads(&b.log());
    let mut waits = Vec::new();
    for n in 0..8 {
        let task_id = start(&mut c, &format!("a-{n}")).await;
        // Each waits on A from its start, as its client would.
        let mut waiter = in_session_of(&c, &a.url);
        waits.push(tokio::spawn(async move {
            waiter
                .request_messages("tasks/result", json!({"taskId": task_id}))
                .await
        }));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for wait in waits {
        let messages = wait.await.unwrap();
        let reports = messages
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .count();
        assert_eq!(reports, 2, "A streams its client's progress: {messages:?}");
    }
    let reads = progress_reads(&b.log()) - before;
    eprintln!("8 tasks through A reported progress 16 times; B read progress {reads} times");
    assert!(
        reads <= 2,
        "B, with no client of its own, read progress {reads} times for 16 reports of A's tasks"
    );

    // The same session waits on B for a task created on A.
    let task_id = start(&mut c, "on-b").await;
    let mut on_b = in_session_of(&c, &b.url);
    let before = progress_reads(&b.log());
    let messages = on_b
        .request_messages("tasks/result", json!({"taskId": task_id}))
        .await;
    let progress: Vec<f64> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            assert_eq!(m["params"]["progressToken"], "on-b", "{m}");
            m["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    assert_eq!(progress, [1.0, 2.0], "{messages:?}");
    let last = messages.last().unwrap();
    assert_eq!(last["result"]["content"][0]["text"], "slept 2 s", "{last}");
    let reads = progress_reads(&b.log()) - before;
    eprintln!("a task awaited on B: B read progress {reads} times");
    assert!(reads >= 1, "B streamed progress it never read");
}

/// Issue 23: brokers, workers and `taskbroker migrate` started at once on a
/// new database all come up: the loser of a migration race retries until
/// the winner is done, and a worker that finds no schema yet (or one being
/// migrated) waits for it instead of exiting. SQLite: one broker, one
/// `migrate`, two workers; PostgreSQL: two brokers, two workers. Workers
/// go first in every other round.
async fn processes_started_at_once_on_a_new_database_all_come_up(driver: Driver) {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Stdio};
    let bin = env!("CARGO_BIN_EXE_taskbroker");
    for round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let pg = match driver {
            Driver::Postgres => Some(common::pg::PgDb::create().unwrap()),
            Driver::Sqlite => None,
        };
        let db = match &pg {
            Some(pg) => pg.url.clone(),
            None => dir.path().join("broker.db").display().to_string(),
        };
        let spawn = |args: &[&str], name: &str| -> Child {
            let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
            Command::new(bin)
                .args(args)
                .env("RUST_LOG", "info,sqlx=warn")
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap()
        };
        let brokers_args = ["serve", "--db", &db, "--listen", "127.0.0.1:0"];
        let worker_args = ["worker", "--db", &db];
        let mut workers = Vec::new();
        let mut others = Vec::new();
        // Killed even when an assertion below fails.
        let mut guard = KillOnDrop(Vec::new());
        let second = if driver == Driver::Postgres {
            brokers_args.to_vec()
        } else {
            vec!["migrate", "--db", &db]
        };
        if round % 2 == 1 {
            workers.push(spawn(&worker_args, "worker-0"));
            workers.push(spawn(&worker_args, "worker-1"));
        }
        others.push(("broker-0", spawn(&brokers_args, "broker-0")));
        others.push(("second", spawn(&second, "second")));
        if round % 2 == 0 {
            workers.push(spawn(&worker_args, "worker-0"));
            workers.push(spawn(&worker_args, "worker-1"));
        }
        guard.0.extend(workers.iter().map(Child::id));
        guard.0.extend(others.iter().map(|(_, c)| c.id()));
        let log = |name: &str| {
            std::fs::read_to_string(dir.path().join(format!("{name}.log"))).unwrap_or_default()
        };
        // Brokers say where they listen; `migrate` exits 0.
        for (name, child) in &mut others {
            let mut line = String::new();
            let stdout = child.stdout.take().unwrap();
            let read = std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                line
            });
            line.push_str(&read.join().unwrap());
            if *name == "second" && driver == Driver::Sqlite {
                let status = child.wait().unwrap();
                assert!(
                    status.success(),
                    "round {round}: migrate: {line} {}",
                    log(name)
                );
            } else {
                assert!(
                    line.starts_with("taskbroker listening on "),
                    "round {round}: {name}: {line:?}\n{}",
                    log(name)
                );
            }
        }
        // Every worker registers live and keeps running.
        let pids: Vec<i64> = workers.iter().map(|w| i64::from(w.id())).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let live = match &pg {
                Some(pg) => {
                    let pool = sqlx::PgPool::connect(&pg.url).await.unwrap();
                    // Before the schema exists the view does not: none live.
                    let n: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM v_workers WHERE state = 'live' AND pid = ANY($1)",
                    )
                    .bind(&pids)
                    .fetch_one(&pool)
                    .await
                    .unwrap_or(0);
                    pool.close().await;
                    n
                }
                None => match sqlx::SqlitePool::connect_with(
                    sqlx::sqlite::SqliteConnectOptions::new()
                        .filename(dir.path().join("broker.db"))
                        .read_only(true),
                )
                .await
                {
                    // Before the file and the schema exist: none live.
                    Err(_) => 0,
                    Ok(pool) => {
                        let n: i64 = sqlx::query_scalar(
                            "SELECT COUNT(*) FROM v_workers WHERE state = 'live' AND pid IN (?, ?)",
                        )
                        .bind(pids[0])
                        .bind(pids[1])
                        .fetch_one(&pool)
                        .await
                        .unwrap_or(0);
                        pool.close().await;
                        n
                    }
                },
            };
            if live == 2 {
                break;
            }
            for (i, w) in workers.iter_mut().enumerate() {
                let name = format!("worker-{i}");
                assert!(
                    w.try_wait().unwrap().is_none(),
                    "round {round}: {name} exited:\n{}",
                    log(&name)
                );
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {live} of 2 workers live"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for mut child in workers
            .into_iter()
            .chain(others.into_iter().map(|(_, c)| c))
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

both_drivers!(processes_started_at_once_on_a_new_database_all_come_up);

/// Processes SIGKILLed when dropped (a failed assertion leaves none behind).
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    }
}

/// Claims read the partial index on queued jobs, so finished rows cost
/// nothing. (SQLite only: it reads SQLite's EXPLAIN QUERY PLAN.)
#[tokio::test]
async fn claim_query_uses_the_partial_index_on_queued_jobs() {
    let server = Server::start(&["--workers", "0"]);
    let db = server.read_db().await;
    let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(
        "EXPLAIN QUERY PLAN SELECT task_seq FROM jobs WHERE state = 'queued' AND run_after <= 0 ORDER BY priority DESC, turn, task_seq LIMIT 8",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    let text: Vec<&str> = plan.iter().map(|r| r.3.as_str()).collect();
    assert!(text.iter().any(|d| d.contains("jobs_queued")), "{text:?}");
    assert!(
        !text.iter().any(|d| d.contains("TEMP B-TREE")),
        "no sort: {text:?}"
    );
}

/// Worker processes and the server wake each other through wake files
/// (T-31 latency; see README "Operations"): `<db>-wake` (changes),
/// `<db>-queue` (claimable jobs), `<db>-control` (cancels, answers) sit
/// beside the database, and however many commits poke them, each stays one
/// byte. (SQLite only: PostgreSQL signals by LISTEN/NOTIFY.)
#[tokio::test]
async fn wake_file_beside_the_database_stays_one_byte() {
    let server = Server::start(&["--workers", "0"]);
    let _w = WorkerProc::start(&server, 0, &[]);
    let mut c = server.client().await;
    for _ in 0..20 {
        let task_id = id(&c.call_task("sleep", json!({"seconds": 0})).await);
        let result = c.ok("tasks/result", json!({"taskId": task_id})).await;
        assert_eq!(result["content"][0]["text"], "slept 0 s", "{result}");
    }
    // A cancel pokes the control file.
    let task_id = id(&c.call_task("sleep", json!({"seconds": 30})).await);
    let cancelled = c.ok("tasks/cancel", json!({"taskId": task_id})).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    for suffix in ["-wake", "-queue", "-control"] {
        let mut wake = server.db().into_os_string();
        wake.push(suffix);
        let meta = std::fs::metadata(&wake).unwrap_or_else(|e| panic!("{suffix}: {e}"));
        assert_eq!(meta.len(), 1, "the {suffix} file never grows");
    }
}

/// A `sleep 0` task called as a task, and its tasks/result.
async fn sleep_zero_result(c: &mut Client) -> Value {
    let task_id = id(&c.call_task("sleep", json!({"seconds": 0})).await);
    c.ok("tasks/result", json!({"taskId": task_id})).await
}

/// The file beside a SQLite database that gives processes their turns at
/// the write lock.
fn write_lock_file(server: &Server) -> std::fs::File {
    let mut path = server.db().into_os_string();
    path.push("-writer");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("the broker made <db>-writer beside the database")
}

/// Issue 26: on SQLite a process writes only in its turn, taken on the
/// file `<db>-writer` beside the database (an exclusive `flock`), so
/// processes waiting to write are woken the moment the holder lets go
/// instead of sleeping in SQLite's busy retries. Here the test process
/// holds the turn: a creation waits for it (no answer in a second, though
/// SQLite's own lock is free), then is answered once the turn is let go.
#[tokio::test]
async fn a_sqlite_write_waits_for_another_processes_turn_and_goes_on_when_it_ends() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let lock = write_lock_file(&server);
    lock.lock().expect("the turn is free while nothing writes");
    assert!(
        sqlite_write_lock_is_free(&server.db(), false).await,
        "the turn is a file of its own: SQLite's lock stays free"
    );
    let call = sleep_zero_result(&mut c);
    tokio::pin!(call);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut call)
            .await
            .is_err(),
        "the creation waited for the turn held by another process"
    );
    lock.unlock().expect("unlock");
    let result = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("answered once the turn was let go");
    assert_eq!(result["content"][0]["text"], "slept 0 s", "{result}");
    assert!(
        !server.log().contains("writing without it"),
        "no write gave up on its turn"
    );
}

/// Issue 26: a process frozen while it holds its turn at the write lock
/// (here the test process, which never lets go) delays the others' writes
/// by the busy timeout (10 s) once, then they write without turns (SQLite's
/// own lock still keeps them apart), with one warning in the log; once the
/// holder lets go, turns are taken again: a write waits for a new holder.
#[tokio::test]
async fn a_frozen_holder_of_the_write_turn_delays_sqlite_writes_once_by_the_busy_timeout() {
    let server = Server::start(&[]);
    let mut c = server.client().await;
    let lock = write_lock_file(&server);
    lock.lock().expect("the turn is free while nothing writes");
    for _ in 0..2 {
        let task_id = id(&c.call_task("sleep", json!({"seconds": 0})).await);
        let result = c.ok("tasks/result", json!({"taskId": task_id})).await;
        assert_eq!(result["content"][0]["text"], "slept 0 s", "{result}");
    }
    let log = server.log();
    assert_eq!(
        log.matches("writing without it").count(),
        1,
        "one write waited out the bound, the next went on at once: {log}"
    );
    lock.unlock().expect("unlock");
    // The abandoned wait takes the turn as soon as it is free, and lets it
    // go at once; until then this process writes without turns. Then a
    // write waits for a new holder again.
    let mut waited = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if lock.try_lock().is_err() {
            continue;
        }
        let call = sleep_zero_result(&mut c);
        tokio::pin!(call);
        waited = tokio::time::timeout(Duration::from_secs(1), &mut call)
            .await
            .is_err();
        lock.unlock().expect("unlock");
        let result = tokio::time::timeout(Duration::from_secs(30), call)
            .await
            .expect("answered once the turn was let go");
        assert_eq!(result["content"][0]["text"], "slept 0 s", "{result}");
        if waited {
            break;
        }
    }
    assert!(waited, "turns are taken again after the holder let go");
    let log = server.log();
    assert_eq!(
        log.matches("writing without it").count(),
        1,
        "no other write gave up on its turn: {log}"
    );
}

/// Issue 26: a process whose wait for the write turn outlived its bound
/// (here the test process holds the turn throughout) still stops at once on
/// SIGTERM: the abandoned wait's thread, still blocked on the file, does
/// not hold the process's shutdown.
#[tokio::test]
async fn a_broker_that_gave_up_on_its_write_turn_still_stops_on_sigterm() {
    let mut server = Server::start(&[]);
    let mut c = server.client().await;
    let lock = write_lock_file(&server);
    lock.lock().expect("the turn is free while nothing writes");
    let task_id = id(&c.call_task("sleep", json!({"seconds": 0})).await);
    let result = c.ok("tasks/result", json!({"taskId": task_id})).await;
    assert_eq!(result["content"][0]["text"], "slept 0 s", "{result}");
    assert!(server.log().contains("writing without it"));
    let pid = server.child().id();
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child().try_wait().expect("try_wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    lock.unlock().expect("unlock");
    let status = status.expect("the broker stopped while another process held the turn");
    assert!(status.success(), "a graceful stop: {status:?}");
}
