//! Issue 17 (operations): the operator commands that read the database
//! directly, `taskbroker stats`, `taskbroker workers`, `taskbroker tasks
//! list --db` and `taskbroker backup`, through the real binary against
//! real databases of both drivers, after a known workload run through a
//! real `taskbroker serve` and `taskbroker worker` processes; and the plans
//! of the stats queries (index searches, never a scan of `tasks` or
//! `jobs`).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Client, Driver, Server, WorkerProc};
use serde_json::{Value, json};
use taskbroker::store::{self, Durability};

/// `taskbroker ARGS`: exit code, stdout, stderr. TASKBROKER_DB is cleared
/// so that only `--db` names the database.
fn taskbroker(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(args)
        .env_remove("TASKBROKER_DB")
        .env_remove("TASKBROKER_URL")
        .env(
            "XDG_STATE_HOME",
            std::env::temp_dir().join("taskbroker-ops-test-state"),
        )
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `taskbroker ARGS` that must succeed, with its stdout parsed as JSON.
#[track_caller]
fn json_of(args: &[&str]) -> Value {
    let (code, out, err) = taskbroker(args);
    assert_eq!(code, 0, "taskbroker {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

/// The task ids of a `tasks list --db --json` answer, in order.
fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|t| t["taskId"].as_str().unwrap().to_owned())
        .collect()
}

/// Wait until `done` holds (polling), or fail saying `what`.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 17: stats, workers and tasks list --db on both drivers after a
/// known workload: 3 completed `sleep` and 2 failed `fail` tasks (run by a
/// worker process that then stopped), one `sleep` running in a second
/// worker (concurrency 1) and 3 tasks queued behind it (`serve --workers
/// 0`). Every number, filter and page is checked exactly.
async fn issue17_stats_workers_and_tasks_list_after_a_known_workload(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    let db = server.db_arg();
    let mut a = server.client().await;
    let mut b = server.client().await;

    // Finished: 3 completed, 2 failed, by client A.
    let mut finished = Vec::new();
    for _ in 0..3 {
        finished.push(a.call_task("sleep", json!({ "seconds": 0 })).await);
    }
    for n in 1..=2 {
        finished.push(
            a.call_task("fail", json!({ "message": format!("boom {n}") }))
                .await,
        );
    }
    let mut first = WorkerProc::start(&server, 1, &["--concurrency", "4"]);
    let mut a_ids = Vec::new();
    for task in &finished {
        let id = task["taskId"].as_str().unwrap().to_owned();
        a.wait_terminal(&id, Duration::from_secs(60)).await;
        a_ids.push(id);
    }
    first.term();
    first.child.wait().unwrap();

    // One running in a worker of concurrency 1, then 3 queued behind it.
    let long = b.call_task("sleep", json!({ "seconds": 120 })).await;
    let long_id = long["taskId"].as_str().unwrap().to_owned();
    let second = WorkerProc::start(&server, 2, &["--concurrency", "1"]);
    until("the long sleep to run", || {
        let stats = json_of(&["stats", "--db", &db, "--json"]);
        stats["runningJobs"] == 1
    })
    .await;
    let mut b_ids = vec![long_id.clone()];
    for args in [
        ("sleep", json!({ "seconds": 0 })),
        ("sleep", json!({ "seconds": 0 })),
        ("fail", json!({ "message": "never runs" })),
    ] {
        let task = b.call_task(args.0, args.1).await;
        b_ids.push(task["taskId"].as_str().unwrap().to_owned());
    }

    // stats --json: every number.
    let stats = json_of(&["stats", "--db", &db, "--json"]);
    assert_eq!(stats["queueDepth"], 3, "{stats:#}");
    let queued: BTreeMap<&str, i64> = stats["queued"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| (q["tool"].as_str().unwrap(), q["jobs"].as_i64().unwrap()))
        .collect();
    assert_eq!(queued, BTreeMap::from([("fail", 1), ("sleep", 2)]));
    for q in stats["queued"].as_array().unwrap() {
        let age = q["oldestAgeMs"].as_i64().unwrap();
        assert!((0..60_000).contains(&age), "{q}");
    }
    assert_eq!(stats["runningJobs"], 1);
    assert_eq!(stats["running"], json!([{ "tool": "sleep", "jobs": 1 }]));
    assert_eq!(
        stats["openTasks"],
        json!({ "working": 4, "input_required": 0 })
    );
    assert_eq!(
        stats["finished"]["lastHour"],
        json!({ "completed": 3, "failed": 2, "cancelled": 0 })
    );
    assert_eq!(
        stats["finished"]["lastMinute"],
        json!({ "completed": 3, "failed": 2, "cancelled": 0 })
    );
    assert_eq!(stats["perMinute"]["lastMinute"]["completed"], 3.0);
    assert_eq!(stats["perMinute"]["lastHour"]["failed"], 0.03);
    let failures = stats["failuresLastHour"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{stats:#}");
    assert_eq!(failures[0]["tool"], "fail");
    assert_eq!(failures[0]["failed"], 2);
    let message = failures[0]["lastMessage"].as_str().unwrap();
    assert!(message.contains("boom 2"), "the latest failure: {message}");

    // stats: the tables.
    let (code, text, err) = taskbroker(&["stats", "--db", &db]);
    assert_eq!(code, 0, "{err}");
    assert!(text.starts_with("queued jobs: 3\n"), "{text}");
    assert!(text.contains("running jobs: 1\n"), "{text}");
    assert!(text.contains("failures in the last hour: 2\n"), "{text}");
    let working = text.lines().find(|l| l.trim_start().starts_with("working"));
    assert_eq!(
        working.map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["working", "4"])
    );
    let completed = text
        .lines()
        .find(|l| l.trim_start().starts_with("completed"));
    assert_eq!(
        completed.map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["completed", "3", "3", "0.05"])
    );

    // workers: the live one runs the long sleep; the stopped one shows
    // with --all.
    let live = json_of(&["workers", "--db", &db, "--json"]);
    let by_pid = |list: &Value, pid: i32| -> Option<Value> {
        list.as_array()
            .unwrap()
            .iter()
            .find(|w| w["pid"] == pid)
            .cloned()
    };
    let w2 = by_pid(&live, second.pid()).expect("the live worker is listed");
    assert_eq!(w2["kind"], "process");
    assert_eq!(w2["state"], "live");
    assert_eq!(w2["jobsRunning"], 1);
    assert_eq!(w2["concurrency"], 1);
    assert!(w2["heartbeatAgeMs"].as_i64().unwrap() < 30_000, "{w2}");
    assert!(
        by_pid(&live, first.pid()).is_none(),
        "a stopped pool is hidden without --all: {live:#}"
    );
    let all = json_of(&["workers", "--db", &db, "--json", "--all"]);
    let w1 = by_pid(&all, first.pid()).expect("--all lists the stopped pool");
    assert_eq!(w1["state"], "stopped");
    assert_eq!(w1["jobsRunning"], 0);
    let (code, table, _) = taskbroker(&["workers", "--db", &db]);
    assert_eq!(code, 0);
    let line = table
        .lines()
        .find(|l| l.contains(w2["workerId"].as_str().unwrap()))
        .unwrap();
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[1..3], ["process", "live"], "{line}");
    assert_eq!(cells[4], second.pid().to_string(), "{line}");

    // tasks list --db: every owner's tasks, newest first, with filters.
    let every = json_of(&["tasks", "list", "--db", &db, "--json"]);
    let mut expected: Vec<String> = a_ids.iter().chain(&b_ids).cloned().collect();
    expected.reverse();
    assert_eq!(ids(&every), expected);
    let newest = &every[0];
    assert_eq!(newest["status"], "working");
    assert_eq!(newest["tool"], "fail");
    assert!(
        newest["statusMessage"]
            .as_str()
            .unwrap()
            .starts_with("queued")
    );
    for field in ["createdAt", "lastUpdatedAt", "owner"] {
        assert!(newest[field].is_string(), "{field}: {newest}");
    }
    let failed = json_of(&["tasks", "list", "--db", &db, "--json", "--status", "failed"]);
    assert_eq!(ids(&failed), vec![a_ids[4].clone(), a_ids[3].clone()]);
    let ended = json_of(&[
        "tasks",
        "list",
        "--db",
        &db,
        "--json",
        "--status",
        "failed,completed",
    ]);
    let ended_too = json_of(&[
        "tasks",
        "list",
        "--db",
        &db,
        "--json",
        "--status",
        "failed",
        "--status",
        "completed",
    ]);
    assert_eq!(ids(&ended).len(), 5);
    assert_eq!(ids(&ended), ids(&ended_too));
    let sleeps = json_of(&["tasks", "list", "--db", &db, "--json", "--tool", "sleep"]);
    assert_eq!(ids(&sleeps).len(), 6);
    let owner_b = every
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["taskId"] == long_id.as_str())
        .unwrap()["owner"]
        .as_str()
        .unwrap()
        .to_owned();
    let of_b = json_of(&["tasks", "list", "--db", &db, "--json", "--owner", &owner_b]);
    let mut b_newest_first = b_ids.clone();
    b_newest_first.reverse();
    assert_eq!(ids(&of_b), b_newest_first);
    let queued_sleeps_of_b = json_of(&[
        "tasks", "list", "--db", &db, "--json", "--owner", &owner_b, "--tool", "sleep", "--status",
        "working",
    ]);
    assert_eq!(ids(&queued_sleeps_of_b).len(), 3);

    // Keyset paging: pages of 2 follow the cursor to the end; every task
    // once.
    let mut paged = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let mut args = vec!["tasks", "list", "--db", &db, "--json", "--limit", "2"];
        if let Some(cursor) = &before {
            args.extend(["--before", cursor]);
        }
        let (code, out, err) = taskbroker(&args);
        assert_eq!(code, 0, "{err}");
        let page: Value = serde_json::from_str(&out).unwrap();
        assert!(ids(&page).len() <= 2);
        paged.extend(ids(&page));
        match err.split("--before ").nth(1) {
            Some(rest) => before = Some(rest.split_whitespace().next().unwrap().to_owned()),
            None => break,
        }
    }
    assert_eq!(paged, expected);
    let whole = json_of(&[
        "tasks", "list", "--db", &db, "--json", "--limit", "2", "--all",
    ]);
    assert_eq!(ids(&whole), expected);
    let (code, lines, _) = taskbroker(&["tasks", "list", "--db", &db, "--status", "failed"]);
    assert_eq!(code, 0);
    assert_eq!(lines.lines().count(), 3, "a header and two tasks: {lines}");
    assert!(lines.lines().nth(1).unwrap().starts_with(&a_ids[4]));

    drop(second);
}
both_drivers!(issue17_stats_workers_and_tasks_list_after_a_known_workload; flavor = "multi_thread", worker_threads = 2);

