//! The `/mcp` handler (Streamable HTTP, H-1..H-8): with the request already
//! through [`super::checks`] (origin, token, rate), it routes by method,
//! and a POST's message (read by [`PostedMessage`]) to its protocol path:
//! MCP 2026-07-28 to [`super::modern`], the 2025-11-25 session path to
//! [`super::session_http`].

use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::auth::Principal;
use super::checks::Caller;
use super::posted::PostedMessage;
use super::responses::{header_str, http_error};
use super::{AppState, session_http};
use crate::mcp::{Incoming, SESSION_HEADER};

/// The handler of `/mcp`.
pub async fn mcp(State(state): State<AppState>, request: Request) -> Response {
    let principal = request
        .extensions()
        .get::<Caller>()
        .and_then(|Caller(p)| p.clone());
    let principal = principal.as_ref();
    let method = request.method().clone();
    // 2026-07-28 has no GET stream and no session to DELETE (SHTTP).
    if method != Method::POST && super::modern::names_modern_version(request.headers()) {
        let mut r = http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            -32000,
            "Method not allowed: MCP 2026-07-28 uses POST only (subscriptions/listen for notifications)",
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    match method {
        Method::POST => match PostedMessage::from_request(request, &state).await {
            Ok(posted) => post(state, posted, principal).await,
            Err(refused) => refused,
        },
        Method::GET => session_http::get(state, request.into_parts().0.headers, principal).await,
        Method::DELETE => {
            session_http::delete(state, request.into_parts().0.headers, principal).await
        }
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

/// A POSTed message to the path of its protocol generation and kind.
async fn post(state: AppState, posted: PostedMessage, principal: Option<&Principal>) -> Response {
    let PostedMessage { headers, message } = posted;
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
