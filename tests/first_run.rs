//! What a new user meets first (issue 12): a relative `--config` path, a
//! piped stderr that goes away, restarts during a task, a task waiting in
//! the queue, start-up errors, and the logs and views an operator reads.
//! Each test names the point of the issue it proves; all run the real
//! binary over HTTP on real SQLite files.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Client, Server, WorkerProc};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_taskbroker");

/// A command tool that sleeps the seconds it is given and says which
/// attempt finished; one attempt only, so any counted restart would fail it.
const SLOW_TOOL: &str = r#"
[[tool]]
name = "slow"
description = "Sleep, then say which attempt finished"
command = ["sh", "-c", "sleep \"$(cat | sed 's/[^0-9.]//g')\"; echo \"slow done on attempt $TASKBROKER_ATTEMPT\""]
max_attempts = 1
"#;

/// Read the "taskbroker listening on URL" line a server prints on stdout.
fn read_url(child: &mut Child) -> String {
    let stdout = child.stdout.as_mut().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    line.trim()
        .strip_prefix("taskbroker listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned()
}

/// Kills its process when dropped, so a failed test leaves none behind.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Wait for a process to exit, up to `limit`; its exit status if it did.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Poll the database until `query` (one integer) returns `want`.
async fn wait_for_count(db: &sqlx::SqlitePool, query: &str, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(query))
            .fetch_one(db)
            .await
            .unwrap();
        if n == want {
            return;
        }
        assert!(Instant::now() < deadline, "{query}: {n}, wanted {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn read_only(db: &Path) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(db)
            .read_only(true),
    )
    .await
    .unwrap()
}

