//! The stdio transport of an upstream MCP server: the server runs as a
//! child process in a process group of its own that dies with the broker
//! (`child_process::TiedGroup`); JSON-RPC messages are single lines on its
//! stdin and stdout; its stderr goes to the log line by line.
//!
//! One writer task owns stdin, one reader task owns stdout and routes each
//! line (`wire.rs`). When the process exits or closes its stdout, every
//! open request fails with [`super::CallError::Lost`] naming the upstream and the
//! exit status.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::wire::{Connection, Inbound, Outbound, Process, Router};
use super::{BadInputLog, StartError};
use crate::child_process::{ReadLine, TiedGroup, read_lines};

/// How to start one stdio upstream.
#[derive(Debug, Clone)]
pub struct StdioSpec {
    /// The upstream's name (in logs and errors).
    pub name: String,
    /// argv; `argv[0]` is the program (no shell).
    pub argv: Vec<String>,
    /// Environment added to the broker's own.
    pub env: BTreeMap<String, String>,
    /// Working directory (the broker's when none).
    pub working_dir: Option<PathBuf>,
    /// Wait between TERM and KILL when the process is stopped.
    pub kill_grace: Duration,
}

/// Longest line read from an upstream's stdout: a tool result with a few
/// images inlined as base64 fits many times; a longer line is skipped and
/// logged (its request then times out or is cancelled by its owner).
const MESSAGE_MAX: usize = 64 * 1024 * 1024;
/// Longest stderr line logged whole; longer ones are cut.
const STDERR_LINE_MAX: usize = 16 * 1024;
/// After the process exits, how long what it wrote before exiting is
/// still read (a descendant may hold stdout open forever).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);
/// After stdout closes, how long the exit status is waited for, for the
/// error message.
const STATUS_WAIT: Duration = Duration::from_secs(1);
/// Start the process; messages the server sends that are not answers
/// come out of the returned receiver.
pub(crate) fn start(
    spec: &StdioSpec,
    bad_input: Arc<BadInputLog>,
) -> Result<(Connection, mpsc::UnboundedReceiver<Inbound>), StartError> {
    let upstream: Arc<str> = Arc::from(spec.name.as_str());
    let Some(program) = spec.argv.first() else {
        return Err(StartError::NoCommand { upstream });
    };
    let spawn_error = |source| StartError::Spawn {
        upstream: upstream.clone(),
        program: program.clone(),
        source,
    };
    let group = TiedGroup::start(spec.kill_grace).map_err(|source| StartError::Spawn {
        upstream: upstream.clone(),
        program: "/bin/sh (the sentinel of its process group)".to_owned(),
        source,
    })?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(&spec.argv[1..])
        // A long-lived server gets each call's context in its _meta, never
        // one the broker was started with.
        .env_remove("TRACEPARENT")
        .env_remove("TRACESTATE")
        .envs(&spec.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(group.pgid());
    if let Some(dir) = &spec.working_dir {
        command.current_dir(dir);
    }
    // On failure the group (only the sentinel) is killed by its drop.
    let mut child = command.spawn().map_err(spawn_error)?;
    let pid = child.id();
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(spawn_error(std::io::Error::other(
            "no pipes to the process",
        )));
    };
    let group = Arc::new(Mutex::new(group));
    let process = Process {
        group: group.clone(),
        pid,
    };
    let (conn, wiring, inbound) = Connection::new(upstream.clone(), bad_input, Some(process));
    tokio::spawn(write_lines(stdin, wiring.outgoing));
    tokio::spawn(log_stderr(stderr, upstream.clone()));
    tokio::spawn(supervise(child, stdout, wiring.router, group));
    tracing::info!(upstream = %upstream, pid, argv = ?spec.argv, "upstream started");
    Ok((conn, inbound))
}

/// The writer task: one message per line, flushed each.
async fn write_lines(
    mut stdin: tokio::process::ChildStdin,
    mut outgoing: mpsc::UnboundedReceiver<Outbound>,
) {
    while let Some(Outbound { body: mut line, .. }) = outgoing.recv().await {
        line.push('\n');
        if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
            // The process is gone or closed its stdin: the reader's end
            // says why to everyone waiting.
            return;
        }
    }
}

/// Every stderr line into the log, naming the upstream.
async fn log_stderr(stderr: tokio::process::ChildStderr, upstream: Arc<str>) {
    read_lines(stderr, STDERR_LINE_MAX, |line| match line {
        ReadLine::Line(line) => {
            tracing::info!(upstream = %upstream, stderr = %String::from_utf8_lossy(line), "upstream stderr");
        }
        ReadLine::TooLong => {
            tracing::info!(upstream = %upstream, "upstream stderr: a line over {STDERR_LINE_MAX} bytes, not shown");
        }
    })
    .await;
}

/// The reader task and the process's end: read stdout until it closes or
/// the process exits, then fail what is open with the exit status and
/// stop what is left of the group.
async fn supervise(
    mut child: tokio::process::Child,
    stdout: tokio::process::ChildStdout,
    router: Router,
    group: Arc<Mutex<TiedGroup>>,
) {
    let reading = read_lines(stdout, MESSAGE_MAX, |line| match line {
        ReadLine::Line(line) => router.on_message(line),
        ReadLine::TooLong => router.bad_input().report(
            "message too long",
            &format!("a line over {MESSAGE_MAX} bytes was skipped"),
        ),
    });
    tokio::pin!(reading);
    let reason = tokio::select! {
        () = &mut reading => match tokio::time::timeout(STATUS_WAIT, child.wait()).await {
            Ok(Ok(status)) => format!("the process exited ({status})"),
            _ => "the process closed its stdout".to_owned(),
        },
        status = child.wait() => {
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut reading).await;
            match status {
                Ok(status) => format!("the process exited ({status})"),
                Err(e) => format!("waiting for the process failed: {e}"),
            }
        }
    };
    group
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .terminate();
    tracing::warn!(upstream = %router.upstream(), reason, "upstream connection ended");
    router.close(Arc::from(reason));
    // Reap the server if it outlived its stdout (the group was told to go).
    let _ = child.wait().await;
}