/// Issue 17: the operator commands refuse clearly, with exit codes like the
/// rest of the CLI: a missing database is an error (and is not created), a
/// bad status or an operator flag without --db is a usage error.
#[test]
fn issue17_operator_commands_refuse_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    let missing = missing.to_str().unwrap();
    for args in [
        vec!["stats", "--db", missing],
        vec!["workers", "--db", missing],
        vec!["tasks", "list", "--db", missing],
        vec!["backup", "--db", missing, "--to", "copy.db"],
    ] {
        let (code, _, err) = taskbroker(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains("does not exist"), "{args:?}: {err}");
        assert!(
            !Path::new(missing).exists(),
            "{args:?} created the database"
        );
    }
    let (code, _, err) = taskbroker(&["tasks", "list", "--status", "failed"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--db"), "{err}");
    let (code, _, err) = taskbroker(&["tasks", "list", "--db", missing, "--status", "done"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown task status 'done'"), "{err}");
}

/// Issue 17: the plans of the stats queries search indexes: on SQLite no
/// `SCAN tasks` or `SCAN jobs` without an index; on PostgreSQL (sequential
/// scans off, as the planner would choose with a million rows) no `Seq
/// Scan` on either, and the index each query is written for.
async fn issue17_stats_queries_use_indexes(driver: Driver) {
    let dir = tempfile::tempdir().unwrap();
    let pg;
    let db = match driver {
        Driver::Sqlite => dir.path().join("plans.db"),
        Driver::Postgres => {
            pg = common::pg::PgDb::create().unwrap();
            pg.url.clone().into()
        }
    };
    let store = store::open(&db, Durability::Full).await.unwrap();
    let plans = store.ops_stats_plans(10_000_000).await.unwrap();
    store.close().await;
    let names: Vec<&str> = plans.iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        [
            "queued_by_tool",
            "running_by_tool",
            "open_by_status",
            "finished_since",
            "failures_since",
            "finished_by_tool"
        ]
    );
    let index_of = BTreeMap::from([
        ("queued_by_tool", "jobs_queued"),
        ("running_by_tool", "jobs_running_tool"),
        ("open_by_status", "tasks_open_status"),
        ("finished_since", "tasks_finished"),
        ("failures_since", "tasks_finished"),
        ("finished_by_tool", "tasks_finished"),
    ]);
    for p in &plans {
        eprintln!("{} ({driver:?}):\n{}", p.name, p.plan);
        for line in p.plan.lines() {
            match driver {
                Driver::Sqlite => assert!(
                    !(line.contains("SCAN tasks") || line.contains("SCAN jobs"))
                        || line.contains("INDEX"),
                    "{}: a scan without an index:\n{}",
                    p.name,
                    p.plan
                ),
                Driver::Postgres => assert!(
                    !line.contains("Seq Scan"),
                    "{}: a sequential scan:\n{}",
                    p.name,
                    p.plan
                ),
            }
        }
        assert!(
            p.plan.contains(index_of[p.name]),
            "{}: not by {}:\n{}",
            p.name,
            index_of[p.name],
            p.plan
        );
    }
}
both_drivers!(issue17_stats_queries_use_indexes);

/// A `taskbroker serve` on an existing database file (a restored backup).
struct Broker {
    child: Child,
    url: String,
}

impl Broker {
    fn start(db: &Path, log: &Path) -> Self {
        let log = std::fs::File::create(log).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .args(["serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(db)
            .env("RUST_LOG", "info,sqlx=warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("taskbroker listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        Self { child, url }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 17: `taskbroker backup --to FILE` copies a SQLite database while
/// its broker runs and tasks are being created: the copy passes
/// `PRAGMA integrity_check`, and a second broker started on it serves the
/// tasks that existed before (tasks/get, tasks/result in their session).
/// A backup never overwrites a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue17_backup_copies_a_running_sqlite_broker() {
    let server = Server::start(&[]);
    let mut client = server.client().await;
    let mut before = BTreeMap::new();
    for n in 0..5 {
        let task = client
            .call_task("fail", json!({ "message": format!("kept {n}") }))
            .await;
        let id = task["taskId"].as_str().unwrap().to_owned();
        client.wait_terminal(&id, Duration::from_secs(60)).await;
        let result = client.ok("tasks/result", json!({ "taskId": id })).await;
        before.insert(id, result);
    }
    for _ in 0..3 {
        let task = client.call_task("sleep", json!({ "seconds": 0 })).await;
        let id = task["taskId"].as_str().unwrap().to_owned();
        client.wait_terminal(&id, Duration::from_secs(60)).await;
        let result = client.ok("tasks/result", json!({ "taskId": id })).await;
        before.insert(id, result);
    }

    // Tasks keep coming while the backup runs.
    let stop = tokio_util::sync::CancellationToken::new();
    let created = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let stop = stop.clone();
        let created = created.clone();
        let url = server.url.clone();
        let mut busy = Client::new(&url);
        tokio::spawn(async move {
            busy.initialize().await;
            while !stop.is_cancelled() {
                busy.call_task("sleep", json!({ "seconds": 0 })).await;
                created.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    // Until the writer is under way, at the machine's pace.
    let count = || created.load(std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    while count() == 0 {
        assert!(Instant::now() < deadline, "no task created in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before_backup = count();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy.db");
    let copy_arg = copy.to_str().unwrap().to_owned();
    let db = server.db().to_str().unwrap().to_owned();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["backup", "--db", &db, "--to", &copy_arg])
        .env_remove("TASKBROKER_DB")
        .output()
        .await
        .unwrap();
    // And goes on after it: the backup held no lock that stopped writes.
    while count() == before_backup {
        assert!(
            Instant::now() < deadline,
            "no task created after the backup"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    writer.await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("copy.db"),
        "{out:?}"
    );
    assert!(!dir.path().join("copy.db.partial").exists());

    let check = sqlx::SqlitePool::connect(&format!("sqlite:{copy_arg}?mode=ro"))
        .await
        .unwrap();
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&check)
        .await
        .unwrap();
    assert_eq!(integrity, "ok");
    check.close().await;

    // Refused: the copy exists now.
    let size = std::fs::metadata(&copy).unwrap().len();
    let (code, _, err) = taskbroker(&["backup", "--db", &db, "--to", &copy_arg]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("exists"), "{err}");
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), size);

    // A second broker on the copy serves what existed, in its session.
    let restored = Broker::start(&copy, &dir.path().join("restored.log"));
    client.reconnect(&restored.url);
    for (id, result) in &before {
        let task = client.ok("tasks/get", json!({ "taskId": id })).await;
        assert!(
            ["completed", "failed"].contains(&task["status"].as_str().unwrap()),
            "{task}"
        );
        let again = client.ok("tasks/result", json!({ "taskId": id })).await;
        assert_eq!(&again, result, "the result of {id}");
    }
    let stats = json_of(&["stats", "--db", &copy_arg, "--json"]);
    let finished: i64 = ["completed", "failed"]
        .iter()
        .map(|s| stats["finished"]["lastHour"][s].as_i64().unwrap())
        .sum();
    assert!(finished >= before.len() as i64, "{stats:#}");
    let listed: BTreeSet<String> = ids(&json_of(&[
        "tasks", "list", "--db", &copy_arg, "--json", "--all",
    ]))
    .into_iter()
    .collect();
    assert!(before.keys().all(|id| listed.contains(id)));
}

/// Issue 17: on PostgreSQL `taskbroker backup` points at pg_dump and exits
/// 2, touching nothing.
#[test]
fn issue17_backup_on_postgresql_points_at_pg_dump() {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("dump");
    let (code, out, err) = taskbroker(&[
        "backup",
        "--db",
        "postgres://someone:secret@127.0.0.1:1/nowhere",
        "--to",
        to.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("pg_dump -Fc"), "{err}");
    assert!(err.contains("pg_restore"), "{err}");
    assert!(
        !err.contains("secret"),
        "the password is never shown: {err}"
    );
    assert!(!to.exists());
}

/// Issue 17: a broker on a PostgreSQL server without autovacuum says so at
/// start (dead rows of finished jobs would pile up); with it, it says
/// nothing. Whichever this server is, the log must match it.
#[tokio::test]
async fn issue17_a_broker_names_a_server_without_autovacuum() {
    if !common::pg::available() {
        return;
    }
    let server = Server::start_on(Driver::Postgres, &[]);
    let autovacuum = server
        .pg()
        .unwrap()
        .psql("SHOW autovacuum")
        .unwrap()
        .trim()
        .to_owned();
    let warned = server
        .log()
        .contains("autovacuum is off on this PostgreSQL server");
    assert_eq!(
        warned,
        autovacuum == "off",
        "autovacuum {autovacuum}:\n{}",
        server.log()
    );
}

/// `taskbroker ARGS` with the default log settings (no `RUST_LOG`):
/// exit code, stdout, stderr.
fn taskbroker_default_logs(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(args)
        .env_remove("TASKBROKER_DB")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue item 5: `token create`, `token list` and `token revoke` print
/// their answer and nothing else: no log line (a migration note, a
/// slow-statement warning, the broker's autovacuum advice on a PostgreSQL
/// server without it), on a fresh database (the first command migrates it)
/// and on a migrated one.
async fn item5_token_commands_print_only_their_answer(driver: Driver) {
    let dir = tempfile::tempdir().unwrap();
    let pg = match driver {
        Driver::Sqlite => None,
        Driver::Postgres => Some(common::pg::PgDb::create().unwrap()),
    };
    let db = match &pg {
        Some(pg) => pg.url.clone(),
        None => dir.path().join("tokens.db").display().to_string(),
    };
    let mut ids = Vec::new();
    for principal in ["alice", "ops"] {
        let (code, out, err) =
            taskbroker_default_logs(&["token", "create", "--principal", principal, "--db", &db]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.lines().count(), 1, "the token alone: {out}");
        assert!(out.starts_with("tbk_"), "{out}");
        let err_lines: Vec<&str> = err.lines().collect();
        assert_eq!(err_lines.len(), 1, "one line on stderr: {err}");
        assert!(err_lines[0].starts_with("token "), "{}", err_lines[0]);
        ids.push(err_lines[0].split_whitespace().nth(1).unwrap().to_owned());
    }
    let (code, out, err) = taskbroker_default_logs(&["token", "list", "--db", &db]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "", "nothing but the list");
    assert_eq!(out.lines().count(), 2, "{out}");
    for id in &ids {
        assert!(out.lines().any(|l| l.starts_with(id.as_str())), "{out}");
    }
    let (code, out, err) = taskbroker_default_logs(&["token", "revoke", &ids[0], "--db", &db]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "", "nothing but the answer");
    assert_eq!(out.trim(), format!("token {} revoked", ids[0]));
}
both_drivers!(item5_token_commands_print_only_their_answer);
