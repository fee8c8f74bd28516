//! Command tools: any program, any language, declared in the config file.
//!
//! Contract (README "Command tools"):
//! - arguments: one JSON object on stdin; env `TASKBROKER_TASK_ID` (empty for
//!   a plain call) and `TASKBROKER_ATTEMPT`.
//! - result: stdout. A JSON object with `content` is a CallToolResult; other
//!   JSON becomes text (plus structuredContent when it is an object);
//!   anything else is text. Output beyond the cap is cut, and the cut said.
//! - exit 0 = success; non-zero = `isError: true` with the tail of stderr;
//!   a timeout fails the call with a message that says so.
//! - progress, logs and status: JSON lines written to the file descriptor
//!   named by `TASKBROKER_EVENTS_FD` (`{"progress":3,"total":10,
//!   "message":"..."}`, `{"log":"...","level":"info"}`, `{"status":"..."}`).
//! - the program runs in its own process group; cancellation and timeout
//!   send TERM to the whole group, then KILL after a grace period.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use command_fds::{CommandFdExt, FdMapping};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{LogLevel, Tool, ToolContext, ToolDefinition, ToolFuture, ToolOutcome};
use crate::child_process::{GroupGuard, ReadLine, read_lines};
use crate::mcp::{ErrorCode, RpcError};

/// How to run one command tool.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// argv; `argv[0]` is the program (no shell).
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub working_dir: Option<PathBuf>,
    /// Longest run before the group is killed.
    pub timeout: Option<Duration>,
    /// Bytes of stdout kept.
    pub max_output: usize,
    /// Wait between TERM and KILL.
    pub kill_grace: Duration,
}

/// Bytes of stderr kept for an error result.
const STDERR_TAIL: usize = 4096;
/// The descriptor number events are written to, in the child.
const EVENTS_FD: i32 = 3;
/// Longest events line read; longer ones are skipped.
const EVENT_LINE_MAX: usize = 64 * 1024;

/// A tool that runs a program.
#[derive(Debug)]
pub struct CommandTool {
    def: ToolDefinition,
    spec: CommandSpec,
}

impl CommandTool {
    /// A command tool with this definition and spec.
    pub fn new(def: ToolDefinition, spec: CommandSpec) -> Self {
        Self { def, spec }
    }
}

impl Tool for CommandTool {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn call(&self, arguments: Value, ctx: ToolContext) -> ToolFuture<'_> {
        Box::pin(run(&self.def.name, &self.spec, arguments, ctx))
    }
}

/// Read all of `reader`, keeping the first `cap` bytes (and whether more came).
async fn read_capped(mut reader: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, cut),
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                cut |= n > room;
            }
        }
    }
}

/// Read all of `reader`, keeping the last `cap` bytes.
async fn read_tail(mut reader: impl AsyncRead + Unpin, cap: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > cap {
                    kept.drain(..kept.len() - cap);
                }
            }
        }
    }
}

/// Read JSON lines from the events pipe and hand them to the context.
async fn read_events(rx: tokio::net::unix::pipe::Receiver, ctx: ToolContext) {
    read_lines(rx, EVENT_LINE_MAX, |line| {
        if let ReadLine::Line(line) = line {
            apply_event(line, &ctx);
        }
    })
    .await;
}

/// One events line: `{"progress":..}`, `{"log":..}` or `{"status":..}`.
fn apply_event(line: &[u8], ctx: &ToolContext) {
    let Ok(event) = serde_json::from_slice::<Value>(line) else {
        tracing::debug!(line = %String::from_utf8_lossy(line), "events line is not JSON: ignored");
        return;
    };
    if let Some(progress) = event.get("progress").and_then(Value::as_f64) {
        let total = event.get("total").and_then(Value::as_f64);
        let message = event
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_owned);
        ctx.progress(progress, total, message);
    } else if let Some(data) = event.get("log") {
        let level = event
            .get("level")
            .and_then(Value::as_str)
            .and_then(LogLevel::parse)
            .unwrap_or(LogLevel::Info);
        ctx.log(level, data.clone());
    } else if let Some(status) = event.get("status").and_then(Value::as_str) {
        ctx.status(status);
    }
}

fn failure(message: String) -> ToolOutcome {
    ToolOutcome::Error(RpcError::new(ErrorCode::InternalError, message))
}

