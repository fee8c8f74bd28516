//! Streamable HTTP (H-1..H-8): one endpoint for POST, GET and DELETE; header
//! checks; session lookup; JSON or SSE responses.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::auth::{self, AuthError, Principal};
use super::dispatch::dispatch;
use super::limits::{Requestor, hold_while_streaming};
use super::notify::{parse_get_event_id, status_notification};
use super::origin;
use super::reply::{Reply, StreamItem};
use super::sessions::Session;
use super::sse::accepts;
use super::streams::Attach;
use super::{AppState, sse};
use crate::mcp::{
    self, Incoming, InitializeParams, RequestId, RpcError, SESSION_HEADER, VERSION_HEADER,
    error_response, parse_params, success_response,
};

/// An HTTP-level refusal with a JSON-RPC error body (`id` null).
fn http_error(status: StatusCode, code: i64, message: &str) -> Response {
    let body =
        json!({ "jsonrpc": "2.0", "id": null, "error": { "code": code, "message": message } });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The handler of `/mcp`.
pub async fn mcp(State(state): State<AppState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(refused) = check_origin(&state, &parts.headers) {
        return refused;
    }
    if let Err(e) = auth::check_query(&parts.uri) {
        return http_error(StatusCode::BAD_REQUEST, -32000, &e.to_string());
    }
    let principal = match auth::authenticate(
        &state.token_presence,
        &state.broker.tokens(),
        &parts.headers,
    )
    .await
    {
        Ok(p) => p,
        Err(AuthError::Store(e)) => {
            tracing::error!(error = %e, "token check failed");
            return http_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error");
        }
        Err(e) => {
            let client = parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(a)| a.ip().to_string())
                .unwrap_or_else(|| "-".into());
            let token_id = parts
                .headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer tbk_"))
                .and_then(|rest| rest.split('_').next())
                .unwrap_or("-")
                .to_owned();
            tracing::info!(target: "audit", event = "auth.refused", reason = %e, client, token_id,
                           "audit: refused");
            return unauthorized(&e);
        }
    };
    // T-38: a request rate per requestor.
    let address = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip());
    let who = requestor(&state, principal.as_ref(), &parts.headers, address).await;
    if let Err(refused) = state.limiter.check(who) {
        let mut r = http_error(StatusCode::TOO_MANY_REQUESTS, -32000, &refused.message);
        let secs = refused.wait.as_secs().max(1).to_string();
        if let Ok(v) = HeaderValue::from_str(&secs) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        tracing::warn!(target: "audit", requestor = %who, "rate limit hit");
        return r;
    }
    let principal = principal.as_ref();
    // 2026-07-28 has no GET stream and no session to DELETE (SHTTP).
    if parts.method != Method::POST && super::modern::names_modern_version(&parts.headers) {
        let mut r = http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            -32000,
            "Method not allowed: MCP 2026-07-28 uses POST only (subscriptions/listen for notifications)",
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    match parts.method {
        Method::POST => post(state, parts.headers, body, principal).await,
        Method::GET => get(state, parts.headers, principal).await,
        Method::DELETE => delete(state, parts.headers, principal).await,
        _ => {
            let mut r = http_error(
                StatusCode::METHOD_NOT_ALLOWED,
                -32000,
                "Method not allowed: use POST, GET or DELETE",
            );
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            r
        }
    }
}

/// Who a request counts against: its principal; without tokens, the live
/// session it names, else (initialize, a missing, ended or made-up session
/// id) its client address. The session is looked up here (and so cached
/// for the handler): after a restart, each client's first request still
/// counts against its own session, not against the address that all
/// local clients share.
async fn requestor<'a>(
    state: &AppState,
    principal: Option<&'a Principal>,
    headers: &'a HeaderMap,
    address: Option<IpAddr>,
) -> Requestor<'a> {
    if let Some(p) = principal {
        return Requestor::Principal(&p.0);
    }
    match header_str(headers, SESSION_HEADER) {
        Some(id) if matches!(state.sessions.lookup(id).await, Ok(Some(_))) => {
            Requestor::Session(id)
        }
        _ => Requestor::Address(address),
    }
}

fn check_origin(state: &AppState, headers: &HeaderMap) -> Option<Response> {
    origin::check(headers, state.local_addr, &state.config.allowed_origins)
        .err()
        .map(|refused| http_error(StatusCode::FORBIDDEN, -32000, refused.message()))
}

/// 401 with a Bearer challenge (H-13).
fn unauthorized(e: &AuthError) -> Response {
    let mut r = http_error(StatusCode::UNAUTHORIZED, -32001, &e.to_string());
    let challenge = match e {
        AuthError::Invalid => "Bearer realm=\"taskbroker\", error=\"invalid_token\"",
        _ => "Bearer realm=\"taskbroker\"",
    };
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    r
}

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

