//! The stdio transport of an upstream MCP server: the server runs as a
//! child process in a process group of its own that dies with the broker
//! (`child_process::TiedGroup`); JSON-RPC messages are single lines on its
//! stdin and stdout; its stderr goes to the log line by line.
//!
//! One writer task owns stdin, one reader task owns stdout. Requests get
//! numeric ids (1, 2, ...) and wait on a oneshot in the pending map; the
//! reader answers them, and hands every other message (the server's
//! requests and notifications) to the session. When the process exits or
//! closes its stdout, every open request fails with
//! [`CallError::Lost`] naming the upstream and the exit status.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};

use super::{BadInputLog, CallError, StartError, quote};
use crate::child_process::{ReadLine, TiedGroup, read_lines};
use crate::mcp::{Incoming, RequestId, RpcError, parse_message};

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
/// Ids of cancelled requests remembered, so that a late answer to one
/// (which some SDKs send) is dropped quietly.
const CANCELLED_REMEMBERED: usize = 1024;

/// A message from the upstream that is not an answer to us.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A request: answer it with the same id.
    Request {
        /// As received (string or number).
        id: RequestId,
        /// The method.
        method: String,
        /// The params (`{}` when absent).
        params: Value,
    },
    /// A notification.
    Notification {
        /// The method.
        method: String,
        /// The params (`{}` when absent).
        params: Value,
    },
}

/// The answer to one request: its `result`, or why there is none.
pub(crate) type Answer = Result<Value, CallError>;

/// Requests waiting for their answer.
#[derive(Debug, Default)]
struct Pending {
    /// id -> where its answer goes.
    open: HashMap<u64, oneshot::Sender<Answer>>,
    /// Recently cancelled ids (late answers are expected, not bad input).
    cancelled: VecDeque<u64>,
    /// Why the connection ended, once it has.
    closed: Option<Arc<str>>,
}

/// The writer task's queue: one message per line to the server's stdin.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing(mpsc::UnboundedSender<String>);

impl Outgoing {
    /// Write one message. After the connection ended it goes nowhere,
    /// which its sender learns from its own request or the closed signal.
    pub(crate) fn send(&self, message: &Value) {
        let _ = self.0.send(message.to_string());
    }
}

/// One running stdio upstream. Dropping it stops the process group.
#[derive(Debug)]
pub(crate) struct StdioConnection {
    /// The upstream's name.
    upstream: Arc<str>,
    /// Lines to write to stdin.
    outgoing: Outgoing,
    /// Requests waiting for their answer.
    pending: Arc<Mutex<Pending>>,
    /// The next request id.
    next_id: AtomicU64,
    /// The process group (sentinel, server, its children).
    group: Arc<Mutex<TiedGroup>>,
    /// The server's pid (tests kill it; operators look for it).
    pid: Option<u32>,
    /// `Some(reason)` once the connection has ended.
    closed: watch::Receiver<Option<Arc<str>>>,
    /// Where bad input is logged.
    bad_input: Arc<BadInputLog>,
}

impl StdioConnection {
    /// Start the process; messages the server sends that are not answers
    /// come out of the returned receiver.
    pub(crate) fn start(
        spec: &StdioSpec,
        bad_input: Arc<BadInputLog>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Inbound>), StartError> {
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
        let pending = Arc::new(Mutex::new(Pending::default()));
        let (outgoing, outgoing_rx) = mpsc::unbounded_channel();
        let (inbound_tx, inbound_rx) = mpsc::unbounded_channel();
        let (closed_tx, closed) = watch::channel(None);

        tokio::spawn(write_lines(stdin, outgoing_rx));
        tokio::spawn(log_stderr(stderr, upstream.clone()));
        let reader = Reader {
            upstream: upstream.clone(),
            pending: pending.clone(),
            inbound: inbound_tx,
            bad_input: bad_input.clone(),
        };
        tokio::spawn(supervise(child, stdout, reader, group.clone(), closed_tx));
        tracing::info!(upstream = %upstream, pid, argv = ?spec.argv, "upstream started");
        Ok((
            Self {
                upstream,
                outgoing: Outgoing(outgoing),
                pending,
                next_id: AtomicU64::new(1),
                group,
                pid,
                closed,
                bad_input,
            },
            inbound_rx,
        ))
    }

    /// The upstream's name.
    pub(crate) fn upstream(&self) -> &Arc<str> {
        &self.upstream
    }

    /// The server process's pid.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The bad-input log of this connection.
    pub(crate) fn bad_input(&self) -> &BadInputLog {
        &self.bad_input
    }

    /// Why the connection ended, once it has.
    pub(crate) fn closed(&self) -> watch::Receiver<Option<Arc<str>>> {
        self.closed.clone()
    }

