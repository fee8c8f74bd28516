//! A connection to an upstream MCP server, whatever carries its messages
//! (a stdio server's pipes, `stdio.rs`; HTTP, `http.rs`): requests get
//! numeric ids (1, 2, ...) and wait on a oneshot in the pending map; the
//! [`Router`] answers them from what the server sends and hands every
//! other message (the server's requests and notifications) to the
//! session. When the connection ends, every open request fails with
//! [`CallError::Lost`] naming the upstream and the reason.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::{BadInputLog, CallError, quote};
use crate::child_process::TiedGroup;
use crate::mcp::{Incoming, RequestId, RpcError, parse_message};

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
        /// The server session it came in (HTTP), when not the
        /// connection's own: the answer goes back in it.
        session: Option<Arc<str>>,
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

/// The writer's queue: one message at a time to the server (a line on a
/// stdio server's stdin, a POST to an HTTP one).
#[derive(Debug, Clone)]
pub(crate) struct Outgoing(mpsc::UnboundedSender<Outbound>);

/// One message to send: its JSON text, and (HTTP) the server session it
/// belongs to when that is not the connection's own (a task an earlier
/// session of the broker created).
#[derive(Debug)]
pub(crate) struct Outbound {
    /// The message.
    pub(crate) body: String,
    /// The session to send it in; None: the connection's.
    pub(crate) session: Option<Arc<str>>,
}

impl Outgoing {
    /// Write one message. After the connection ended it goes nowhere,
    /// which its sender learns from its own request or the closed signal.
    pub(crate) fn send(&self, message: &Value) {
        self.send_in(message, None);
    }

    /// Write one message in `session` (HTTP; None: the connection's).
    pub(crate) fn send_in(&self, message: &Value, session: Option<Arc<str>>) {
        let _ = self.0.send(Outbound {
            body: message.to_string(),
            session,
        });
    }
}

/// The child process of a stdio upstream, stopped when its connection is
/// dropped.
#[derive(Debug)]
pub(crate) struct Process {
    /// The process group (sentinel, server, its children).
    pub(crate) group: Arc<Mutex<TiedGroup>>,
    /// The server's pid (tests kill it; operators look for it).
    pub(crate) pid: Option<u32>,
}

/// One connection to an upstream, whatever carries it. Dropping it stops
/// the process of a stdio upstream.
#[derive(Debug)]
pub(crate) struct Connection {
    /// The upstream's name.
    upstream: Arc<str>,
    /// Lines to write to stdin.
    outgoing: Outgoing,
    /// Requests waiting for their answer.
    pending: Arc<Mutex<Pending>>,
    /// The next request id.
    next_id: AtomicU64,
    /// The server's process, for a stdio upstream.
    process: Option<Process>,
    /// The server's session id, for an HTTP upstream, once it gave one.
    session_id: Arc<Mutex<Option<Arc<str>>>>,
    /// `Some(reason)` once the connection has ended.
    closed: watch::Receiver<Option<Arc<str>>>,
    /// Where bad input is logged.
    bad_input: Arc<BadInputLog>,
    /// Cancelled on drop (see [`Wiring::dropped`]).
    dropped: CancellationToken,
}

impl Connection {
    /// A connection whose writer, router and end the transport drives:
    /// messages to send come out of `Wiring::outgoing`, what the server
    /// sends goes into `Wiring::router`, and the transport says through
    /// `Wiring::closed` when the connection ended.
    pub(crate) fn new(
        upstream: Arc<str>,
        bad_input: Arc<BadInputLog>,
        process: Option<Process>,
    ) -> (Self, Wiring, mpsc::UnboundedReceiver<Inbound>) {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let (outgoing, outgoing_rx) = mpsc::unbounded_channel();
        let (inbound_tx, inbound_rx) = mpsc::unbounded_channel();
        let (closed_tx, closed) = watch::channel(None);
        let session_id = Arc::new(Mutex::new(None));
        let dropped = CancellationToken::new();
        let router = Router {
            upstream: upstream.clone(),
            pending: pending.clone(),
            inbound: inbound_tx,
            bad_input: bad_input.clone(),
            closed: closed_tx,
        };
        let conn = Self {
            upstream,
            outgoing: Outgoing(outgoing),
            pending,
            next_id: AtomicU64::new(1),
            process,
            session_id: session_id.clone(),
            closed,
            bad_input,
            dropped: dropped.clone(),
        };
        (
            conn,
            Wiring {
                outgoing: outgoing_rx,
                router,
                session_id,
                dropped: dropped.clone(),
            },
            inbound_rx,
        )
    }