async fn post(
    state: AppState,
    headers: HeaderMap,
    body: Body,
    principal: Option<&Principal>,
) -> Response {
    if let Some(ct) = header_str(&headers, header::CONTENT_TYPE.as_str()) {
        let media = ct.split(';').next().unwrap_or("").trim();
        if !media.eq_ignore_ascii_case("application/json") {
            return http_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                -32000,
                "Unsupported Media Type: POST bodies must be application/json",
            );
        }
    }
    if header_str(&headers, header::ACCEPT.as_str()).is_some()
        && !accepts(&headers, "application/json")
        && !accepts(&headers, "text/event-stream")
    {
        return http_error(
            StatusCode::NOT_ACCEPTABLE,
            -32000,
            "Not Acceptable: Accept must include application/json or text/event-stream",
        );
    }
    let limit = state.config.max_body_bytes;
    let too_large = || {
        let mut r = http_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            -32000,
            &format!("Payload Too Large: the body limit is {limit} bytes"),
        );
        // The rest of the body is not read here: the connection is not
        // reused, and throws it away as it closes (connections::linger), so
        // a client that sends the whole body first still reads this.
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    };
    let declared =
        header_str(&headers, header::CONTENT_LENGTH.as_str()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return too_large();
    }
    // A stalled body must not hold the connection (issue 14); responses,
    // SSE streams included, have no such deadline.
    let timeout = state.config.body_timeout;
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return too_large(),
        Err(_) => {
            let mut r = http_error(
                StatusCode::REQUEST_TIMEOUT,
                -32000,
                &format!(
                    "Request Timeout: the body did not arrive within {} s (--body-timeout)",
                    timeout.as_secs_f64()
                ),
            );
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    };
    let message = match mcp::parse_message(&bytes) {
        Ok(m) => m,
        Err(e) => return json_response(StatusCode::BAD_REQUEST, &error_response(None, &e)),
    };
    match message {
        Incoming::Request { id, method, params }
            if super::modern::speaks_modern(&headers, &method, params.as_ref()) =>
        {
            super::modern::post(&state, &headers, principal, id, method, params).await
        }
        // 2026-07-28 has no notifications or responses from clients on
        // POST; one without a session is taken and dropped.
        Incoming::Notification { .. } | Incoming::Response { .. }
            if header_str(&headers, SESSION_HEADER).is_none()
                && super::modern::names_modern_version(&headers) =>
        {
            StatusCode::ACCEPTED.into_response()
        }
        Incoming::Request { id, method, params } if method == "initialize" => {
            initialize(&state, &id, params.as_ref(), principal).await
        }
        Incoming::Request { id, method, params } => {
            let session = match require_session(&state, &headers, principal).await {
                Ok(s) => s,
                Err(r) => return r,
            };
            request(state, &headers, session, id, method, params).await
        }
        Incoming::Notification { method, params } => {
            let session = match require_session(&state, &headers, principal).await {
                Ok(s) => s,
                Err(r) => return r,
            };
            if method == "notifications/cancelled" {
                // T-23: for plain requests; tasks are cancelled with tasks/cancel.
                let request_id = params.as_ref().and_then(|p| p.get("requestId"));
                let stopped =
                    request_id.is_some_and(|id| state.client_requests.cancel(&session.id, id));
                tracing::info!(
                    request_id =
                        request_id.map(|id| tracing::field::display(RequestId(id.clone()))),
                    stopped,
                    "notifications/cancelled"
                );
            } else {
                tracing::debug!(method, "notification");
            }
            StatusCode::ACCEPTED.into_response()
        }
        Incoming::Response { id, body } => {
            let session = match require_session(&state, &headers, principal).await {
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
                        .answer_task_request(&session.owner(), request_id, &body)
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
    }
}

/// initialize (H-7): negotiate the version, declare capabilities (T-1),
/// start a session (H-5).
async fn initialize(
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
    let idle_ms = i64::try_from(state.config.session_idle.as_millis()).unwrap_or(i64::MAX);
    match state.broker.live_sessions(idle_ms).await {
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
    let result = json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": { "listChanged": false },
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

async fn request(
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
    let reply = dispatch(&state, &session, sse, &id, &method, params.as_ref()).await;
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
async fn get(state: AppState, headers: HeaderMap, principal: Option<&Principal>) -> Response {
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
    hold_while_streaming(response, slot)
}

/// DELETE ends the session (H-1, H-5).
async fn delete(state: AppState, headers: HeaderMap, principal: Option<&Principal>) -> Response {
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