    /// Send a request; its answer comes on the receiver. The request is in
    /// the pending map before it is written, so no answer can beat it.
    pub(crate) fn begin_request(
        &self,
        method: &str,
        params: Value,
    ) -> Result<(u64, oneshot::Receiver<Answer>), CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.lock_pending();
            if let Some(reason) = &pending.closed {
                return Err(self.lost(reason.clone()));
            }
            pending.open.insert(id, tx);
        }
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.send(&message);
        Ok((id, rx))
    }

    /// Stop waiting for request `id` (a timeout or a cancel): a late
    /// answer to it is dropped quietly.
    pub(crate) fn forget(&self, id: u64) {
        let mut pending = self.lock_pending();
        if pending.open.remove(&id).is_some() {
            if pending.cancelled.len() == CANCELLED_REMEMBERED {
                pending.cancelled.pop_front();
            }
            pending.cancelled.push_back(id);
        }
    }

    /// Write one message (a notification or an answer).
    pub(crate) fn send(&self, message: &Value) {
        self.outgoing.send(message);
    }

    /// A handle to write messages with (the session's dispatcher answers
    /// the server's requests through it).
    pub(crate) fn outgoing(&self) -> Outgoing {
        self.outgoing.clone()
    }

    /// What a request's channel gave: its answer, or (the reader gone
    /// without a word) a lost connection.
    pub(crate) fn answer_of(&self, received: Result<Answer, oneshot::error::RecvError>) -> Answer {
        received.unwrap_or_else(|_| Err(self.lost(Arc::from("the connection ended"))))
    }

    /// The error for a request on a connection that ended.
    pub(crate) fn lost(&self, reason: Arc<str>) -> CallError {
        CallError::Lost {
            upstream: self.upstream.clone(),
            reason,
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for StdioConnection {
    fn drop(&mut self) {
        let mut group = self
            .group
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        group.terminate();
    }
}

/// The writer task: one message per line, flushed each.
async fn write_lines(
    mut stdin: tokio::process::ChildStdin,
    mut outgoing: mpsc::UnboundedReceiver<String>,
) {
    while let Some(mut line) = outgoing.recv().await {
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

/// What the reader task needs.
struct Reader {
    upstream: Arc<str>,
    pending: Arc<Mutex<Pending>>,
    inbound: mpsc::UnboundedSender<Inbound>,
    bad_input: Arc<BadInputLog>,
}

impl Reader {
    /// One line from stdout.
    fn on_line(&self, line: ReadLine<'_>) {
        let line = match line {
            ReadLine::Line(line) => line,
            ReadLine::TooLong => {
                self.bad_input.report(
                    "message too long",
                    &format!("a line over {MESSAGE_MAX} bytes was skipped"),
                );
                return;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match parse_message(line) {
            Ok(Incoming::Response { id, body }) => self.on_response(id, body),
            Ok(Incoming::Request { id, method, params }) => {
                let params = params.unwrap_or_else(|| json!({}));
                let _ = self.inbound.send(Inbound::Request { id, method, params });
            }
            Ok(Incoming::Notification { method, params }) => {
                let params = params.unwrap_or_else(|| json!({}));
                let _ = self.inbound.send(Inbound::Notification { method, params });
            }
            Err(e) if serde_json::from_slice::<Value>(line).is_err() => {
                self.bad_input
                    .report("not JSON", &format!("{}: {}", e.message, quote(line)));
            }
            Err(e) => self.bad_input.report(
                "not a JSON-RPC message",
                &format!("{}: {}", e.message, quote(line)),
            ),
        }
    }

    /// An answer: to its request, if we asked it.
    fn on_response(&self, id: RequestId, body: Value) {
        let ours = id.0.as_u64();
        let waiting = {
            let mut pending = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match ours {
                Some(n) => match pending.open.remove(&n) {
                    Some(tx) => Some(tx),
                    None => {
                        if let Some(at) = pending.cancelled.iter().position(|&c| c == n) {
                            pending.cancelled.remove(at);
                            tracing::debug!(upstream = %self.upstream, id = n, "late answer to a cancelled request: dropped");
                            return;
                        }
                        None
                    }
                },
                None => None,
            }
        };
        let Some(tx) = waiting else {
            self.bad_input.report(
                "answer to an unknown id",
                &format!("id {id}: {}", quote(body.to_string().as_bytes())),
            );
            return;
        };
        let answer = match (body.get("error"), body.get("result")) {
            (Some(error), _) => Err(CallError::Upstream {
                upstream: self.upstream.clone(),
                error: RpcError::from_json(error),
            }),
            (None, Some(result)) => Ok(result.clone()),
            (None, None) => return, // parse_message only gives answers with one of them
        };
        let _ = tx.send(answer);
    }

    /// The connection ended: every open request fails, and no new one is
    /// sent.
    fn close(&self, reason: Arc<str>) {
        let open = {
            let mut pending = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            pending.closed = Some(reason.clone());
            std::mem::take(&mut pending.open)
        };
        for (_, tx) in open {
            let _ = tx.send(Err(CallError::Lost {
                upstream: self.upstream.clone(),
                reason: reason.clone(),
            }));
        }
    }
}

/// The reader task and the process's end: read stdout until it closes or
/// the process exits, then fail what is open with the exit status and
/// stop what is left of the group.
async fn supervise(
    mut child: tokio::process::Child,
    stdout: tokio::process::ChildStdout,
    reader: Reader,
    group: Arc<Mutex<TiedGroup>>,
    closed: watch::Sender<Option<Arc<str>>>,
) {
    let reading = read_lines(stdout, MESSAGE_MAX, |line| reader.on_line(line));
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
    tracing::warn!(upstream = %reader.upstream, reason, "upstream connection ended");
    let reason: Arc<str> = Arc::from(reason);
    reader.close(reason.clone());
    let _ = closed.send(Some(reason));
    // Reap the server if it outlived its stdout (the group was told to go).
    let _ = child.wait().await;
}
