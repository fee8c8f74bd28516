//! The upstream MCP client (`taskbroker::upstream`) against a real MCP
//! server this project did not write, started as a user would start it:
//! `@modelcontextprotocol/server-everything` over stdio
//! (`node <package>/dist/index.js stdio`), plus a missing program and a
//! "server" that prints garbage.
//!
//! The server is installed in `tests/upstream/node_modules` by `npm ci`
//! (`.ci/run` does it). Without it (or without node) every test here is
//! skipped with one line on stderr, unless `TASKBROKER_REQUIRE_UPSTREAMS=1`
//! (CI sets it): then they fail.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::server_everything;
use serde_json::{Value, json};
use taskbroker::mcp::{ErrorCode, LogLevel, RpcError};
use taskbroker::upstream::session::IgnoreAll;
use taskbroker::upstream::{
    AnswerFuture, CallError, CallHandler, ServerRequest, Session, SessionOptions, StartError,
    StdioSpec,
};
use tokio_util::sync::CancellationToken;

fn spec(name: &str, argv: &[&str]) -> StdioSpec {
    StdioSpec {
        name: name.to_owned(),
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: BTreeMap::new(),
        working_dir: None,
        kill_grace: Duration::from_secs(2),
    }
}

/// server-everything over stdio, initialized; `None` when skipped.
async fn everything() -> Option<Session> {
    let script = server_everything()?;
    let spec = spec("everything", &["node", script.to_str()?, "stdio"]);
    Some(
        Session::start_stdio(&spec, SessionOptions::default())
            .await
            .unwrap(),
    )
}

/// The text of a CallToolResult's first content item.
fn text_of(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// Records what reaches a call; answers questions with `answer` after
/// `answer_after`.
#[derive(Default)]
struct Recorder {
    /// What happened, in order: `progress 1/3`, `request elicitation/create`.
    events: Mutex<Vec<String>>,
    /// The questions asked (method, params).
    asked: Mutex<Vec<(String, Value)>>,
    /// The logs routed to the call (level, data).
    logs: Mutex<Vec<(LogLevel, Value)>>,
    /// The answer to give.
    answer: Option<Value>,
    /// How long to wait before answering.
    answer_after: Duration,
}

impl Recorder {
    fn answering(answer: Value, after: Duration) -> Arc<Self> {
        Arc::new(Self {
            answer: Some(answer),
            answer_after: after,
            ..Self::default()
        })
    }
    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }
}

impl CallHandler for Recorder {
    fn progress(&self, progress: f64, total: Option<f64>, _message: Option<String>) {
        let total = total.map(|t| t.to_string()).unwrap_or_default();
        self.events
            .lock()
            .unwrap()
            .push(format!("progress {progress}/{total}"));
    }
    fn log(&self, level: LogLevel, _logger: Option<String>, data: Value) {
        self.logs.lock().unwrap().push((level, data));
    }
    fn request(&self, request: ServerRequest) -> AnswerFuture {
        self.events
            .lock()
            .unwrap()
            .push(format!("request {}", request.method));
        self.asked
            .lock()
            .unwrap()
            .push((request.method.clone(), request.params.clone()));
        let answer = self.answer.clone();
        let after = self.answer_after;
        Box::pin(async move {
            tokio::time::sleep(after).await;
            answer.ok_or_else(|| RpcError::new(ErrorCode::InternalError, "no answer"))
        })
    }
}

async fn call(session: &Session, name: &str, arguments: Value) -> Result<Value, CallError> {
    session
        .call_tool(
            name,
            arguments,
            Arc::new(IgnoreAll),
            &CancellationToken::new(),
        )
        .await
}

