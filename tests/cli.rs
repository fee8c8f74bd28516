//! The command-line client (`taskbroker call`, `taskbroker tasks`) end to
//! end: the real binary as a subprocess against a real broker.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Client, Server};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RELATED: &str = "io.modelcontextprotocol/related-task";

/// What a finished `taskbroker` invocation left behind.
#[derive(Debug)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// One user of the CLI: a state folder of its own (`XDG_STATE_HOME`, and a
/// `HOME` beside it, so nothing reaches the real user's folders) and a
/// working directory of its own.
struct Cli {
    /// Removed at the end of the test.
    dir: tempfile::TempDir,
}

impl Cli {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("taskbroker-cli-")
            .tempdir()
            .unwrap();
        for sub in ["state", "home", "cwd"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        Self { dir }
    }

    fn state_home(&self) -> std::path::PathBuf {
        self.dir.path().join("state")
    }

    /// The CLI's state file.
    fn state_file(&self) -> std::path::PathBuf {
        self.state_home().join("taskbroker").join("cli.json")
    }

    fn cwd(&self) -> std::path::PathBuf {
        self.dir.path().join("cwd")
    }

    /// `taskbroker` with a clean environment (no TASKBROKER_URL, no
    /// RUST_LOG) and this user's folders.
    fn command(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskbroker"));
        c.env_remove("TASKBROKER_URL")
            .env_remove("TASKBROKER_TOKEN")
            .env_remove("RUST_LOG")
            .env("XDG_STATE_HOME", self.state_home())
            .env("HOME", self.dir.path().join("home"))
            .current_dir(self.cwd())
            .kill_on_drop(true);
        c
    }

    /// Run `taskbroker ARGS --url URL` to the end (stdin closed).
    async fn run(&self, url: &str, args: &[&str]) -> Out {
        let mut cmd = self.command();
        cmd.args(args).arg("--url").arg(url).stdin(Stdio::null());
        output(cmd).await
    }
}

async fn output(mut cmd: tokio::process::Command) -> Out {
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("taskbroker finished within 60 s")
        .expect("taskbroker runs");
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The task and session ids of `taskbroker: task <id> (session <sid>)`.
#[track_caller]
fn task_and_session(stderr: &str) -> (String, String) {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("taskbroker: task "))
        .unwrap_or_else(|| panic!("no task line in stderr: {stderr}"));
    let (task, rest) = line.split_once(" (session ").unwrap();
    (task.to_owned(), rest.trim_end_matches(')').to_owned())
}

/// The task lines of `tasks list`: the header line README shows comes
/// first (checked here), then one line per task.
#[track_caller]
fn task_lines(stdout: &str) -> Vec<&str> {
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        header,
        ["taskId", "status", "tool", "lastUpdatedAt", "statusMessage"],
        "{stdout}"
    );
    lines.collect()
}

/// A session made outside the CLI (left open), for `--session`.
async fn session(server: &Server) -> (Client, String) {
    let client = server.client().await;
    let sid = client.session.clone().unwrap();
    (client, sid)
}

