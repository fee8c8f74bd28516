//! MCP 2025-11-25 over Streamable HTTP with sessions (H-1..H-8):
//! initialize, requests answered as JSON or SSE, notifications and the
//! client's answers on a session, the GET stream and DELETE. The `/mcp`
//! handler ([`super::transport`]) routes here after its checks.

use std::sync::Arc;
use std::time::Instant;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::auth::{AuthError, Principal};
use super::dispatch::dispatch;
use super::limits::hold_while_streaming;
use super::notify::{parse_get_event_id, status_notification};
use super::reply::{Reply, StreamItem};
use super::responses::{header_str, http_error, json_response, unauthorized};
use super::sessions::Session;
use super::sse::accepts;
use super::streams::Attach;
use super::{AppState, sse};
use crate::broker::{ClientAnswer, ErrorRecord};
use crate::mcp::{
    self, InitializeParams, RequestId, RpcError, SESSION_HEADER, VERSION_HEADER, error_response,
    parse_params, success_response,
};

/// The session a request names, or the response that refuses it (H-5, H-6).
async fn require_session(
    state: &AppState,
    headers: &HeaderMap,
    principal: Option<&Principal>,
) -> Result<Arc<Session>, Response> {
    if let Some(version) = header_str(headers, VERSION_HEADER)
        && !mcp::SUPPORTED_PROTOCOL_VERSIONS.contains(&version)
    {
        return Err(http_error(
            StatusCode::BAD_REQUEST,
            -32000,
            &format!(
                "Bad Request: unsupported MCP-Protocol-Version '{version}' (supported: {} in a \
                 session; {} with params._meta, no session)",
                mcp::SUPPORTED_PROTOCOL_VERSIONS.join(", "),
                mcp::modern::SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    let Some(id) = header_str(headers, SESSION_HEADER) else {
        return Err(http_error(
            StatusCode::BAD_REQUEST,
            -32000,
            "Bad Request: Mcp-Session-Id header is required (send initialize first)",
        ));
    };
    match state.sessions.lookup(id).await {
        // A session belongs to the principal that opened it (T-36): used with
        // another's token it does not exist.
        Ok(Some(session)) if session.principal.as_deref() == principal.map(|p| p.0.as_str()) => {
            Ok(session)
        }
        Ok(_) => Err(http_error(
            StatusCode::NOT_FOUND,
            -32001,
            "Session not found: it ended or never existed; initialize a new one",
        )),
        Err(e) => {
            tracing::error!(error = %e, "session lookup failed");
            Err(http_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                -32603,
                "Internal error",
            ))
        }
    }
}

/// A notification on a session (2025-11-25): `notifications/cancelled`
/// stops a plain call (T-23); others are taken and dropped.
pub(super) async fn notification(
    state: &AppState,
    headers: &HeaderMap,
    principal: Option<&Principal>,
    method: &str,
    params: Option<&Value>,
) -> Response {
    let session = match require_session(state, headers, principal).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if method == "notifications/cancelled" {
        // T-23: for plain requests; tasks are cancelled with tasks/cancel.
        let request_id = params.and_then(|p| p.get("requestId"));
        let stopped = request_id.is_some_and(|id| state.client_requests.cancel(&session.id, id));
        tracing::info!(
            request_id = request_id.map(|id| tracing::field::display(RequestId(id.clone()))),
            stopped,
            "notifications/cancelled"
        );
    } else {
        tracing::debug!(method, "notification");
    }
    StatusCode::ACCEPTED.into_response()
}

/// A client's answer to a request of ours: a plain call's (elicitation,
/// sampling) or a task's (input_required), stored for the task.
pub(super) async fn client_response(
    state: &AppState,
    headers: &HeaderMap,
    principal: Option<&Principal>,
    id: RequestId,
    body: Value,
) -> Response {
    let session = match require_session(state, headers, principal).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    if state
        .client_requests
        .resolve(&session.id, &id, body.clone())
    {
        return StatusCode::ACCEPTED.into_response();
    }
    // Not a plain call's request: perhaps a task's (input_required).
    let answered = match id.0.as_str() {
        Some(request_id) => {
            state
                .broker
                .answer_task_request(&session.owner(), request_id, &client_answer(&body))
                .await
        }
        None => Ok(false),
    };
    match answered {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(id = %id, "client response to no pending request of this session")
        }
        Err(e) => {
            tracing::error!(error = %e, "storing a client's answer failed");
            return http_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error");
        }
    }
    StatusCode::ACCEPTED.into_response()
}

/// initialize (H-7): negotiate the version, declare capabilities (T-1),
/// start a session (H-5).
pub(super) async fn initialize(
    state: &AppState,
    id: &RequestId,
    params: Option<&Value>,
    principal: Option<&Principal>,
) -> Response {
    // A new session without a token: whether tokens exist is read afresh.
    if principal.is_none() {
        match state
            .token_presence
            .tokens_exist(&state.broker.tokens(), true)
            .await
        {
            Ok(false) => {}
            Ok(true) => {
                tracing::info!(target: "audit", event = "auth.refused", reason = %AuthError::Missing,
                               "audit: refused");
                return unauthorized(&AuthError::Missing);
            }
            Err(e) => {
                tracing::error!(error = %e, "token check failed");
                return http_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error");
            }
        }
    }
    let params: InitializeParams = match parse_params("initialize", params) {
        Ok(p) => p,
        Err(e) => return json_response(StatusCode::OK, &error_response(Some(id), &e)),
    };
    let version = if mcp::SUPPORTED_PROTOCOL_VERSIONS.contains(&params.protocol_version.as_str()) {
        params.protocol_version.clone()
    } else {
        mcp::LATEST_PROTOCOL_VERSION.to_owned()
    };
    match state.broker.live_sessions(state.sessions.expiry()).await {
        Ok(n) if n >= state.config.max_sessions => {
            return http_error(
                StatusCode::SERVICE_UNAVAILABLE,
                -32000,
                &format!(
                    "Service Unavailable: {n} live sessions, the maximum is {} (end sessions with DELETE; idle ones expire after --session-idle)",
                    state.config.max_sessions
                ),
            );
        }
        Ok(_) => {}
        Err(e) => {
            tracing::error!(error = %e, "counting sessions failed");
            return http_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error");
        }
    }
    let session = match state
        .sessions
        .create(
            &version,
            &params.capabilities,
            &params.client_info,
            principal.map(|p| p.0.as_str()),
        )
        .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "session create failed");
            return json_response(
                StatusCode::OK,
                &error_response(Some(id), &RpcError::internal()),
            );
        }
    };
    // The tools change only with upstream servers (and then the GET
    // streams are told).
    let list_changed = !state.broker.catalog().groups().is_empty();
    let result = json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": { "listChanged": list_changed },
            "logging": {},
            "tasks": {
                "list": {},
                "cancel": {},
                "requests": { "tools": { "call": {} } }
            }
        },
        "serverInfo": { "name": "taskbroker", "version": env!("CARGO_PKG_VERSION") },
        "instructions": "Durable task broker: call tools with params.task to run them as tasks; poll tasks/get, fetch tasks/result."
    });
    tracing::info!(session = %session.id, version, client = params.client_info.get("name").and_then(serde_json::Value::as_str), "session initialized");
    let mut response = json_response(StatusCode::OK, &success_response(id, result));
    if let Ok(value) = HeaderValue::from_str(&session.id) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