#[tokio::test]
async fn initialize_keeps_what_the_server_declared_and_lists_its_tools() {
    let Some(session) = everything().await else {
        return;
    };
    assert_eq!(session.protocol_version(), "2025-11-25");
    assert_eq!(session.server_info()["name"], "mcp-servers/everything");
    let capabilities = session.capabilities();
    assert_eq!(capabilities["tools"]["listChanged"], true);
    assert!(capabilities["tasks"]["requests"]["tools"]["call"].is_object());
    assert!(session.runs_tool_calls_as_tasks());

    // Tools it registers for the client's declared capabilities come with
    // notifications/tools/list_changed, which the owner can wait on.
    let mut changed = session.tools_changed();
    tokio::time::timeout(Duration::from_secs(5), changed.wait_for(|count| *count > 0))
        .await
        .expect("notifications/tools/list_changed arrives")
        .unwrap();

    let tools = session.list_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(tools.len() >= 15, "{names:?}");
    for name in [
        "echo",
        "trigger-long-running-operation",
        "trigger-elicitation-request",
        "trigger-sampling-request",
        "simulate-research-query",
        "get-roots-list",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    for tool in &tools {
        assert!(tool["inputSchema"].is_object(), "{tool}");
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
    }
}

#[tokio::test]
async fn echo_returns_its_text_and_a_server_error_is_kept_whole() {
    let Some(session) = everything().await else {
        return;
    };
    let result = call(&session, "echo", json!({ "message": "hello upstream" }))
        .await
        .unwrap();
    assert_eq!(text_of(&result), "Echo: hello upstream");

    // The server's own JSON-RPC error comes back as a value, not as a lost
    // connection; the session goes on.
    match session.request("no/such-method", json!({})).await {
        Err(CallError::Upstream { upstream, error }) => {
            assert_eq!(&*upstream, "everything");
            assert_eq!(error.code, ErrorCode::MethodNotFound);
        }
        other => panic!("{other:?}"),
    }
    let again = call(&session, "echo", json!({ "message": "still here" }))
        .await
        .unwrap();
    assert_eq!(text_of(&again), "Echo: still here");
}

#[tokio::test]
async fn progress_reaches_the_calls_handler_before_the_result() {
    let Some(session) = everything().await else {
        return;
    };
    let recorder = Arc::new(Recorder::default());
    let result = session
        .call_tool(
            "trigger-long-running-operation",
            json!({ "duration": 3, "steps": 3 }),
            recorder.clone(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    // Recorded before call_tool returned: each came before the result.
    assert_eq!(
        recorder.events(),
        ["progress 1/3", "progress 2/3", "progress 3/3"]
    );
    assert!(
        text_of(&result).contains("Duration: 3 seconds, Steps: 3"),
        "{result}"
    );
}

#[tokio::test]
async fn an_elicitation_reaches_the_handler_and_its_late_answer_goes_back() {
    let Some(session) = everything().await else {
        return;
    };
    let answer =
        json!({ "action": "accept", "content": { "name": "Ada Lovelace", "check": true } });
    let recorder = Recorder::answering(answer, Duration::from_millis(1500));
    let started = Instant::now();
    let result = session
        .call_tool(
            "trigger-elicitation-request",
            json!({}),
            recorder.clone(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!(recorder.events(), ["request elicitation/create"]);
    let asked = recorder.asked.lock().unwrap().clone();
    assert!(asked[0].1["requestedSchema"]["properties"]["name"].is_object());
    let texts: Vec<&str> = result["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect();
    let all = texts.join("\n");
    assert!(all.contains("- Name: Ada Lovelace"), "{result}");
    assert!(all.contains("- Agreed to terms: true"), "{result}");
}

#[tokio::test]
async fn two_calls_at_once_on_one_connection_both_answer() {
    let Some(session) = everything().await else {
        return;
    };
    let (a, b) = tokio::join!(
        call(&session, "echo", json!({ "message": "first" })),
        call(&session, "echo", json!({ "message": "second" })),
    );
    assert_eq!(text_of(&a.unwrap()), "Echo: first");
    assert_eq!(text_of(&b.unwrap()), "Echo: second");
    // And a quick call is not held up by a long one on the same session.
    let long_session = session.clone();
    let long = tokio::spawn(async move {
        call(
            &long_session,
            "trigger-long-running-operation",
            json!({ "duration": 2, "steps": 1 }),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let quick = call(&session, "echo", json!({ "message": "quick" }))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(text_of(&quick), "Echo: quick");
    assert!(long.await.unwrap().is_ok());
}

#[tokio::test]
async fn a_cancel_sends_notifications_cancelled_and_ends_the_call_at_once() {
    let Some(script) = server_everything() else {
        return;
    };
    // What the broker writes to the server is kept by tee on its way there.
    let dir = tempfile::tempdir().unwrap();
    let wire = dir.path().join("stdin.jsonl");
    let command = format!(
        "tee '{}' | exec node '{}' stdio",
        wire.display(),
        script.display()
    );
    let spec = spec("everything", &["sh", "-c", &command]);
    let session = Session::start_stdio(&spec, SessionOptions::default())
        .await
        .unwrap();
    let recorder = Arc::new(Recorder::default());
    let cancel = CancellationToken::new();
    let cancel_later = cancel.clone();
    let watcher = recorder.clone();
    tokio::spawn(async move {
        // Cancel once the call is surely running: after its first progress.
        while watcher.events().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        cancel_later.cancel();
    });
    let started = Instant::now();
    let outcome = session
        .call_tool(
            "trigger-long-running-operation",
            json!({ "duration": 20, "steps": 20 }),
            recorder.clone(),
            &cancel,
        )
        .await;
    match outcome {
        Err(CallError::Cancelled { upstream }) => assert_eq!(&*upstream, "everything"),
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // The request and its cancellation, with the same id, on the wire.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (call_id, cancelled) = loop {
        let lines: Vec<Value> = std::fs::read_to_string(&wire)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let call_id = lines
            .iter()
            .find(|m| m["method"] == "tools/call")
            .map(|m| m["id"].clone());
        let cancelled = lines
            .iter()
            .find(|m| m["method"] == "notifications/cancelled")
            .cloned();
        if let (Some(id), Some(c)) = (call_id, cancelled) {
            break (id, c);
        }
        assert!(
            Instant::now() < deadline,
            "no notifications/cancelled in {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(cancelled["params"]["requestId"], call_id);
    assert!(cancelled["params"]["reason"].is_string());
    // The session goes on after a cancel (the upstream's tool may still run).
    let echo = call(&session, "echo", json!({ "message": "after" }))
        .await
        .unwrap();
    assert_eq!(text_of(&echo), "Echo: after");
}

/// Poll `tasks/get` until the task is in one of `statuses`.
async fn task_until(session: &Session, task_id: &str, statuses: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let task = session.task_get(task_id).await.unwrap();
        let status = task["status"].as_str().unwrap_or_default();
        if statuses.contains(&status) {
            return task;
        }
        assert!(Instant::now() < deadline, "task stuck: {task}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn the_upstreams_own_task_is_created_followed_and_its_result_read() {
    let Some(session) = everything().await else {
        return;
    };
    let created = session
        .call_tool_as_task(
            "simulate-research-query",
            json!({ "topic": "rust" }),
            60_000,
        )
        .await
        .unwrap();
    let task_id = created["task"]["taskId"].as_str().unwrap().to_owned();
    assert_eq!(created["task"]["status"], "working");
    let task = task_until(&session, &task_id, &["completed", "failed", "cancelled"]).await;
    assert_eq!(task["status"], "completed", "{task}");
    let result = session
        .task_result(&task_id, Arc::new(IgnoreAll), &CancellationToken::new())
        .await
        .unwrap();
    assert!(text_of(&result).contains("Research Report"), "{result}");
}

#[tokio::test]
async fn a_question_about_an_upstream_task_reaches_the_call_following_it() {
    let Some(session) = everything().await else {
        return;
    };
    let created = session
        .call_tool_as_task(
            "simulate-research-query",
            json!({ "topic": "python", "ambiguous": true }),
            60_000,
        )
        .await
        .unwrap();
    let task_id = created["task"]["taskId"].as_str().unwrap().to_owned();
    task_until(&session, &task_id, &["input_required"]).await;
    // Another call open at the same time: the question is still routed
    // by its related-task _meta, not refused as ambiguous.
    let other = session.clone();
    let long = tokio::spawn(async move {
        call(
            &other,
            "trigger-long-running-operation",
            json!({ "duration": 3, "steps": 1 }),
        )
        .await
    });
    let answer = json!({ "action": "accept", "content": { "interpretation": "snake" } });
    let recorder = Recorder::answering(answer, Duration::from_millis(300));
    let result = session
        .task_result(&task_id, recorder.clone(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(recorder.events(), ["request elicitation/create"]);
    let asked = recorder.asked.lock().unwrap().clone();
    assert!(
        asked[0].1.get("_meta").is_none(),
        "related-task _meta is taken off: {}",
        asked[0].1
    );
    assert!(text_of(&result).contains("snake"), "{result}");
    assert!(long.await.unwrap().is_ok());
}

#[tokio::test]
async fn a_killed_server_fails_the_open_call_as_lost_naming_the_upstream() {
    let Some(session) = everything().await else {
        return;
    };
    let pid = session.pid().unwrap();
    let recorder = Arc::new(Recorder::default());
    let running = session.clone();
    let handler = recorder.clone();
    let call = tokio::spawn(async move {
        running
            .call_tool(
                "trigger-long-running-operation",
                json!({ "duration": 20, "steps": 20 }),
                handler,
                &CancellationToken::new(),
            )
            .await
    });
    while recorder.events().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_at = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the open call ends when the server dies")
        .unwrap();
    assert!(killed_at.elapsed() < Duration::from_secs(3));
    let error = outcome.unwrap_err();
    assert!(matches!(error, CallError::Lost { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("upstream 'everything'"), "{message}");
    assert!(message.contains("SIGKILL"), "{message}");
    // The session says so, and later requests fail the same way at once.
    assert!(session.closed().await.contains("SIGKILL"));
    let later = session.request("ping", json!({})).await.unwrap_err();
    assert!(matches!(later, CallError::Lost { .. }), "{later:?}");
}

#[tokio::test]
async fn a_missing_program_is_a_clear_error_at_start() {
    let spec = spec("ghost", &["/nonexistent/mcp-server", "stdio"]);
    let error = Session::start_stdio(&spec, SessionOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(error, StartError::Spawn { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("upstream 'ghost'"), "{message}");
    assert!(message.contains("/nonexistent/mcp-server"), "{message}");
    assert!(message.contains("No such file"), "{message}");
}

#[tokio::test]
async fn a_server_that_prints_garbage_fails_initialize_clearly() {
    let spec = spec("garbage", &["sh", "-c", "echo not-json; sleep 5"]);
    let options = SessionOptions {
        request_timeout: Duration::from_secs(2),
        ..SessionOptions::default()
    };
    let started = Instant::now();
    let error = Session::start_stdio(&spec, options).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(4));
    let message = error.to_string();
    assert!(
        message.contains("upstream 'garbage' did not answer initialize within 2s"),
        "{message}"
    );
    assert!(
        message.contains("not JSON") && message.contains("not-json"),
        "{message}"
    );

    // One that says garbage and exits: the error says it exited.
    let spec = self::spec(
        "garbage",
        &["sh", "-c", "echo '{\"jsonrpc\":\"2.0\"}'; exit 3"],
    );
    let error = Session::start_stdio(&spec, SessionOptions::default())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("connection to upstream 'garbage' lost") && message.contains("3"),
        "{message}"
    );
    assert!(message.contains("not a JSON-RPC message"), "{message}");
}

/// Set in the copy of this test binary that plays the broker in
/// `the_server_dies_with_the_broker_even_by_kill_9`: where to write the
/// server's pid.
const HOLDER_ENV: &str = "TASKBROKER_TEST_UPSTREAM_HOLDER";

/// Whether process `pid` is gone (or a zombie waiting to be reaped).
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn the_server_dies_with_the_broker_even_by_kill_9() {
    if let Some(pid_file) = std::env::var_os(HOLDER_ENV) {
        // The "broker": a session with a call in flight that writes
        // nothing until it ends (no progress token), so the server would
        // outlive both its stdin closing and its stdout breaking; then
        // wait to be killed.
        let session = everything().await.unwrap();
        let running = session.clone();
        tokio::spawn(async move {
            let arguments = json!({ "duration": 60, "steps": 60 });
            let params =
                json!({ "name": "trigger-long-running-operation", "arguments": arguments });
            running.request("tools/call", params).await
        });
        // Past the roots/list the server sends 350 ms after initialize.
        tokio::time::sleep(Duration::from_secs(1)).await;
        std::fs::write(pid_file, session.pid().unwrap().to_string()).unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        return;
    }
    if server_everything().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("server.pid");
    let mut broker = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "the_server_dies_with_the_broker_even_by_kill_9",
            "--exact",
            "--nocapture",
        ])
        .env(HOLDER_ENV, &pid_file)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let server_pid: u32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "the broker copy never started its server"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!is_gone(server_pid));
    broker.kill().unwrap(); // SIGKILL: no destructor runs
    broker.wait().unwrap();
    let killed_at = Instant::now();
    while !is_gone(server_pid) {
        assert!(
            killed_at.elapsed() < Duration::from_secs(5),
            "the server (pid {server_pid}) outlived the broker"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_log_while_one_call_is_open_reaches_that_calls_handler() {
    let Some(session) = everything().await else {
        return;
    };
    // Past the log the server sends about roots, 350 ms after initialize.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let recorder = Arc::new(Recorder::default());
    // The tool sends its first simulated log at once, before its result.
    let result = session
        .call_tool(
            "toggle-simulated-logging",
            json!({}),
            recorder.clone(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(text_of(&result).contains("Started simulated"), "{result}");
    let logs = recorder.logs.lock().unwrap().clone();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(logs[0].1.as_str().unwrap().contains("message"), "{logs:?}");
}

#[tokio::test]
async fn a_question_no_call_can_be_told_to_own_is_refused_saying_why() {
    let Some(session) = everything().await else {
        return;
    };
    let long = Arc::new(Recorder::default());
    let running = session.clone();
    let long_handler = long.clone();
    let cancel = CancellationToken::new();
    let long_cancel = cancel.clone();
    let long_call = tokio::spawn(async move {
        running
            .call_tool(
                "trigger-long-running-operation",
                json!({ "duration": 10, "steps": 10 }),
                long_handler,
                &long_cancel,
            )
            .await
    });
    while long.events().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Two calls open, a plain elicitation/create names neither: refused,
    // and neither handler is asked.
    let asker = Recorder::answering(json!({ "action": "decline" }), Duration::ZERO);
    let outcome = session
        .call_tool(
            "trigger-elicitation-request",
            json!({}),
            asker.clone(),
            &CancellationToken::new(),
        )
        .await;
    let shown = match outcome {
        Ok(result) => {
            assert_eq!(result["isError"], true, "{result}");
            result.to_string()
        }
        Err(CallError::Upstream { error, .. }) => error.message,
        Err(other) => panic!("{other:?}"),
    };
    assert!(
        shown.contains("calls are open and the request names no task"),
        "{shown}"
    );
    assert!(asker.events().is_empty());
    assert!(long.events().iter().all(|e| e.starts_with("progress")));
    cancel.cancel();
    assert!(matches!(
        long_call.await.unwrap(),
        Err(CallError::Cancelled { .. })
    ));
}

#[tokio::test]
async fn an_upstream_task_is_cancelled_with_tasks_cancel() {
    let Some(session) = everything().await else {
        return;
    };
    let created = session
        .call_tool_as_task("simulate-research-query", json!({ "topic": "go" }), 60_000)
        .await
        .unwrap();
    let task_id = created["task"]["taskId"].as_str().unwrap();
    let cancelled = session.task_cancel(task_id).await.unwrap();
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let task = session.task_get(task_id).await.unwrap();
    assert_eq!(task["status"], "cancelled", "{task}");
}

/// A scripted stdio "server": answers initialize (id 1) with
/// `protocol_version`, then sends `lines`, then appends every line it
/// reads to `wire`, answers a tools/list (id 2) with one tool, and
/// answers a tools/call (id 2) by asking a question (id 9), withdrawing
/// it, and then giving the call's result.
fn scripted(protocol_version: &str, lines: &[&str], wire: &Path) -> StdioSpec {
    let mut script = String::from("read -r _init\n");
    script.push_str(&format!(
        "echo '{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"protocolVersion\":\"{protocol_version}\",\"capabilities\":{{}},\"serverInfo\":{{\"name\":\"scripted\",\"version\":\"0\"}}}}}}'\n"
    ));
    for line in lines {
        script.push_str(&format!("echo '{line}'\n"));
    }
    script.push_str(
        "while read -r line; do\n\
         printf '%s\\n' \"$line\" >> \"$0\"\n\
         case \"$line\" in *'\"method\":\"tools/list\"'*)\n\
         echo '{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"tools\":[{\"name\":\"only\",\"inputSchema\":{\"type\":\"object\"}}]}}';;\n\
         *'\"method\":\"tools/call\"'*)\n\
         echo '{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"elicitation/create\",\"params\":{\"message\":\"?\"}}'\n\
         sleep 0.5\n\
         echo '{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":9,\"reason\":\"timed out\"}}'\n\
         sleep 0.5\n\
         echo '{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"went on without an answer\"}]}}';;\n\
         esac\n\
         done\n",
    );
    let wire = wire.to_str().unwrap().to_owned();
    let mut spec = spec("scripted", &["sh", "-c", &script]);
    spec.argv.push(wire);
    spec
}

#[tokio::test]
async fn bad_input_is_ignored_and_the_servers_requests_are_answered_with_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let wire = dir.path().join("wire.jsonl");
    let spec = scripted(
        "2025-06-18",
        &[
            r#"{"jsonrpc":"2.0","id":"r-1","method":"roots/list"}"#,
            r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":6,"method":"resources/made-up"}"#,
            r#"{"jsonrpc":"2.0","id":7,"method":"elicitation/create","params":{"message":"?"}}"#,
            r#"{"jsonrpc":"2.0","id":77,"result":{}}"#,
            "garbage",
            r#"[1,2]"#,
            r#"{"jsonrpc":"2.0","method":"notifications/made-up"}"#,
        ],
        &wire,
    );
    let session = Session::start_stdio(&spec, SessionOptions::default())
        .await
        .unwrap();
    assert_eq!(session.protocol_version(), "2025-06-18");
    let tools = session.list_tools().await.unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["name"], "only");

    // The answers may be written after the tools/list request: wait for
    // the four of them.
    let deadline = Instant::now() + Duration::from_secs(5);
    let answers = loop {
        let answers: Vec<Value> = std::fs::read_to_string(&wire)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if answers.iter().filter(|m| m.get("method").is_none()).count() >= 4 {
            break answers;
        }
        assert!(Instant::now() < deadline, "answers missing: {answers:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let answer_to = |id: Value| {
        answers
            .iter()
            .find(|m| m["id"] == id && m.get("method").is_none())
            .cloned()
            .unwrap_or_else(|| panic!("no answer to {id} in {answers:?}"))
    };
    assert_eq!(answer_to(json!("r-1"))["result"], json!({ "roots": [] }));
    assert_eq!(answer_to(json!(5))["result"], json!({}));
    assert_eq!(answer_to(json!(6))["error"]["code"], -32601);
    // A question while no call is open: nobody to ask.
    let refused = answer_to(json!(7));
    assert_eq!(refused["error"]["code"], -32603);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no call is open"),
        "{refused}"
    );
    assert!(
        answers
            .iter()
            .any(|m| m["method"] == "notifications/initialized")
    );
}

#[tokio::test]
async fn a_protocol_version_this_client_does_not_speak_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let spec = scripted("2099-01-01", &[], &dir.path().join("wire.jsonl"));
    let error = Session::start_stdio(&spec, SessionOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(error, StartError::Version { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("upstream 'scripted' speaks MCP 2099-01-01")
            && message.contains("2025-11-25"),
        "{message}"
    );
}

/// A handler that never answers, and notes when its question is withdrawn.
#[derive(Default)]
struct NeverAnswers {
    withdrawn: Arc<Mutex<Vec<String>>>,
}

impl CallHandler for NeverAnswers {
    fn request(&self, request: ServerRequest) -> AnswerFuture {
        let withdrawn = self.withdrawn.clone();
        tokio::spawn(async move {
            request.withdrawn.cancelled().await;
            withdrawn.lock().unwrap().push(request.method);
        });
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn a_question_the_server_withdraws_is_withdrawn_from_the_handler_and_never_answered() {
    let dir = tempfile::tempdir().unwrap();
    let wire = dir.path().join("wire.jsonl");
    let spec = scripted("2025-11-25", &[], &wire);
    let session = Session::start_stdio(&spec, SessionOptions::default())
        .await
        .unwrap();
    let handler = Arc::new(NeverAnswers::default());
    let result = session
        .call_tool("ask", json!({}), handler.clone(), &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(text_of(&result), "went on without an answer");
    assert_eq!(*handler.withdrawn.lock().unwrap(), ["elicitation/create"]);
    // An answer written at the withdrawal would be in the file by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written: Vec<Value> = std::fs::read_to_string(&wire)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        !written.iter().any(|m| m["id"] == 9),
        "the withdrawn question was answered: {written:?}"
    );
}

/// Issue 25 item 5 over HTTP: a task created in the server session of an
/// earlier connection (a broker restarted since) is followed from a new
/// connection in that session, and the question the server asks about it
/// on that stream is answered in that session too, not in the new
/// connection's: the task then completes with the answer.
#[tokio::test]
async fn a_question_of_an_earlier_sessions_task_is_answered_in_that_session() {
    let Some(script) = server_everything() else {
        return;
    };
    let upstream = common::EverythingHttp::start(&script);
    let spec = taskbroker::upstream::HttpSpec {
        name: "web".to_owned(),
        url: upstream.url.parse().unwrap(),
        headers: BTreeMap::new(),
        bearer_token: None,
        protocol: taskbroker::upstream::HttpProtocol::Handshake,
    };
    let first = Session::start_http(&spec, SessionOptions::default())
        .await
        .unwrap();
    let created = first
        .call_tool_as_task(
            "simulate-research-query",
            json!({ "topic": "python", "ambiguous": true }),
            60_000,
        )
        .await
        .unwrap();
    let task_id = created["task"]["taskId"].as_str().unwrap().to_owned();
    task_until(&first, &task_id, &["input_required"]).await;
    let created_in = first.upstream_session_id().unwrap();
    drop(first);

    let second = Session::start_http(&spec, SessionOptions::default())
        .await
        .unwrap();
    assert_ne!(second.upstream_session_id().as_deref(), Some(&*created_in));
    let answer = json!({ "action": "accept", "content": { "interpretation": "snake" } });
    let recorder = Recorder::answering(answer, Duration::from_millis(100));
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        second.task_result_in(
            &task_id,
            Some(&created_in),
            recorder.clone(),
            &CancellationToken::new(),
        ),
    )
    .await
    .expect("the answer reached the task's session")
    .unwrap();
    assert_eq!(recorder.events(), ["request elicitation/create"]);
    assert!(text_of(&result).contains("snake"), "{result}");
}