    /// The upstream's name.
    pub(crate) fn upstream(&self) -> &Arc<str> {
        &self.upstream
    }

    /// The server process's pid (stdio).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(|p| p.pid)
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
        self.begin_request_in(method, params, None)
    }

    /// [`Connection::begin_request`] in the server session `session`
    /// (HTTP; None: the connection's own).
    pub(crate) fn begin_request_in(
        &self,
        method: &str,
        params: Value,
        session: Option<Arc<str>>,
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
        self.outgoing.send_in(&message, session);
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

    /// Write one message in the server session `session` (HTTP).
    pub(crate) fn send_in(&self, message: &Value, session: Option<Arc<str>>) {
        self.outgoing.send_in(message, session);
    }

    /// The server's session id (HTTP), once it gave one.
    pub(crate) fn session_id(&self) -> Option<Arc<str>> {
        self.session_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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

impl Drop for Connection {
    fn drop(&mut self) {
        self.dropped.cancel();
        if let Some(process) = &self.process {
            process
                .group
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .terminate();
        }
    }
}

/// What a transport drives: the messages to send, and the router of what
/// the server sends.
pub(crate) struct Wiring {
    /// Messages to send, in order.
    pub(crate) outgoing: mpsc::UnboundedReceiver<Outbound>,
    /// Where an HTTP transport keeps the server's session id.
    pub(crate) session_id: Arc<Mutex<Option<Arc<str>>>>,
    /// Where what the server sends goes.
    pub(crate) router: Router,
    /// Cancelled when the [`Connection`] is dropped: the transport then
    /// ends the connection (the session's dispatcher holds a writer handle
    /// of its own, so the writer's queue alone never closes).
    pub(crate) dropped: CancellationToken,
}

/// Routes what the server sends: answers to their requests, the rest to
/// the session; ends the connection.
pub(crate) struct Router {
    upstream: Arc<str>,
    pending: Arc<Mutex<Pending>>,
    inbound: mpsc::UnboundedSender<Inbound>,
    bad_input: Arc<BadInputLog>,
    closed: watch::Sender<Option<Arc<str>>>,
}

impl Router {
    /// The upstream's name.
    pub(crate) fn upstream(&self) -> &Arc<str> {
        &self.upstream
    }

    /// Where bad input is logged.
    pub(crate) fn bad_input(&self) -> &BadInputLog {
        &self.bad_input
    }

    /// Changes to `Some(reason)` when the connection ends.
    pub(crate) fn closed(&self) -> watch::Receiver<Option<Arc<str>>> {
        self.closed.subscribe()
    }

    /// Hand the session a notification as if the server had sent it (one
    /// it may have sent where it could not be heard).
    pub(crate) fn notify(&self, method: &str) {
        let _ = self.inbound.send(Inbound::Notification {
            method: method.to_owned(),
            params: json!({}),
        });
    }

    /// One message the server sent (a stdio line, an HTTP body or SSE
    /// event): an answer, a request or a notification.
    pub(crate) fn on_message(&self, line: &[u8]) {
        self.on_message_in(line, None);
    }

    /// [`Router::on_message`] for a message that came in the server
    /// session `session` (HTTP: the answer stream of a request sent in a
    /// session of an earlier connection; None: this connection's).
    pub(crate) fn on_message_in(&self, line: &[u8], session: Option<Arc<str>>) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match parse_message(line) {
            Ok(Incoming::Response { id, body }) => self.on_response(id, body),
            Ok(Incoming::Request { id, method, params }) => {
                let params = params.unwrap_or_else(|| json!({}));
                let _ = self.inbound.send(Inbound::Request {
                    id,
                    method,
                    params,
                    session,
                });
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

    /// Request `id` got no answer, for `error` (an HTTP failure of its
    /// POST): its caller gets the error.
    pub(crate) fn fail(&self, id: u64, error: CallError) {
        let waiting = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .open
            .remove(&id);
        if let Some(tx) = waiting {
            let _ = tx.send(Err(error));
        }
    }

    /// The connection ended: every open request fails, no new one is
    /// sent, and the session is told.
    pub(crate) fn close(&self, reason: Arc<str>) {
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
        let _ = self.closed.send(Some(reason));
    }
}
