//! The `/mcp` handler (Streamable HTTP, H-1..H-8): origin, token and rate
//! checks, the POST body (type, size, deadline), then each message to its
//! protocol path: MCP 2026-07-28 to [`super::modern`], the 2025-11-25
//! session path to [`super::session_http`].

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::auth::{self, AuthError, Principal};
use super::limits::Requestor;
use super::origin;
use super::responses::{header_str, http_error, json_response, unauthorized};
use super::sse::accepts;
use super::{AppState, session_http};
use crate::mcp::{self, Incoming, SESSION_HEADER, error_response};

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
        Method::GET => session_http::get(state, parts.headers, principal).await,
        Method::DELETE => session_http::delete(state, parts.headers, principal).await,
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
            session_http::initialize(&state, &id, params.as_ref(), principal).await
        }
        Incoming::Request { id, method, params } => {
            session_http::request(state, &headers, principal, id, method, params).await
        }
        Incoming::Notification { method, params } => {
            session_http::notification(&state, &headers, principal, &method, params.as_ref()).await
        }
        Incoming::Response { id, body } => {
            session_http::client_response(&state, &headers, principal, id, body).await
        }
    }
}