async fn run(name: &str, spec: &CommandSpec, arguments: Value, ctx: ToolContext) -> ToolOutcome {
    let mut command = tokio::process::Command::new(&spec.argv[0]);
    command
        .args(&spec.argv[1..])
        // The run's trace context (W3C names, set below), never one the
        // broker itself was started with.
        .env_remove("TRACEPARENT")
        .env_remove("TRACESTATE")
        .envs(&spec.env)
        .env("TASKBROKER_TASK_ID", ctx.task_id().unwrap_or(""))
        .env("TASKBROKER_ATTEMPT", ctx.attempt().to_string())
        .env("TASKBROKER_TOOL", name)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(trace) = ctx.trace() {
        command.env("TRACEPARENT", &trace.traceparent);
        if let Some(state) = &trace.tracestate {
            command.env("TRACESTATE", state);
        }
    }
    if let Some(dir) = &spec.working_dir {
        command.current_dir(dir);
    }
    // The events pipe: its write end becomes the child's descriptor 3. Both
    // ends are close-on-exec, so no other child inherits them.
    let events = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok((read, write)) => {
            let mapped = command.fd_mappings(vec![FdMapping {
                parent_fd: write,
                child_fd: EVENTS_FD,
            }]);
            match mapped {
                Ok(_) => {
                    command.env("TASKBROKER_EVENTS_FD", EVENTS_FD.to_string());
                    Some(read)
                }
                Err(e) => {
                    tracing::warn!(tool = name, error = %e, "no events descriptor");
                    None
                }
            }
        }
        Err(e) => {
            tracing::warn!(tool = name, error = %e, "no events pipe");
            None
        }
    };
    let spawned = command.spawn();
    // Dropping the command closes our copy of the pipe's write end, so the
    // reader sees EOF once the program (and its children) let go of it.
    drop(command);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return failure(format!(
                "tool '{name}': cannot start {:?}: {e}",
                spec.argv[0]
            ));
        }
    };
    let events = events
        .and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok())
        .map(|rx| tokio::spawn(read_events(rx, ctx.clone())));
    let mut guard = GroupGuard::new(child.id(), spec.kill_grace);
    if let Some(mut stdin) = child.stdin.take() {
        let input = arguments.to_string();
        // Written on the side: a program that does not read its stdin (or
        // reads it slowly) must not stall the timeout, cancellation or the
        // reading of its output. Not reading it is not an error.
        tokio::spawn(async move {
            let _ = stdin.write_all(input.as_bytes()).await;
        });
    }
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return failure(format!("tool '{name}': no pipes to the process"));
    };
    let stdout = tokio::spawn(read_capped(stdout, spec.max_output));
    let stderr = tokio::spawn(read_tail(stderr, STDERR_TAIL));
    let timeout = async {
        match spec.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let status = tokio::select! {
        status = child.wait() => status,
        _ = timeout => {
            guard.terminate();
            let _ = child.wait().await;
            let limit = spec.timeout.map(|t| humantime::format_duration(t).to_string()).unwrap_or_default();
            return failure(format!("tool '{name}' timed out after {limit}; its process group was killed"));
        }
        _ = ctx.cancelled().cancelled() => {
            guard.terminate();
            let _ = child.wait().await;
            return failure(format!("tool '{name}' was cancelled"));
        }
    };
    // The leader is done; anything it left behind in its group goes too.
    guard.terminate();
    if let Some(events) = events {
        // Whatever the program wrote before it ended is read; a descendant
        // still holding the pipe does not keep us waiting.
        if tokio::time::timeout(Duration::from_millis(200), events)
            .await
            .is_err()
        {
            tracing::debug!(tool = name, "events pipe still open after exit");
        }
    }
    let (out, cut) = stdout.await.unwrap_or_default();
    let err_tail = stderr.await.unwrap_or_default();
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            return failure(format!(
                "tool '{name}': waiting for the process failed: {e}"
            ));
        }
    };
    let out = String::from_utf8_lossy(&out).into_owned();
    if !status.success() {
        let how = match status.code() {
            Some(code) => format!("exited with code {code}"),
            None => "was killed by a signal".to_owned(),
        };
        let err_text = String::from_utf8_lossy(&err_tail);
        let text = if err_text.trim().is_empty() {
            format!("tool '{name}' {how}")
        } else {
            format!("tool '{name}' {how}: {}", err_text.trim_end())
        };
        return ToolOutcome::tool_error(text);
    }
    result_from_stdout(out, cut, spec.max_output)
}

fn result_from_stdout(out: String, cut: bool, cap: usize) -> ToolOutcome {
    let note = |text: String| {
        if cut {
            format!("{text}\n[output cut at {cap} bytes]")
        } else {
            text
        }
    };
    if !cut && let Ok(value) = serde_json::from_str::<Value>(out.trim()) {
        if value.get("content").is_some_and(Value::is_array) {
            return ToolOutcome::Result(value);
        }
        let mut result = json!({ "content": [{ "type": "text", "text": out.trim_end() }] });
        if value.is_object() {
            result["structuredContent"] = value;
        }
        return ToolOutcome::Result(result);
    }
    ToolOutcome::Result(json!({ "content": [{ "type": "text", "text": note(out) }] }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_becomes_a_call_tool_result() {
        let r = |s: &str| match result_from_stdout(s.to_owned(), false, 100) {
            ToolOutcome::Result(v) => v,
            ToolOutcome::Error(e) => panic!("{e:?}"),
        };
        assert_eq!(r("hello\n")["content"][0]["text"], "hello\n");
        assert_eq!(r("{\"a\":1}")["structuredContent"], json!({"a": 1}));
        assert_eq!(r("[1,2]")["content"][0]["text"], "[1,2]");
        assert!(r("[1,2]").get("structuredContent").is_none());
        let full = json!({"content": [{"type": "text", "text": "x"}], "isError": true});
        assert_eq!(r(&full.to_string()), full);
        match result_from_stdout("abc".into(), true, 3) {
            ToolOutcome::Result(v) => assert!(
                v["content"][0]["text"]
                    .as_str()
                    .unwrap()
                    .contains("cut at 3 bytes")
            ),
            ToolOutcome::Error(e) => panic!("{e:?}"),
        }
    }
}