/// A request on a session (anything but initialize).
pub(super) async fn request(
    state: AppState,
    headers: &HeaderMap,
    principal: Option<&Principal>,
    id: RequestId,
    method: String,
    params: Option<Value>,
) -> Response {
    let session = match require_session(&state, headers, principal).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    respond(state, headers, session, id, method, params).await
}

async fn respond(
    state: AppState,
    headers: &HeaderMap,
    session: Arc<Session>,
    id: RequestId,
    method: String,
    params: Option<Value>,
) -> Response {
    let started = Instant::now();
    let task_id = params
        .as_ref()
        .and_then(|p| p.get("taskId"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let sse = accepts(headers, "text/event-stream");
    let reply = dispatch(
        &state,
        &session,
        sse,
        headers,
        &id,
        &method,
        params.as_ref(),
    )
    .await;
    match reply {
        Reply::Done(outcome) => {
            log_request(&method, task_id.as_deref(), &outcome, started);
            json_response(StatusCode::OK, &to_message(&id, outcome))
        }
        Reply::Later {
            items,
            outcome,
            resumable,
        } if sse && resumable => {
            let Some(slot) = state.open_streams.acquire() else {
                return too_many_streams(&state);
            };
            // The work runs on its own; connections read its stream and
            // may come and go (H-4).
            let stream = state.streams.open(&session.id);
            let writer = stream.clone();
            tokio::spawn(async move {
                let mut items = items;
                tokio::pin!(outcome);
                let outcome = loop {
                    let item = match items.as_mut() {
                        Some(rx) => tokio::select! {
                            biased;
                            item = rx.recv() => item,
                            outcome = &mut outcome => break outcome,
                        },
                        None => break (&mut outcome).await,
                    };
                    match item {
                        Some(StreamItem::Message(m)) => writer.push(m),
                        Some(StreamItem::Close) => writer.close_connections(),
                        None => items = None,
                    }
                };
                if let Some(rx) = items.as_mut() {
                    while let Ok(StreamItem::Message(m)) = rx.try_recv() {
                        writer.push(m);
                    }
                }
                log_request(&method, task_id.as_deref(), &outcome, started);
                writer.finish(to_message(&id, outcome));
            });
            hold_while_streaming(state.streams.respond(stream, Attach::First), slot)
        }
        Reply::Later { items, outcome, .. } if sse => {
            let Some(slot) = state.open_streams.acquire() else {
                return too_many_streams(&state);
            };
            let response = sse::respond(state.config.keep_alive, items, async move {
                let outcome = outcome.await;
                log_request(&method, task_id.as_deref(), &outcome, started);
                to_message(&id, outcome)
            });
            hold_while_streaming(response, slot)
        }
        Reply::Later { outcome, .. } => {
            let outcome = outcome.await;
            log_request(&method, task_id.as_deref(), &outcome, started);
            json_response(StatusCode::OK, &to_message(&id, outcome))
        }
    }
}

/// 503 when the open SSE streams are at their maximum (T-38).
fn too_many_streams(state: &AppState) -> Response {
    http_error(
        StatusCode::SERVICE_UNAVAILABLE,
        -32000,
        &format!(
            "Service Unavailable: {} SSE streams are open, the maximum (max_sse_streams); retry later",
            state.open_streams.max()
        ),
    )
}

fn to_message(id: &RequestId, outcome: Result<Value, Value>) -> Value {
    match outcome {
        Ok(result) => success_response(id, result),
        Err(error) => json!({ "jsonrpc": "2.0", "id": id.0, "error": error }),
    }
}

fn log_request(
    method: &str,
    task_id: Option<&str>,
    outcome: &Result<Value, Value>,
    started: Instant,
) {
    let task_id = task_id.or_else(|| {
        outcome
            .as_ref()
            .ok()
            .and_then(|r| r.pointer("/task/taskId"))
            .and_then(Value::as_str)
    });
    let status = match outcome {
        Ok(r) => r
            .get("status")
            .or_else(|| r.pointer("/task/status"))
            .and_then(Value::as_str)
            .unwrap_or("ok")
            .to_owned(),
        Err(e) => format!(
            "error {}",
            e.get("code").and_then(Value::as_i64).unwrap_or(0)
        ),
    };
    tracing::info!(
        method,
        task_id = task_id.unwrap_or("-"),
        status,
        // Rounded to 10 us: printed as 2.72, not 2.7215030000000002.
        duration_ms = (started.elapsed().as_secs_f64() * 100_000.0).round() / 100.0,
        "request"
    );
}

/// GET opens the session's stream for server-to-client messages (H-1).
pub(super) async fn get(
    state: AppState,
    headers: HeaderMap,
    principal: Option<&Principal>,
) -> Response {
    if !accepts(&headers, "text/event-stream") {
        return http_error(
            StatusCode::NOT_ACCEPTABLE,
            -32000,
            "Not Acceptable: GET needs Accept: text/event-stream",
        );
    }
    let session = match require_session(&state, &headers, principal).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let last = header_str(&headers, "last-event-id");
    // Resumption (H-4) of a request's stream: replay only that stream's
    // messages after the id.
    if let Some(last) = last
        && parse_get_event_id(last).is_none()
    {
        match state.streams.find(&session.id, last) {
            Ok((stream, after)) => {
                let Some(slot) = state.open_streams.acquire() else {
                    return too_many_streams(&state);
                };
                return hold_while_streaming(
                    state.streams.respond(stream, Attach::Resume(after)),
                    slot,
                );
            }
            Err(e) => {
                tracing::info!(last_event_id = last, reason = %e, "nothing to resume; opening a fresh stream");
            }
        }
    }
    let Some(slot) = state.open_streams.acquire() else {
        return too_many_streams(&state);
    };
    // The session's own stream: status notifications of its tasks (T-31),
    // resumable from the database after `g-<feed position>`.
    let owner = session.owner();
    let live = state.session_streams.attach(owner.as_str());
    // Before the head is read: the feed wakes for this owner's changes.
    let following = state.broker.feed().follow_owner(owner.as_str());
    let resume_from = last.and_then(parse_get_event_id);
    let (from, replay) = match resume_from {
        Some(after) => match state.broker.status_changes_since(&owner, after).await {
            Ok(changes) => (after, changes),
            Err(e) => {
                tracing::error!(error = %e, "replaying status changes failed");
                return http_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error");
            }
        },
        None => match state.broker.status_feed_head().await {
            Ok(head) => (head, Vec::new()),
            Err(e) => {
                tracing::error!(error = %e, "reading the feed position failed");
                return http_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error");
            }
        },
    };
    let replay = replay
        .into_iter()
        .map(|(id, task)| (id, status_notification(&task)))
        .collect();
    let response = sse::session_stream(
        state.config.keep_alive,
        state.config.retry_ms,
        from,
        replay,
        live,
    );
    hold_while_streaming(response, (slot, following))
}

/// DELETE ends the session (H-1, H-5).
pub(super) async fn delete(
    state: AppState,
    headers: HeaderMap,
    principal: Option<&Principal>,
) -> Response {
    let session = match require_session(&state, &headers, principal).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match state.sessions.end(&session.id).await {
        Ok(_) => {
            tracing::info!(session = %session.id, "session ended");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "session end failed");
            http_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error")
        }
    }
}

/// What a JSON-RPC response answers, without its envelope (a response with
/// neither a result nor an error answers with that complaint).
fn client_answer(response: &Value) -> ClientAnswer {
    match (response.get("result"), response.get("error")) {
        (Some(result), _) => ClientAnswer::Result(result.clone()),
        (None, Some(error)) => ClientAnswer::Error(ErrorRecord::from(&RpcError::from_json(error))),
        (None, None) => ClientAnswer::Error(ErrorRecord::from(&RpcError::invalid_request(
            "the client's answer has no result or error",
        ))),
    }
}