#[tokio::test]
async fn plain_echo_prints_its_arguments_and_json_prints_the_whole_result() {
    let cli = Cli::new();
    let server = Server::start(&[]);
    let out = cli
        .run(
            &server.url,
            &["call", "echo", "--args", r#"{"a":1,"b":"x"}"#],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "{\"a\":1,\"b\":\"x\"}\n");
    // Not a terminal: no progress bar noise.
    assert_eq!(out.stderr, "");

    let out = cli
        .run(
            &server.url,
            &["call", "echo", "--args", r#"{"a":1}"#, "--json"],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["content"][0]["text"], r#"{"a":1}"#);
    assert_eq!(result["structuredContent"], json!({"a": 1}));

    // TASKBROKER_URL stands in for --url; --args defaults to {}.
    let mut cmd = cli.command();
    cmd.args(["call", "echo"])
        .env("TASKBROKER_URL", &server.url)
        .stdin(Stdio::null());
    let out = output(cmd).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "{}\n");
}

/// Covers T-6 (an optional tool runs plainly): the SSE answer with
/// notifications/progress is read to the response.
#[tokio::test]
async fn plain_sleep_reads_progress_and_prints_the_message() {
    let cli = Cli::new();
    let server = Server::start(&[]);
    let started = Instant::now();
    let out = cli
        .run(
            &server.url,
            &["call", "sleep", "--args", r#"{"seconds":1,"message":"hi"}"#],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "hi\n");
    assert!(started.elapsed() >= Duration::from_secs(1));
}

/// Covers T-7 (a task at once), T-10 (ttl), T-14 and T-16 (tasks/result
/// returns the call's result with related-task _meta).
#[tokio::test]
async fn task_call_prints_the_task_id_then_the_result() {
    let cli = Cli::new();
    let server = Server::start(&["--poll-interval", "200"]);
    let out = cli
        .run(
            &server.url,
            &[
                "call",
                "sleep",
                "--args",
                r#"{"seconds":1,"message":"hi"}"#,
                "--task",
            ],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "hi\n");
    let (task, sid) = task_and_session(&out.stderr);
    uuid::Uuid::parse_str(&task).expect("a task id");
    assert!(!sid.is_empty());

    let out = cli
        .run(
            &server.url,
            &[
                "call",
                "sleep",
                "--args",
                r#"{"seconds":0,"message":"json"}"#,
                "--task",
                "--ttl",
                "60000",
                "--json",
            ],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let (task, _) = task_and_session(&out.stderr);
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["content"][0]["text"], "json");
    assert_eq!(result["_meta"][RELATED]["taskId"], json!(task));
}

/// Covers T-15 (a failed task's isError result), T-4 (task on a forbidden
/// tool), T-5 (required tool without task): all exit 1, message on stderr.
#[tokio::test]
async fn failures_exit_1_with_the_message_on_stderr_issue12_p8_task_mode_advice() {
    let cli = Cli::new();
    let server = Server::start(&["--poll-interval", "200"]);
    let out = cli.run(&server.url, &["call", "fail", "--task"]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr.contains("the fail tool failed, as asked"),
        "{out:?}"
    );

    let out = cli
        .run(
            &server.url,
            &["call", "fail", "--args", r#"{"message":"boom"}"#],
        )
        .await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("boom"), "{out:?}");

    let out = cli.run(&server.url, &["call", "nope"]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32602"), "{out:?}");
    assert!(out.stderr.contains("nope"), "{out:?}");

    // T-5: sleep_as_task requires a task.
    let out = cli
        .run(
            &server.url,
            &["call", "sleep_as_task", "--args", r#"{"seconds":0}"#],
        )
        .await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32601"), "{out:?}");
    // Issue 12, point 8: advice in the CLI's words, not "add params.task".
    assert_eq!(
        out.stderr,
        "taskbroker: call sleep_as_task: the tool runs only as a task (its execution.taskSupport \
         is 'required'; JSON-RPC error -32601) (add --task)\n"
    );

    // T-4: echo forbids tasks.
    let out = cli.run(&server.url, &["call", "echo", "--task"]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32601"), "{out:?}");
    assert!(out.stderr.contains("(drop --task)"), "{out:?}");

    // Invalid arguments: a tool result with isError (plain), a failed task.
    let out = cli
        .run(
            &server.url,
            &["call", "sleep", "--args", r#"{"seconds":"x"}"#, "--task"],
        )
        .await;
    assert_eq!(out.code, Some(1), "{out:?}");
}

#[tokio::test]
async fn usage_errors_exit_2_and_an_unreachable_server_exits_3() {
    let cli = Cli::new();
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!("http://127.0.0.1:{port}/mcp");
    for args in [
        vec!["call", "echo", "--args", r#"{"seconds":"#],
        vec!["call", "echo", "--args", "[1]"],
        vec!["call", "sleep", "--ttl", "1000"], // --ttl needs --task
    ] {
        let out = cli.run(&dead, &args).await;
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        assert!(out.stderr.contains("--"), "{out:?}");
    }
    let out = cli.run(&dead, &["call", "echo", "--args", "{"]).await;
    assert!(out.stderr.contains("not valid JSON"), "{out:?}");
    for url in ["https://127.0.0.1/mcp", "not a url"] {
        let out = cli.run(url, &["call", "echo"]).await;
        assert_eq!(out.code, Some(2), "{url}: {out:?}");
    }
    for args in [
        vec!["call", "echo"],
        vec!["call", "sleep", "--task"],
        vec!["tasks", "list"],
    ] {
        let out = cli.run(&dead, &args).await;
        assert_eq!(out.code, Some(3), "{args:?}: {out:?}");
        assert!(out.stderr.contains("cannot reach"), "{out:?}");
    }
}

/// Covers T-14/T-16 (tasks result), T-17 (paging with nextCursor), T-21
/// (cancel), T-35/T-36 (another session's task is not found).
#[tokio::test]
async fn tasks_subcommands_work_on_a_given_session() {
    let cli = Cli::new();
    let server = Server::start(&["--page-size", "2", "--poll-interval", "200"]);
    let (mut c, sid) = session(&server).await;
    let out = cli
        .run(
            &server.url,
            &[
                "call",
                "sleep",
                "--args",
                r#"{"seconds":0,"message":"one"}"#,
                "--task",
                "--session",
                &sid,
            ],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let (task, printed) = task_and_session(&out.stderr);
    assert_eq!(printed, sid);
    // Two more, the last one long.
    c.call_task("sleep", json!({"seconds": 0})).await;
    let long = c.call_task("sleep", json!({"seconds": 30})).await;
    let long = long["taskId"].as_str().unwrap().to_owned();

    // The session given was not ended: list pages through all three.
    let out = cli
        .run(&server.url, &["tasks", "list", "--session", &sid])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(task_lines(&out.stdout).len(), 2, "{out:?}");
    assert!(out.stderr.contains("--all"), "{out:?}");
    let out = cli
        .run(&server.url, &["tasks", "list", "--all", "--session", &sid])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines = task_lines(&out.stdout);
    assert_eq!(lines.len(), 3, "{out:?}");
    assert!(lines[0].starts_with(&long), "newest first: {lines:?}");
    let mine = lines.iter().find(|l| l.starts_with(&task)).unwrap();
    assert!(mine.contains("completed"), "{mine}");

    let out = cli
        .run(&server.url, &["tasks", "get", &task, "--session", &sid])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let got: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(got["taskId"], json!(task));
    assert_eq!(got["status"], "completed");

    let out = cli
        .run(&server.url, &["tasks", "result", &task, "--session", &sid])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["content"][0]["text"], "one");
    assert_eq!(result["_meta"][RELATED]["taskId"], json!(task));

    // T-21: cancel answers with the cancelled task; its result is -32800.
    let out = cli
        .run(&server.url, &["tasks", "cancel", &long, "--session", &sid])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let cancelled: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    let out = cli
        .run(&server.url, &["tasks", "result", &long, "--session", &sid])
        .await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32800"), "{out:?}");

    // T-35/T-36: a new session sees none of them, and says why.
    let out = cli.run(&server.url, &["tasks", "list"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("--session"), "{out:?}");
    let out = cli.run(&server.url, &["tasks", "get", &task]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("not found"), "{out:?}");
    assert!(out.stderr.contains("--session"), "{out:?}");

    // An unknown session is refused (HTTP 404).
    let out = cli
        .run(&server.url, &["tasks", "list", "--session", "nosuch"])
        .await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("Session not found"), "{out:?}");
}

/// Issue 12, point 2: the session `call` made for itself is kept (not
/// DELETEd) and stored, so `tasks` without `--session` sees its task.
#[tokio::test]
async fn issue12_p2_call_keeps_its_session_for_tasks() {
    let cli = Cli::new();
    let server = Server::start(&["--poll-interval", "200"]);
    let out = cli
        .run(
            &server.url,
            &["call", "sleep", "--args", r#"{"seconds":0}"#, "--task"],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let (task, sid) = task_and_session(&out.stderr);
    let out = cli
        .run(&server.url, &["tasks", "list", "--session", &sid])
        .await;
    assert_eq!(out.code, Some(0), "the session still exists: {out:?}");
    assert!(task_lines(&out.stdout)[0].starts_with(&task), "{out:?}");
    let out = cli.run(&server.url, &["tasks", "get", &task]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let got: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(got["status"], "completed");
}

/// A `taskbroker` run with stdin piped and stderr collected as it comes.
struct Live {
    child: tokio::process::Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Live {
    fn start(cli: &Cli, url: &str, args: &[&str]) -> Self {
        let mut cmd = cli.command();
        cmd.args(args)
            .arg("--url")
            .arg(url)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut pipe = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait until stderr contains `needle`.
    async fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = self.stderr();
            if text.contains(needle) {
                return text;
            }
            assert!(Instant::now() < deadline, "no {needle:?} in: {text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn interrupt(&self) {
        let pid = self.child.id().unwrap();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    }

    async fn answer(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Wait for the exit, and for the last of stderr.
    async fn exit_code(&mut self) -> Option<i32> {
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("exited within 10 s")
            .unwrap();
        if let Some(reader) = self.reader.take() {
            reader.await.unwrap();
        }
        status.code()
    }
}

/// Ctrl-C during `call --task`: "n" leaves the task running in a session
/// that stays open (and says how to fetch the result); "y" cancels it (T-21).
#[tokio::test]
async fn ctrl_c_asks_whether_to_cancel_the_task() {
    let cli = Cli::new();
    let server = Server::start(&["--poll-interval", "200"]);
    let args = ["call", "sleep", "--args", r#"{"seconds":30}"#, "--task"];

    let mut live = Live::start(&cli, &server.url, &args);
    let (task, sid) = task_and_session(&live.wait_for(")\n").await);
    live.interrupt();
    live.wait_for(&format!("Cancel task {task}? [y/N]")).await;
    live.answer("n\n").await;
    assert_eq!(live.exit_code().await, Some(130));
    let stderr = live.stderr();
    // Issue 12, point 2: no --session needed to fetch it later.
    assert!(
        stderr.contains(&format!(
            "fetch its result with: taskbroker tasks result {task} --url {}\n",
            server.url
        )),
        "{stderr}"
    );
    for args in [
        vec!["tasks", "get", &task, "--session", &sid],
        vec!["tasks", "get", &task],
    ] {
        let out = cli.run(&server.url, &args).await;
        assert_eq!(out.code, Some(0), "the session was kept: {out:?}");
        let got: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(got["status"], "working");
    }

    let (mut c, sid) = session(&server).await;
    let mut args = args.to_vec();
    args.extend(["--session", &sid]);
    let mut live = Live::start(&cli, &server.url, &args);
    let (task, _) = task_and_session(&live.wait_for(")\n").await);
    live.interrupt();
    live.wait_for("[y/N]").await;
    live.answer("y\n").await;
    assert_eq!(live.exit_code().await, Some(130));
    assert!(
        live.stderr().contains(&format!("task {task} cancelled")),
        "{}",
        live.stderr()
    );
    let got = c.ok("tasks/get", json!({ "taskId": task })).await;
    assert_eq!(got["status"], "cancelled");
}

/// Ctrl-C during a plain call exits 130 at once.
#[tokio::test]
async fn ctrl_c_ends_a_plain_call() {
    let cli = Cli::new();
    let server = Server::start(&[]);
    let sessions = || server.log().matches("taskbroker-cli").count();
    let before = sessions();
    let mut live = Live::start(
        &cli,
        &server.url,
        &["call", "sleep", "--args", r#"{"seconds":30}"#],
    );
    // Once its session exists, the client listens for Ctrl-C.
    let deadline = Instant::now() + Duration::from_secs(20);
    while sessions() == before {
        assert!(Instant::now() < deadline, "no session: {}", server.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    live.interrupt();
    assert_eq!(live.exit_code().await, Some(130));
    assert!(live.stderr().contains("interrupted"), "{}", live.stderr());
}

/// H-4: a stream the server closes mid-call is resumed with GET and
/// Last-Event-ID, and the result arrives on the resumed stream.
#[tokio::test]
async fn a_closed_stream_is_resumed() {
    let cli = Cli::new();
    let server = Server::start(&["--conformance-tools"]);
    let mut cmd = cli.command();
    cmd.args(["call", "test_reconnection", "--url", &server.url])
        .env("RUST_LOG", "taskbroker::client=debug")
        .stdin(Stdio::null());
    let out = output(cmd).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "Reconnection test completed successfully\n");
    assert!(out.stderr.contains("resuming"), "{out:?}");
}

/// The state file as JSON.
#[track_caller]
fn state(cli: &Cli) -> Value {
    let text = std::fs::read_to_string(cli.state_file()).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("state file not JSON ({e}): {text}"))
}

/// The session the state file keeps for `url`.
#[track_caller]
fn stored_session(cli: &Cli, url: &str) -> Option<String> {
    state(cli)["brokers"][url]["session"]
        .as_str()
        .map(str::to_owned)
}

/// `call TOOL --args ARGS --task --detach`: the task id, alone on stdout.
async fn detach(cli: &Cli, url: &str, tool: &str, args: &str) -> String {
    let out = cli
        .run(url, &["call", tool, "--args", args, "--task", "--detach"])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "one line: {out:?}");
    let task = out.stdout.trim_end().to_owned();
    uuid::Uuid::parse_str(&task).expect("a task id on stdout");
    assert!(
        out.stderr
            .contains(&format!("taskbroker tasks result {task} --url {url}")),
        "a hint on stderr: {out:?}"
    );
    task
}

/// Issue 12, point 2: `call --task --detach` prints the task id and returns
/// at once; `tasks list|get|result|cancel`, separate invocations without
/// `--session`, see the task, and still do after the broker is killed -9
/// and restarted on the same database. The CLI's session stays the same.
#[tokio::test]
async fn issue12_p2_detached_task_is_seen_by_tasks_across_invocations_and_restarts() {
    let cli = Cli::new();
    let mut server = Server::start(&["--poll-interval", "200"]);
    let started = Instant::now();
    let long = detach(&cli, &server.url, "sleep", r#"{"seconds":30}"#).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "returned at once"
    );
    let short = detach(
        &cli,
        &server.url,
        "sleep",
        r#"{"seconds":0,"message":"two"}"#,
    )
    .await;
    let sid = stored_session(&cli, &server.url).expect("a stored session");

    let out = cli.run(&server.url, &["tasks", "result", &short]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["content"][0]["text"], "two");

    server.kill_and_restart();

    let out = cli.run(&server.url, &["tasks", "list"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines = task_lines(&out.stdout);
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(lines[0].starts_with(&short), "newest first: {lines:?}");
    assert!(lines[0].contains(" completed "), "{lines:?}");
    assert!(lines[1].starts_with(&long), "{lines:?}");
    assert!(lines[1].contains(" working "), "{lines:?}");
    let out = cli.run(&server.url, &["tasks", "get", &long]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let got: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(got["taskId"], json!(long));
    assert_eq!(got["status"], "working");
    let out = cli.run(&server.url, &["tasks", "result", &short]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["content"][0]["text"], "two");
    let out = cli.run(&server.url, &["tasks", "cancel", &long]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let cancelled: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    let out = cli.run(&server.url, &["tasks", "result", &long]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32800"), "{out:?}");

    // Still the first session: nothing was re-opened or ended.
    let out = cli.run(&server.url, &["call", "echo"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(stored_session(&cli, &server.url), Some(sid));
}

/// Issue 12, point 2: `--detach` needs `--task` (usage error, exit 2).
#[tokio::test]
async fn issue12_p2_detach_requires_task() {
    let cli = Cli::new();
    let out = cli
        .run("http://127.0.0.1:9/mcp", &["call", "sleep", "--detach"])
        .await;
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("--task"), "{out:?}");
}

/// Issue 12, point 2: two brokers (two URLs) have sessions of their own;
/// each one's `tasks list` shows only its tasks.
#[tokio::test]
async fn issue12_p2_two_urls_keep_separate_sessions() {
    let cli = Cli::new();
    let a = Server::start(&[]);
    let b = Server::start(&[]);
    let on_a = detach(&cli, &a.url, "sleep", r#"{"seconds":0}"#).await;
    let on_b = detach(&cli, &b.url, "sleep", r#"{"seconds":0}"#).await;
    let (sa, sb) = (stored_session(&cli, &a.url), stored_session(&cli, &b.url));
    assert!(sa.is_some() && sb.is_some() && sa != sb, "{}", state(&cli));
    for (server, mine, other) in [(&a, &on_a, &on_b), (&b, &on_b, &on_a)] {
        let out = cli.run(&server.url, &["tasks", "list"]).await;
        assert_eq!(out.code, Some(0), "{out:?}");
        let lines = task_lines(&out.stdout);
        assert!(lines[0].starts_with(mine.as_str()), "{out:?}");
        assert!(!out.stdout.contains(other.as_str()), "{out:?}");
        assert_eq!(lines.len(), 1, "{out:?}");
    }
}

/// Issue 12, point 2: a stored session the broker does not know (a fresh
/// database behind the same URL) is replaced by `call`, which still runs;
/// `tasks` says plainly that the session is gone, and forgets it.
#[tokio::test]
async fn issue12_p2_a_stale_session_is_replaced_by_call_and_reported_by_tasks() {
    let cli = Cli::new();
    let mut first = Server::start(&[]);
    detach(&cli, &first.url, "sleep", r#"{"seconds":0}"#).await;
    let old = stored_session(&cli, &first.url).unwrap();
    let port = first.port();
    first.kill9();

    // A fresh database behind the same URL: call opens a new session.
    let mut second = Server::start_fresh_on(port, &[]);
    let task = detach(&cli, &second.url, "sleep", r#"{"seconds":0}"#).await;
    let new = stored_session(&cli, &second.url).unwrap();
    assert_ne!(new, old);
    let out = cli.run(&second.url, &["tasks", "get", &task]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let out = cli
        .run(&second.url, &["call", "echo", "--args", r#"{"a":1}"#])
        .await;
    assert_eq!((out.code, out.stdout.as_str()), (Some(0), "{\"a\":1}\n"));
    second.kill9();

    // Again a fresh database: tasks reports the lost session, forgets it.
    let third = Server::start_fresh_on(port, &[]);
    let out = cli.run(&third.url, &["tasks", "get", &task]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_eq!(
        out.stderr,
        format!(
            "taskbroker: tasks: the client's session with {} is gone: the broker no longer knows \
             session {new} (a new or replaced database?) (its tasks cannot be reached; the session \
             is forgotten, and the next `taskbroker call` opens a new one)\n",
            third.url
        )
    );
    assert_eq!(stored_session(&cli, &third.url), None, "{}", state(&cli));
    let out = cli.run(&third.url, &["tasks", "list"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("no session with"), "{out:?}");
}

/// Issue 12, point 2: the state lives in `$XDG_STATE_HOME/taskbroker`
/// (else `$HOME/.local/state/taskbroker`; a relative XDG_STATE_HOME is
/// ignored), never in the working directory; it is private (0600) and
/// keyed by URL; a corrupt file is one warning line, not a failure.
#[tokio::test]
async fn issue12_p2_state_file_is_private_in_the_state_dir_and_survives_corruption() {
    use std::os::unix::fs::PermissionsExt;
    let cli = Cli::new();
    let server = Server::start(&[]);
    detach(&cli, &server.url, "sleep", r#"{"seconds":0}"#).await;
    let mode = std::fs::metadata(cli.state_file())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(stored_session(&cli, &server.url).is_some());
    let cwd: Vec<_> = std::fs::read_dir(cli.cwd()).unwrap().collect();
    assert!(cwd.is_empty(), "nothing in the working directory: {cwd:?}");
    let home = cli.dir.path().join("home");
    assert!(
        !home.join(".local").exists(),
        "XDG_STATE_HOME wins over HOME"
    );

    // Without XDG_STATE_HOME (or with a relative one): HOME.
    for xdg in [None, Some("relative/state")] {
        let mut cmd = cli.command();
        cmd.env_remove("XDG_STATE_HOME");
        if let Some(x) = xdg {
            cmd.env("XDG_STATE_HOME", x);
        }
        cmd.args(["call", "echo", "--url", &server.url])
            .stdin(Stdio::null());
        let out = output(cmd).await;
        assert_eq!(out.code, Some(0), "{out:?}");
        let file = home.join(".local/state/taskbroker/cli.json");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains(&server.url), "{text}");
        assert!(!cli.cwd().join("relative").exists());
    }

    // A corrupt file: one warning line; the call works; the file is repaired.
    std::fs::write(cli.state_file(), "{ not json").unwrap();
    let out = cli.run(&server.url, &["call", "echo"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "{}\n");
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    assert!(
        out.stderr.starts_with(&format!(
            "taskbroker: warning: the state file {} is not valid (",
            cli.state_file().display()
        )),
        "{out:?}"
    );
    assert!(stored_session(&cli, &server.url).is_some());
    // Unreadable (a folder where the file should be): a warning, no crash.
    std::fs::remove_file(cli.state_file()).unwrap();
    std::fs::create_dir(cli.state_file()).unwrap();
    let out = cli.run(&server.url, &["call", "echo"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    assert!(out.stderr.starts_with("taskbroker: warning: "), "{out:?}");
}

/// Issue 12, point 2: invocations at once share one session and lose none
/// of each other's writes (the file is locked and replaced atomically).
#[tokio::test]
async fn issue12_p2_concurrent_invocations_share_one_session() {
    let cli = Cli::new();
    let server = Server::start(&[]);
    let runs = (0..6).map(|i| {
        let args = format!(r#"{{"seconds":0,"message":"m{i}"}}"#);
        let (cli, url) = (&cli, server.url.clone());
        async move { detach(cli, &url, "sleep", &args).await }
    });
    let tasks = futures_util::future::join_all(runs).await;
    let out = cli.run(&server.url, &["tasks", "list"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    for task in &tasks {
        let line = task_lines(&out.stdout)
            .into_iter()
            .find(|l| l.starts_with(task.as_str()))
            .unwrap_or_else(|| panic!("{task} not listed: {out:?}"));
        assert!(line.contains(" sleep "), "{line}");
    }
    assert_eq!(
        state(&cli)["brokers"][&server.url]["tasks"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
}

/// Issue 12, point 8: `tasks list` has a tool column: the tool of each
/// task this CLI started (a Task carries no tool name), `-` for others.
#[tokio::test]
async fn issue12_p8_tasks_list_has_a_tool_column() {
    let cli = Cli::new();
    let server = Server::start(&[]);
    let slept = detach(&cli, &server.url, "sleep_as_task", r#"{"seconds":0}"#).await;
    let failed = detach(&cli, &server.url, "fail", "{}").await;
    let sid = stored_session(&cli, &server.url).unwrap();
    let mut c = Client::new(&server.url);
    c.session = Some(sid);
    let other = c.call_task("sleep", json!({"seconds": 0})).await;
    let other = other["taskId"].as_str().unwrap().to_owned();
    c.wait_terminal(&slept, Duration::from_secs(10)).await;
    c.wait_terminal(&failed, Duration::from_secs(10)).await;
    c.wait_terminal(&other, Duration::from_secs(10)).await;

    let out = cli.run(&server.url, &["tasks", "list"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let columns = |id: &str| -> Vec<String> {
        let line = out.stdout.lines().find(|l| l.starts_with(id)).unwrap();
        line.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(columns(&slept)[1..3], ["completed", "sleep_as_task"]);
    assert_eq!(columns(&failed)[1..3], ["failed", "fail"]);
    assert_eq!(columns(&other)[1..3], ["completed", "-"]);
}

/// Issue 16: `--protocol 2026-07-28` speaks the stateless generation. A
/// plain call answers at once; `--task` declares the tasks extension, so
/// `sleep` becomes a task followed with tasks/get (its result inline); a
/// tool `isError` exits 1; `--detach` prints the id, which `tasks get` and
/// `tasks result` reach from another invocation with no session and no
/// state file; `tasks cancel` cancels; `tasks list` has no 2026 form
/// (exit 2); a task-only tool without `--task` says to add it.
#[tokio::test]
async fn issue16_protocol_2026_calls_and_follows_tasks_without_a_session() {
    let server = Server::start(&[]);
    let cli = Cli::new();
    let url = server.url.as_str();
    fn with<'a>(args: &[&'a str]) -> Vec<&'a str> {
        [args, &["--protocol", "2026-07-28"][..]].concat()
    }

    let out = cli
        .run(url, &with(&["call", "echo", "--args", r#"{"a":1}"#]))
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), r#"{"a":1}"#, "{out:?}");

    let out = cli
        .run(
            url,
            &with(&["call", "sleep", "--args", r#"{"seconds":1}"#, "--task"]),
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "slept 1 s", "{out:?}");
    assert!(out.stderr.contains("taskbroker: task "), "{out:?}");

    let out = cli.run(url, &with(&["call", "fail", "--task"])).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("the fail tool failed"), "{out:?}");

    let out = cli
        .run(
            url,
            &with(&["call", "sleep_as_task", "--args", r#"{"seconds":1}"#]),
        )
        .await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("-32021") && out.stderr.contains("add --task"),
        "{out:?}"
    );

    let out = cli
        .run(
            url,
            &with(&[
                "call",
                "sleep",
                "--args",
                r#"{"seconds":1}"#,
                "--task",
                "--detach",
            ]),
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let id = out.stdout.trim().to_owned();
    uuid::Uuid::parse_str(&id).unwrap_or_else(|e| panic!("{id:?}: {e}"));
    let other = Cli::new();
    let out = other.run(url, &with(&["tasks", "result", &id])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let task: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("JSON of tasks result: {e}: {out:?}"));
    assert_eq!(task["content"][0]["text"], "slept 1 s", "{out:?}");
    let out = other.run(url, &with(&["tasks", "get", &id])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let task: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(task["status"], "completed");
    assert_eq!(task["result"]["content"][0]["text"], "slept 1 s");
    assert!(
        !other.state_file().exists(),
        "no session state is kept for 2026"
    );

    let out = cli
        .run(
            url,
            &with(&[
                "call",
                "sleep",
                "--args",
                r#"{"seconds":60}"#,
                "--task",
                "--detach",
            ]),
        )
        .await;
    let long = out.stdout.trim().to_owned();
    let out = cli.run(url, &with(&["tasks", "cancel", &long])).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let task: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(task["status"], "cancelled", "{out:?}");

    let out = cli.run(url, &with(&["tasks", "list"])).await;
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("no tasks/list"), "{out:?}");
}

/// Issue item 5: a broker with tokens answers a CLI without one 401; the
/// CLI says how to authenticate (`--token` or `TASKBROKER_TOKEN`), in both
/// protocol generations, and says a refused token is refused. With the
/// token (flag or variable) the call goes through.
#[tokio::test]
async fn item5_a_401_says_how_to_pass_a_token() {
    let server = Server::start(&[]);
    let token = common::create_token(&server, "alice", &[]);
    let cli = Cli::new();
    for protocol in ["2025-11-25", "2026-07-28"] {
        let out = cli
            .run(&server.url, &["call", "echo", "--protocol", protocol])
            .await;
        assert_eq!(out.code, Some(3), "{out:?}");
        assert!(
            out.stderr.contains("requires a token")
                && out.stderr.contains("--token TOKEN")
                && out.stderr.contains("TASKBROKER_TOKEN"),
            "{protocol}: {out:?}"
        );
        assert_eq!(out.stderr.lines().count(), 1, "one line: {out:?}");

        let out = cli
            .run(
                &server.url,
                &[
                    "call",
                    "echo",
                    "--protocol",
                    protocol,
                    "--token",
                    "tbk_wrong",
                ],
            )
            .await;
        assert_eq!(out.code, Some(3), "{out:?}");
        assert!(
            out.stderr.contains("refused the token") && out.stderr.contains("--token"),
            "{protocol}: {out:?}"
        );

        let out = cli
            .run(
                &server.url,
                &["call", "echo", "--protocol", protocol, "--token", &token],
            )
            .await;
        assert_eq!(out.code, Some(0), "{protocol}: {out:?}");
        let mut cmd = cli.command();
        cmd.args(["call", "echo", "--protocol", protocol, "--url", &server.url])
            .env("TASKBROKER_TOKEN", &token)
            .stdin(Stdio::null());
        let out = output(cmd).await;
        assert_eq!(out.code, Some(0), "{protocol}: {out:?}");
    }
}

/// Issue item 5: the broker's log lines show plain values, not Rust debug
/// text: the CLI's session names its client as `taskbroker-cli` (not
/// `Some(String(...))`), a task's ttl is a number (not `Some(...)`), a
/// refused Origin is the header's text.
#[tokio::test]
async fn item5_log_fields_are_plain_values() {
    let server = Server::start(&[]);
    let cli = Cli::new();
    let out = cli
        .run(
            &server.url,
            &["call", "sleep", "--args", r#"{"seconds":0}"#, "--task"],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let refused = reqwest::Client::new()
        .post(&server.url)
        .header("origin", "http://elsewhere.example")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);

    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = server.log();
        if log.contains("request refused: origin") || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let line = |what: &str| -> String {
        log.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no '{what}' line: {log}"))
            .to_owned()
    };
    let session = line("session initialized");
    assert!(session.contains(r#"client="taskbroker-cli""#), "{session}");
    let created = line("task created");
    assert!(created.contains("ttl_ms=3600000"), "{created}");
    let origin = line("request refused: origin");
    assert!(
        origin.contains("origin=http://elsewhere.example"),
        "{origin}"
    );
    for debug_text in ["Some(", "String(", "Number(", "None", "Object {"] {
        assert!(!log.contains(debug_text), "{debug_text} in the log: {log}");
    }
}

/// The decimals of every number in a text (0 for an integer).
fn decimals_of_numbers(text: &str) -> Vec<(String, usize)> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
        .map(|w| {
            let w = w.trim_matches('.');
            (w.to_owned(), w.split('.').nth(1).map_or(0, str::len))
        })
        .collect()
}

/// Issue item 5: `bench` prints rounded figures: tasks/s as a whole
/// number, the mode as a plain word, milliseconds to two decimals; `--json`
/// rounds the same way (ms to 0.01, seconds to 0.001, tasks/s to 0.1).
#[tokio::test]
async fn item5_bench_prints_rounded_figures() {
    let server = Server::start(&[]);
    let cli = Cli::new();
    let out = cli
        .run(&server.url, &["bench", "--tasks", "40", "--clients", "2"])
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let first = out.stdout.lines().next().unwrap();
    let (head, tail) = first.split_once(" tasks/s ").unwrap();
    let rate = head.rsplit(' ').next().unwrap();
    assert!(
        rate.parse::<u64>().is_ok(),
        "tasks/s is a whole number: {first}"
    );
    assert!(tail.starts_with("(2 clients, result)"), "{first}");
    assert!(first.starts_with("40 tasks in "), "{first}");
    for (number, decimals) in decimals_of_numbers(&out.stdout) {
        assert!(decimals <= 2, "{number} in {}", out.stdout);
    }
    assert!(out.stdout.contains("p50 "), "{out:?}");

    let out = cli
        .run(
            &server.url,
            &["bench", "--tasks", "20", "--clients", "2", "--json"],
        )
        .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["mode"], "result");
    assert_eq!(report["tasks"], 20);
    let without_url = out.stdout.replace(report["url"].as_str().unwrap(), "");
    for (number, decimals) in decimals_of_numbers(&without_url) {
        assert!(decimals <= 3, "{number} in {}", out.stdout);
    }
    assert!(
        report["create"]["p50_ms"].as_f64().unwrap() > 0.0,
        "{report}"
    );
}

/// Issue 26 item 4: `bench --waiters N` holds N clients waiting for their
/// results: blocked in `tasks/result` (2025-11-25), or with `--listen`
/// each following its own task on a `subscriptions/listen` stream
/// (2026-07-28). It says `ready` with N once every stream is open, and the
/// broker counts them open (its SSE streams gauge) until the holder leaves.
#[tokio::test]
async fn issue26_bench_holds_waiters_of_both_generations() {
    let server = Server::start(&["--initialize-rate", "0"]);
    let cli = Cli::new();
    let metrics = server.url.replace("/mcp", "/metrics");
    let open_streams = || async {
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("taskbroker_sse_streams_open "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no taskbroker_sse_streams_open in {text}"))
    };
    for listen in [false, true] {
        let mut cmd = cli.command();
        cmd.args(["bench", "--url", &server.url, "--tool", "sleep"])
            .args(["--args", r#"{"seconds":3600}"#, "--waiters", "12"])
            .args(["--hold-secs", "4"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if listen {
            cmd.arg("--listen");
        }
        let mut holder = cmd.spawn().unwrap();
        let mut stdout = holder.stdout.take().unwrap();
        let mut first = Vec::new();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            let mut buf = [0u8; 1024];
            while !first.contains(&b'\n') {
                let n = stdout.read(&mut buf).await.unwrap();
                assert!(
                    n > 0,
                    "ended before ready: {}",
                    String::from_utf8_lossy(&first)
                );
                first.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        assert!(ready.is_ok(), "not ready within 30 s (listen: {listen})");
        let report: Value = serde_json::from_slice(&first).unwrap();
        assert_eq!(report["ready"], 12, "listen: {listen}: {report}");
        assert_eq!(open_streams().await, 12.0, "listen: {listen}");
        let status = tokio::time::timeout(Duration::from_secs(30), holder.wait())
            .await
            .expect("the holder leaves after --hold-secs")
            .unwrap();
        assert_eq!(status.code(), Some(0), "listen: {listen}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while open_streams().await != 0.0 {
            assert!(
                Instant::now() < deadline,
                "streams still open after the holder left"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// `taskbroker call approve` with `args` (in `protocol`, as a task or not)
/// and its stdin closed (not a terminal).
async fn approve(cli: &Cli, url: &str, protocol: &str, task: bool, extra: &[&str]) -> Out {
    let mut args = vec![
        "call",
        "approve",
        "--args",
        r#"{"question":"Ship it?"}"#,
        "--protocol",
        protocol,
    ];
    if task {
        args.push("--task");
    }
    args.extend_from_slice(extra);
    cli.run(url, &args).await
}

/// Issue item 5: the CLI answers a tool's questions itself, in both
/// protocol generations, plain and as a task (2025: elicitation/create on
/// the session's stream, declared at initialize; 2026: the input_required
/// retry of a plain call, tasks/update for a task). `--input` answers
/// without a terminal, checked against the question's schema: a wrong type
/// or an unknown field is a usage error (exit 2) naming the field; no
/// `--input` with a stdin that is not a terminal is exit 2 with the
/// `--input` to pass; a task left waiting is answered later by `tasks
/// result ID --input`.
#[tokio::test]
async fn item5_call_answers_elicitation_from_input_or_says_how() {
    let server = Server::start(&[]);
    let cli = Cli::new();
    let url = server.url.as_str();
    for protocol in ["2025-11-25", "2026-07-28"] {
        for task in [false, true] {
            let what = format!("{protocol} task={task}");
            let out = approve(
                &cli,
                url,
                protocol,
                task,
                &["--input", r#"{"approved":true}"#],
            )
            .await;
            assert_eq!(out.code, Some(0), "{what}: {out:?}");
            assert_eq!(out.stdout.trim(), "approved", "{what}: {out:?}");
            let out = approve(
                &cli,
                url,
                protocol,
                task,
                &["--input", r#"{"approved":false}"#],
            )
            .await;
            assert_eq!(out.stdout.trim(), "not approved", "{what}: {out:?}");

            let out = approve(&cli, url, protocol, task, &[]).await;
            assert_eq!(out.code, Some(2), "{what}: {out:?}");
            assert!(
                out.stderr.contains("stdin is not a terminal")
                    && out.stderr.contains(r#"--input '{"approved":true}'"#),
                "{what}: {out:?}"
            );

            for (input, says) in [
                (r#"{"approved":"yes"}"#, "approved"),
                (
                    r#"{"approved":true,"colour":"red"}"#,
                    "unknown field 'colour'",
                ),
                ("{}", "required"),
            ] {
                let out = approve(&cli, url, protocol, task, &["--input", input]).await;
                assert_eq!(out.code, Some(2), "{what} {input}: {out:?}");
                assert!(
                    out.stderr.contains("--input does not answer") && out.stderr.contains(says),
                    "{what} {input}: {out:?}"
                );
            }
        }
    }

    // Two questions at once (`also`): one --input answers both.
    for protocol in ["2025-11-25", "2026-07-28"] {
        let out = cli
            .run(
                url,
                &[
                    "call",
                    "approve",
                    "--args",
                    r#"{"question":"Ship it?","also":"Really?"}"#,
                    "--input",
                    r#"{"approved":true}"#,
                    "--protocol",
                    protocol,
                    "--task",
                ],
            )
            .await;
        assert_eq!(out.code, Some(0), "{protocol}: {out:?}");
        assert_eq!(out.stdout.trim(), "approved", "{protocol}: {out:?}");
    }

    // A task left waiting for its answer is answered by `tasks result`.
    for protocol in ["2025-11-25", "2026-07-28"] {
        let out = approve(&cli, url, protocol, true, &[]).await;
        assert_eq!(out.code, Some(2), "{out:?}");
        let later = out
            .stderr
            .lines()
            .find_map(|l| l.split("give it later with: ").nth(1))
            .unwrap_or_else(|| panic!("no follow-up command: {out:?}"));
        let id = later.split_whitespace().nth(3).unwrap().to_owned();
        let out = cli
            .run(
                url,
                &[
                    "tasks",
                    "result",
                    &id,
                    "--protocol",
                    protocol,
                    "--input",
                    r#"{"approved":true}"#,
                ],
            )
            .await;
        assert_eq!(out.code, Some(0), "{protocol}: {out:?}");
        let result: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(result["content"][0]["text"], "approved", "{out:?}");
    }
}

/// Whether util-linux `script` is here to make a pseudo-terminal (else the
/// terminal tests say they are skipped).
fn has_script() -> bool {
    let here = std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !here {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipping the terminal test: no `script` (util-linux) here"
        );
    }
    here
}

/// `line` (a shell command) run by `script` on a pseudo-terminal, with the
/// CLI's state in `cli`'s folders and every pipe captured.
fn on_a_terminal(cli: &Cli, line: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("script");
    cmd.args(["-qec", line, "/dev/null"])
        .env_remove("TASKBROKER_URL")
        .env_remove("TASKBROKER_TOKEN")
        .env_remove("RUST_LOG")
        .env("XDG_STATE_HOME", cli.state_home())
        .env("HOME", cli.dir.path().join("home"))
        .current_dir(cli.cwd())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Issue 23 item 5: Ctrl-C while the CLI waits for an answer on the
/// terminal ends the command with exit 130, as Ctrl-C does while it waits
/// for a result (the blocked read of the terminal does not hold it).
#[tokio::test]
async fn item5_ctrl_c_at_a_question_exits_130() {
    if !has_script() {
        return;
    }
    use tokio::io::AsyncReadExt;
    let server = Server::start(&[]);
    let cli = Cli::new();
    let line = format!(
        "{} call approve --args '{{\"question\":\"Ship it?\"}}' --url {}",
        env!("CARGO_BIN_EXE_taskbroker"),
        server.url
    );
    let mut child = on_a_terminal(&cli, &line).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // Wait until the question is on the terminal, then press Ctrl-C.
    let mut seen = Vec::new();
    let asked = tokio::time::timeout(Duration::from_secs(60), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "ended before asking: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&seen).contains("[y/n]") {
                break;
            }
        }
    })
    .await;
    assert!(
        asked.is_ok(),
        "never asked: {}",
        String::from_utf8_lossy(&seen)
    );
    stdin.write_all(b"\x03").await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("Ctrl-C ended the command within 30 s")
        .unwrap();
    assert_eq!(
        status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&seen)
    );
}

/// Issue item 5: on a terminal (a real pseudo-terminal, made by util-linux
/// `script`) the CLI asks each field of the question itself: a typed
/// answer that does not fit the field's type is asked again, `y` answers
/// it, and the call completes; plain and as a task, in both generations.
#[tokio::test]
async fn item5_call_asks_the_question_on_a_terminal() {
    if !has_script() {
        return;
    }
    let server = Server::start(&[]);
    let cli = Cli::new();
    for protocol in ["2025-11-25", "2026-07-28"] {
        for task in ["", " --task"] {
            let line = format!(
                "{} call approve --args '{{\"question\":\"Ship it?\"}}' --url {} --protocol {protocol}{task}",
                env!("CARGO_BIN_EXE_taskbroker"),
                server.url
            );
            let mut child = on_a_terminal(&cli, &line).spawn().unwrap();
            let mut stdin = child.stdin.take().unwrap();
            // Typed ahead: the terminal keeps the lines until they are read.
            stdin.write_all(b"maybe\ny\n").await.unwrap();
            drop(stdin);
            let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
                .await
                .expect("finished within 60 s")
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let what = format!("{protocol}{task}");
            assert_eq!(out.status.code(), Some(0), "{what}: {text}");
            assert!(
                text.contains("the tool asks: Ship it?") && text.contains("[y/n]"),
                "{what}: {text}"
            );
            assert!(
                text.contains("answer y or n"),
                "{what}: asked again: {text}"
            );
            assert!(
                text.trim_end().ends_with("approved"),
                "{what}: the result last: {text}"
            );
        }
    }
}

/// Issue item 5: a session stored by an earlier version of the CLI was
/// opened without declaring elicitation (a question would fail in it):
/// `call` replaces it by a new session that does, and the question is
/// answered; `tasks` keeps using the stored one (its tasks stay in view).
#[tokio::test]
async fn item5_a_stored_session_without_elicitation_is_replaced_by_call() {
    let server = Server::start(&[]);
    let cli = Cli::new();
    let (mut old, old_sid) = session(&server).await;
    let earlier = old.call_task("sleep", json!({"seconds": 0})).await;
    let earlier = earlier["taskId"].as_str().unwrap().to_owned();
    old.wait_terminal(&earlier, Duration::from_secs(10)).await;
    let file = cli.state_file();
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let stored = json!({ "brokers": { &server.url: { "session": old_sid } } });
    std::fs::write(&file, stored.to_string()).unwrap();

    let out = cli.run(&server.url, &["tasks", "list"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        out.stdout.contains(&earlier),
        "tasks keeps the session: {out:?}"
    );
    assert_eq!(
        stored_session(&cli, &server.url).as_deref(),
        Some(old_sid.as_str())
    );

    let out = approve(
        &cli,
        &server.url,
        "2025-11-25",
        false,
        &["--input", r#"{"approved":true}"#],
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "approved", "{out:?}");
    let new_sid = stored_session(&cli, &server.url).unwrap();
    assert_ne!(new_sid, old_sid, "{}", state(&cli));
    assert_eq!(
        state(&cli)["brokers"][&server.url]["answers_questions"],
        true
    );
    let out = approve(
        &cli,
        &server.url,
        "2025-11-25",
        true,
        &["--input", r#"{"approved":true}"#],
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(
        stored_session(&cli, &server.url),
        Some(new_sid),
        "the new session is kept"
    );
}