/// Point 1: `serve --config conf/t.toml` and `worker --config conf/t.toml`
/// from another working directory run the config's relative command
/// (`./tools/hello.sh`) found next to the config file, in its folder.
#[tokio::test]
async fn issue12_p1_relative_config_path_runs_command_tools() {
    let root = tempfile::tempdir().unwrap();
    let conf = root.path().join("conf");
    std::fs::create_dir_all(conf.join("tools")).unwrap();
    let script = conf.join("tools/hello.sh");
    std::fs::write(&script, "#!/bin/sh\necho \"hello from $(pwd)\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        conf.join("t.toml"),
        "[[tool]]\nname = \"hello\"\ndescription = \"Say where it runs\"\ncommand = [\"./tools/hello.sh\"]\n",
    )
    .unwrap();
    let log = std::fs::File::create(root.path().join("serve.log")).unwrap();
    let mut serve = KillOnDrop(
        Command::new(BIN)
            .current_dir(root.path())
            .args(["serve", "--config", "conf/t.toml", "--db", "b.db"])
            .args(["--listen", "127.0.0.1:0", "--workers", "0"])
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let url = read_url(&mut serve.0);
    let mut c = Client::new(&url);
    c.initialize().await;
    let folder = std::fs::canonicalize(&conf).unwrap();
    let want = format!("hello from {}\n", folder.display());
    // A plain call runs in the server process.
    let r = c
        .ok("tools/call", json!({"name": "hello", "arguments": {}}))
        .await;
    assert_eq!(r["content"][0]["text"], want, "{r}");
    // A task runs in a worker process started the same way.
    let wlog = std::fs::File::create(root.path().join("worker.log")).unwrap();
    let _worker = KillOnDrop(
        Command::new(BIN)
            .current_dir(root.path())
            .args(["worker", "--config", "conf/t.toml", "--db", "b.db"])
            .stdout(Stdio::null())
            .stderr(wlog)
            .spawn()
            .unwrap(),
    );
    let task = c.call_task("hello", json!({})).await;
    let id = task["taskId"].as_str().unwrap().to_owned();
    let done = c.wait_terminal(&id, Duration::from_secs(15)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let r = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["content"][0]["text"], want, "{r}");
}

/// Points 3 and 4: the broker's stdout and stderr are pipes whose reader
/// goes away (Ctrl-C on `taskbroker serve 2>&1 | cat` stops `cat` too); log
/// lines are lost, but a request still answers, SIGINT still shuts down
/// gracefully, the running job is released at once (not after its lease),
/// and the release uses up no attempt: the task then completes on attempt 1.
#[tokio::test]
async fn issue12_p3_p4_closed_log_pipe_loses_lines_not_graceful_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.toml"), SLOW_TOOL).unwrap();
    let db = dir.path().join("b.db");
    let serve = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(dir.path().join("t.toml"))
        .arg("--db")
        .arg(&db)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--grace",
            "0.3",
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut serve = KillOnDrop(serve);
    let url = read_url(&mut serve.0);
    let mut c = Client::new(&url);
    c.initialize().await;
    let id = c.call_task("slow", json!({"s": 30})).await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let ro = read_only(&db).await;
    wait_for_count(&ro, "SELECT count(*) FROM jobs WHERE state = 'running'", 1).await;
    // The reader goes away; every later log line hits a broken pipe.
    drop(serve.0.stdout.take());
    drop(serve.0.stderr.take());
    let got = c.ok("tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["status"], "working", "a request still answers: {got}");
    let got = c.ok("tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["status"], "working", "and the next one: {got}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.0.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = wait_exit(&mut serve.0, Duration::from_secs(10))
        .expect("SIGINT with a closed stderr: the broker did not shut down");
    assert!(status.success(), "{status}");
    let (state, attempt, last_error): (String, i64, String) =
        sqlx::query_as("SELECT state, attempt, last_error FROM jobs")
            .fetch_one(&ro)
            .await
            .unwrap();
    assert_eq!(state, "queued", "released at once, not left to its lease");
    assert_eq!(attempt, 0, "the release counted no attempt");
    assert!(
        last_error.contains("released by a stopping worker"),
        "{last_error}"
    );
    let worker: String = sqlx::query_scalar("SELECT state FROM v_workers")
        .fetch_one(&ro)
        .await
        .unwrap();
    assert_eq!(worker, "stopped");
}

/// Point 4: three graceful restarts (SIGTERM) of the worker running a task
/// whose tool allows one attempt: the task still completes, on attempt 1,
/// and the job history shows each claim and release with its worker.
#[tokio::test]
async fn issue12_p4_graceful_restarts_use_no_attempts() {
    let server = Server::start_with_config(SLOW_TOOL, &["--workers", "0"]);
    let cfg = server.config_path();
    let mut c = server.client().await;
    let id = c.call_task("slow", json!({"s": 2})).await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let db = server.read_db().await;
    for n in 0..3 {
        let mut w = WorkerProc::start(&server, n, &["--config", &cfg, "--grace", "0.1"]);
        wait_for_count(&db, "SELECT count(*) FROM jobs WHERE state = 'running'", 1).await;
        w.term();
        wait_exit(&mut w.child, Duration::from_secs(10)).expect("worker stops on SIGTERM");
        wait_for_count(&db, "SELECT count(*) FROM jobs WHERE state = 'queued'", 1).await;
    }
    let _last = WorkerProc::start(&server, 3, &["--config", &cfg]);
    let done = c.wait_terminal(&id, Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let r = c.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(r["content"][0]["text"], "slow done on attempt 1\n");
    let events: Vec<(i64, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT attempt, event, worker, reason FROM v_job_history WHERE task_id = ? ORDER BY id",
    )
    .bind(&id)
    .fetch_all(&db)
    .await
    .unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "claimed", "requeued", "claimed", "requeued", "claimed", "requeued", "claimed",
            "finished"
        ],
        "{events:?}"
    );
    for e in &events {
        assert_eq!(e.0, 1, "every run is attempt 1: {events:?}");
        assert!(e.2.is_some(), "each event names its worker: {events:?}");
    }
    for e in events.iter().filter(|e| e.1 == "requeued") {
        let reason = e.3.as_deref().unwrap();
        assert!(reason.contains("released by a stopping worker"), "{reason}");
        assert!(reason.contains("not counted"), "{reason}");
    }
    assert_eq!(events[7].3.as_deref(), Some("outcome recorded"));
}

/// Point 5: a task waiting for a worker says `queued` (tasks/get and
/// tasks/list), with no write while it waits; once a worker runs it, the
/// message is the tool's own, and `v_workers.jobs_running` counts it at once.
#[tokio::test]
async fn issue12_p5_p8_a_queued_task_says_so_until_a_worker_starts_it() {
    let server = Server::start_with_config(SLOW_TOOL, &["--workers", "0"]);
    let mut c = server.client().await;
    let id = c
        .call_task("sleep", json!({"seconds": 3, "message": "slept"}))
        .await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let got = c.ok("tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["status"], "working");
    assert_eq!(got["statusMessage"], "queued", "{got}");
    let list = c.ok("tasks/list", json!({})).await;
    assert_eq!(list["tasks"][0]["statusMessage"], "queued", "{list}");
    let db = server.read_db().await;
    let writes_before: i64 = sqlx::query_scalar("SELECT updated_at FROM tasks")
        .fetch_one(&db)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let writes_after: i64 = sqlx::query_scalar("SELECT updated_at FROM tasks")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(writes_before, writes_after, "waiting writes nothing");

    let cfg = server.config_path();
    let _w = WorkerProc::start(&server, 0, &["--config", &cfg]);
    wait_for_count(
        &db,
        "SELECT coalesce(sum(jobs_running), 0) FROM v_workers WHERE state = 'live'",
        1,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = c.ok("tasks/get", json!({"taskId": id})).await;
        if got["statusMessage"] != "queued" {
            // Started: the message is the tool's own (the demo sleep tool
            // reports its progress), or none yet.
            break;
        }
        assert!(Instant::now() < deadline, "never left 'queued': {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = c.wait_terminal(&id, Duration::from_secs(15)).await;
    assert_eq!(done["status"], "completed", "{done}");
}

/// Run `taskbroker ARGS` (with RUST_BACKTRACE=1, as many Rust users have)
/// in `dir`; returns (exit code, stderr).
fn run_in(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Point 6: each start-up failure is one line `taskbroker: what: why (what
/// to do)`, exit status 1, no backtrace and no "Caused by" whatever
/// RUST_BACKTRACE says; usage errors exit 2.
#[test]
fn issue12_p6_startup_errors_are_one_line_with_the_reason_and_next_step() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("adir")).unwrap();
    std::fs::write(d.join("notes.txt"), "not a database, just words\n").unwrap();
    std::fs::write(d.join("empty.db"), "").unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let cases: [(&[&str], &[&str]); 7] = [
        (
            &["serve", "--db", "adir", "--listen", "127.0.0.1:0"],
            &["database adir: is a directory", "--db adir/taskbroker.db"],
        ),
        (
            &["serve", "--db", "notes.txt", "--listen", "127.0.0.1:0"],
            &["database notes.txt: is not a SQLite database"],
        ),
        (
            &["serve", "--config", "nope.toml"],
            &["nope.toml: no such file"],
        ),
        (
            &["serve", "--db", "b.db", "--listen", &busy_addr],
            &[&format!("cannot listen on {busy_addr}"), "--listen"],
        ),
        (
            &["worker", "--db", "missing.db"],
            &[
                "database missing.db: does not exist",
                "taskbroker migrate --db missing.db",
            ],
        ),
        (
            &["worker", "--db", "empty.db"],
            &[
                "database empty.db: it has no taskbroker schema yet",
                "taskbroker migrate --db empty.db",
            ],
        ),
        (
            &[
                "serve",
                "--db",
                "no/such/folder/b.db",
                "--listen",
                "127.0.0.1:0",
            ],
            &["folder no/such/folder does not exist"],
        ),
    ];
    for (args, wants) in cases {
        let (code, stderr) = run_in(d, args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line, got: {stderr}");
        assert!(lines[0].starts_with("taskbroker: "), "{args:?}: {stderr}");
        for want in wants {
            assert!(
                lines[0].contains(want),
                "{args:?}: wanted {want:?} in {stderr}"
            );
        }
        assert!(!stderr.contains("backtrace"), "{stderr}");
        assert!(!stderr.contains("Caused by"), "{stderr}");
        assert!(!lines[0].contains("(schema version"), "{stderr}");
    }
    assert!(
        !d.join("missing.db").exists(),
        "a worker creates no database"
    );
    assert!(
        !d.join("b.db").exists(),
        "no database when the port is taken"
    );
    let (code, stderr) = run_in(d, &["serve", "--no-such-flag"]);
    assert_eq!(code, 2, "usage: {stderr}");
}

/// Point 8: a first start with the default log settings logs its
/// migration once (one line), and request durations are short numbers.
#[tokio::test]
async fn issue12_p8_first_start_logs_one_migration_line_and_short_durations() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("serve.log");
    let mut serve = KillOnDrop(
        Command::new(BIN)
            .current_dir(dir.path())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let url = read_url(&mut serve.0);
    let mut c = Client::new(&url);
    c.initialize().await;
    c.ok("tools/list", json!({})).await;
    drop(serve);
    let log = std::fs::read_to_string(&log_path).unwrap();
    let migration_lines: Vec<&str> = log.lines().filter(|l| l.contains("migrat")).collect();
    assert_eq!(migration_lines.len(), 1, "{log}");
    let versions = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite"))
        .unwrap()
        .count();
    let to = format!("to={versions}");
    assert!(migration_lines[0].contains(&to), "{}", migration_lines[0]);
    let durations: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("duration_ms=").nth(1))
        .collect();
    assert!(!durations.is_empty(), "{log}");
    for d in durations {
        let number = d.split_whitespace().next().unwrap();
        let decimals = number.split('.').nth(1).map_or(0, str::len);
        assert!(decimals <= 2, "duration_ms={number}");
    }
}
