//! Plain (not task-augmented) tools/call: the tool runs in this process and
//! talks to the client on the request's own stream: progress
//! (notifications/progress), logs (notifications/message), and requests to
//! the client (sampling/createMessage, elicitation/create) whose answers the
//! client POSTs back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::reply::{Reply, StreamItem};
use super::sessions::Session;
use crate::mcp::{self, ErrorCode, ProgressToken, RequestId, RpcError};
use crate::tools::{Tool, ToolContext, ToolEvent, ToolOutcome};

/// Requests this server sent to clients, waiting for their answers; and the
/// plain calls in flight, which notifications/cancelled stops (T-23).
#[derive(Debug, Default)]
pub struct ClientRequests {
    next_id: AtomicI64,
    waiting: Mutex<HashMap<(String, String), oneshot::Sender<Value>>>,
    in_flight: Mutex<HashMap<(String, String), CancellationToken>>,
}

impl ClientRequests {
    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), oneshot::Sender<Value>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh request id for `session`, and where its answer will arrive.
    fn register(&self, session: &str) -> (i64, oneshot::Receiver<Value>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        self.lock().insert((session.to_owned(), id.to_string()), tx);
        (id, rx)
    }

    fn track(&self, session: &str, id: &RequestId) -> CancellationToken {
        let token = CancellationToken::new();
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((session.to_owned(), id_key(&id.0)), token.clone());
        token
    }

    fn untrack(&self, session: &str, id: &RequestId) {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(session.to_owned(), id_key(&id.0)));
    }

    /// notifications/cancelled: stop the session's plain call with that
    /// request id; false when none is in flight.
    pub fn cancel(&self, session: &str, id: &Value) -> bool {
        let token = self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(session.to_owned(), id_key(id)));
        token.map(|t| t.cancel()).is_some()
    }

    /// Hand a client's response to whoever waits for it; false when no
    /// request of this session has that id.
    pub fn resolve(&self, session: &str, id: &RequestId, message: Value) -> bool {
        let key = (session.to_owned(), id_key(&id.0));
        match self.lock().remove(&key) {
            Some(tx) => tx.send(message).is_ok(),
            None => false,
        }
    }
}

/// Ids are compared as text: 7 and "7" name the same request.
fn id_key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Everything a plain call needs besides the tool.
pub struct PlainCall {
    /// The caller's session (log level, capabilities).
    pub session: Arc<Session>,
    /// Where client answers arrive.
    pub requests: Arc<ClientRequests>,
    /// The caller's progressToken.
    pub progress_token: Option<ProgressToken>,
    /// Whether the answer goes over SSE (else nothing but the result can
    /// reach the client).
    pub sse: bool,
    /// The request's id (for notifications/cancelled).
    pub request_id: RequestId,
    /// The W3C trace context the call came with, passed to the tool.
    pub trace: Option<crate::traces::TraceContext>,
}

/// Run `tool` for a plain call; its events become stream items.
pub fn run(call: PlainCall, tool: Arc<dyn Tool>, arguments: Value) -> Reply {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (items_tx, items) = mpsc::unbounded_channel();
    let cancel = call.requests.track(&call.session.id, &call.request_id);
    let ctx = ToolContext::new(events_tx, cancel.clone(), None, 1).with_trace(call.trace.clone());
    let name = tool.definition().name.clone();
    let outcome = async move {
        let run = tool.call(arguments, ctx);
        tokio::pin!(run);
        let _untrack = Untrack(&call);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    tracing::info!(tool = %name, "plain call cancelled by the client");
                    return Err(RpcError::new(ErrorCode::RequestCancelled, "Request cancelled").to_json());
                }
                outcome = &mut run => {
                    while let Ok(event) = events.try_recv() {
                        on_event(&call, &name, &items_tx, event);
                    }
                    return match outcome {
                        ToolOutcome::Result(v) => Ok(v),
                        ToolOutcome::Error(e) => Err(e.to_json()),
                    };
                }
                Some(event) = events.recv() => on_event(&call, &name, &items_tx, event),
            }
        }
    };
    Reply::Later {
        items: Some(items),
        outcome: Box::pin(outcome),
        resumable: true,
    }
}

/// Forgets the call's cancellation token when the call ends.
struct Untrack<'a>(&'a PlainCall);

impl Drop for Untrack<'_> {
    fn drop(&mut self) {
        self.0
            .requests
            .untrack(&self.0.session.id, &self.0.request_id);
    }
}

fn on_event(
    call: &PlainCall,
    tool: &str,
    items: &mpsc::UnboundedSender<StreamItem>,
    event: ToolEvent,
) {
    let send = |message: Value| {
        let _ = items.send(StreamItem::Message(message));
    };
    match event {
        ToolEvent::Progress {
            progress,
            total,
            message,
        } => {
            let Some(token) = &call.progress_token else {
                return;
            };
            let mut params = Map::new();
            params.insert("progressToken".into(), json!(token));
            params.insert("progress".into(), json!(progress));
            if let Some(total) = total {
                params.insert("total".into(), json!(total));
            }
            if let Some(message) = message {
                params.insert("message".into(), json!(message));
            }
            send(mcp::notification(
                "notifications/progress",
                Value::Object(params),
            ));
        }
        ToolEvent::Log { level, data } => {
            if call.session.wants_log(level) {
                send(mcp::notification(
                    "notifications/message",
                    json!({ "level": level.as_str(), "logger": tool, "data": data }),
                ));
            }
        }
        ToolEvent::Status(_) => {}
        ToolEvent::CloseStream => {
            let _ = items.send(StreamItem::Close);
        }
        ToolEvent::Request {
            method,
            params,
            reply,
            ..
        } => {
            if !call.sse {
                let _ = reply.send(Err(RpcError::new(
                    ErrorCode::InvalidRequest,
                    format!("{method} needs an SSE response: send Accept: text/event-stream"),
                )));
                return;
            }
            if !call.session.client_supports(&method, &params) {
                let _ = reply.send(Err(RpcError::new(
                    ErrorCode::MethodNotFound,
                    format!("the client did not declare the capability for {method}"),
                )));
                return;
            }
            let (id, answer) = call.requests.register(&call.session.id);
            send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
            tokio::spawn(async move {
                let result = match answer.await {
                    Ok(message) => match (message.get("result"), message.get("error")) {
                        (Some(result), _) => Ok(result.clone()),
                        (None, Some(error)) => Err(RpcError::from_json(error)),
                        (None, None) => Err(RpcError::invalid_request(
                            "client response without result or error",
                        )),
                    },
                    Err(_) => Err(RpcError::internal()),
                };
                let _ = reply.send(result);
            });
        }
    }
}
