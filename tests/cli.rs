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

/// `taskbroker` with a clean environment (no TASKBROKER_URL, no RUST_LOG).
fn taskbroker() -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskbroker"));
    c.env_remove("TASKBROKER_URL")
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    c
}

/// Run `taskbroker ARGS --url URL` to the end (stdin closed).
async fn run(url: &str, args: &[&str]) -> Out {
    let mut cmd = taskbroker();
    cmd.args(args).arg("--url").arg(url).stdin(Stdio::null());
    output(cmd).await
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

/// A session made outside the CLI (left open), for `--session`.
async fn session(server: &Server) -> (Client, String) {
    let client = server.client().await;
    let sid = client.session.clone().unwrap();
    (client, sid)
}

#[tokio::test]
async fn plain_echo_prints_its_arguments_and_json_prints_the_whole_result() {
    let server = Server::start(&[]);
    let out = run(
        &server.url,
        &["call", "echo", "--args", r#"{"a":1,"b":"x"}"#],
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "{\"a\":1,\"b\":\"x\"}\n");
    // Not a terminal: no progress bar noise.
    assert_eq!(out.stderr, "");

    let out = run(
        &server.url,
        &["call", "echo", "--args", r#"{"a":1}"#, "--json"],
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["content"][0]["text"], r#"{"a":1}"#);
    assert_eq!(result["structuredContent"], json!({"a": 1}));

    // TASKBROKER_URL stands in for --url; --args defaults to {}.
    let mut cmd = taskbroker();
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
    let server = Server::start(&[]);
    let started = Instant::now();
    let out = run(
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
    let server = Server::start(&["--poll-interval", "200"]);
    let out = run(
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

    let out = run(
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
async fn failures_exit_1_with_the_message_on_stderr() {
    let server = Server::start(&["--poll-interval", "200"]);
    let out = run(&server.url, &["call", "fail", "--task"]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr.contains("the fail tool failed, as asked"),
        "{out:?}"
    );

    let out = run(
        &server.url,
        &["call", "fail", "--args", r#"{"message":"boom"}"#],
    )
    .await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("boom"), "{out:?}");

    let out = run(&server.url, &["call", "nope"]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32602"), "{out:?}");
    assert!(out.stderr.contains("nope"), "{out:?}");

    // T-5: sleep_as_task requires a task.
    let out = run(
        &server.url,
        &["call", "sleep_as_task", "--args", r#"{"seconds":0}"#],
    )
    .await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32601"), "{out:?}");

    // T-4: echo forbids tasks.
    let out = run(&server.url, &["call", "echo", "--task"]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32601"), "{out:?}");

    // Invalid arguments: a tool result with isError (plain), a failed task.
    let out = run(
        &server.url,
        &["call", "sleep", "--args", r#"{"seconds":"x"}"#, "--task"],
    )
    .await;
    assert_eq!(out.code, Some(1), "{out:?}");
}

#[tokio::test]
async fn usage_errors_exit_2_and_an_unreachable_server_exits_3() {
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
        let out = run(&dead, &args).await;
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        assert!(out.stderr.contains("--"), "{out:?}");
    }
    let out = run(&dead, &["call", "echo", "--args", "{"]).await;
    assert!(out.stderr.contains("not valid JSON"), "{out:?}");
    for url in ["https://127.0.0.1/mcp", "not a url"] {
        let out = run(url, &["call", "echo"]).await;
        assert_eq!(out.code, Some(2), "{url}: {out:?}");
    }
    for args in [
        vec!["call", "echo"],
        vec!["call", "sleep", "--task"],
        vec!["tasks", "list"],
    ] {
        let out = run(&dead, &args).await;
        assert_eq!(out.code, Some(3), "{args:?}: {out:?}");
        assert!(out.stderr.contains("cannot reach"), "{out:?}");
    }
}

/// Covers T-14/T-16 (tasks result), T-17 (paging with nextCursor), T-21
/// (cancel), T-35/T-36 (another session's task is not found).
#[tokio::test]
async fn tasks_subcommands_work_on_a_given_session() {
    let server = Server::start(&["--page-size", "2", "--poll-interval", "200"]);
    let (mut c, sid) = session(&server).await;
    let out = run(
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
    let out = run(&server.url, &["tasks", "list", "--session", &sid]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 2, "{out:?}");
    assert!(out.stderr.contains("--all"), "{out:?}");
    let out = run(&server.url, &["tasks", "list", "--all", "--session", &sid]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out:?}");
    assert!(lines[0].starts_with(&long), "newest first: {lines:?}");
    let mine = lines.iter().find(|l| l.starts_with(&task)).unwrap();
    assert!(mine.contains("completed"), "{mine}");

    let out = run(&server.url, &["tasks", "get", &task, "--session", &sid]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let got: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(got["taskId"], json!(task));
    assert_eq!(got["status"], "completed");

    let out = run(&server.url, &["tasks", "result", &task, "--session", &sid]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let result: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(result["content"][0]["text"], "one");
    assert_eq!(result["_meta"][RELATED]["taskId"], json!(task));

    // T-21: cancel answers with the cancelled task; its result is -32800.
    let out = run(&server.url, &["tasks", "cancel", &long, "--session", &sid]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let cancelled: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    let out = run(&server.url, &["tasks", "result", &long, "--session", &sid]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("-32800"), "{out:?}");

    // T-35/T-36: a new session sees none of them, and says why.
    let out = run(&server.url, &["tasks", "list"]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("--session"), "{out:?}");
    let out = run(&server.url, &["tasks", "get", &task]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("not found"), "{out:?}");
    assert!(out.stderr.contains("--session"), "{out:?}");

    // An unknown session is refused (HTTP 404).
    let out = run(&server.url, &["tasks", "list", "--session", "nosuch"]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("Session not found"), "{out:?}");
}

/// The session `call` made for itself is ended (DELETE) when it is done.
#[tokio::test]
async fn call_ends_its_own_session() {
    let server = Server::start(&["--poll-interval", "200"]);
    let out = run(
        &server.url,
        &["call", "sleep", "--args", r#"{"seconds":0}"#, "--task"],
    )
    .await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let (_, sid) = task_and_session(&out.stderr);
    let out = run(&server.url, &["tasks", "list", "--session", &sid]).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("Session not found"), "{out:?}");
}

/// A `taskbroker` run with stdin piped and stderr collected as it comes.
struct Live {
    child: tokio::process::Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Live {
    fn start(url: &str, args: &[&str]) -> Self {
        let mut cmd = taskbroker();
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
    let server = Server::start(&["--poll-interval", "200"]);
    let args = ["call", "sleep", "--args", r#"{"seconds":30}"#, "--task"];

    let mut live = Live::start(&server.url, &args);
    let (task, sid) = task_and_session(&live.wait_for(")\n").await);
    live.interrupt();
    live.wait_for(&format!("Cancel task {task}? [y/N]")).await;
    live.answer("n\n").await;
    assert_eq!(live.exit_code().await, Some(130));
    let stderr = live.stderr();
    assert!(
        stderr.contains(&format!(
            "taskbroker tasks result {task} --session {sid} --url {}",
            server.url
        )),
        "{stderr}"
    );
    let out = run(&server.url, &["tasks", "get", &task, "--session", &sid]).await;
    assert_eq!(out.code, Some(0), "the session was kept: {out:?}");
    let got: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(got["status"], "working");

    let (mut c, sid) = session(&server).await;
    let mut args = args.to_vec();
    args.extend(["--session", &sid]);
    let mut live = Live::start(&server.url, &args);
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
    let server = Server::start(&[]);
    let sessions = || server.log().matches("taskbroker-cli").count();
    let before = sessions();
    let mut live = Live::start(
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
    let server = Server::start(&["--conformance-tools"]);
    let mut cmd = taskbroker();
    cmd.args(["call", "test_reconnection", "--url", &server.url])
        .env("RUST_LOG", "taskbroker::client=debug")
        .stdin(Stdio::null());
    let out = output(cmd).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "Reconnection test completed successfully\n");
    assert!(out.stderr.contains("resuming"), "{out:?}");
}
