//! The checks every `/mcp` request passes before it is routed, as axum
//! middleware, outermost first: [`origin`] (H-2, 403), [`authenticate`]
//! (H-13: no token in the query, 400; a bearer token when tokens exist,
//! 401) and [`rate`] (T-38, 429). [`authenticate`] leaves the request's
//! [`Caller`] for the others and the handler.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use super::auth::{self, AuthError, Principal};
use super::limits::Requestor;
use super::origin as origins;
use super::responses::{header_str, http_error, json_response, unauthorized};
use crate::mcp::SESSION_HEADER;
use serde_json::json;

/// Who sent a request, as [`authenticate`] found: its token's principal,
/// or none when the broker has no tokens.
#[derive(Debug, Clone)]
pub struct Caller(pub Option<Principal>);

/// Refuse an Origin (or Host) this broker does not serve (H-2).
pub async fn origin(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match origins::check(
        request.headers(),
        state.local_addr,
        &state.config.allowed_origins,
    ) {
        Ok(()) => next.run(request).await,
        Err(refused) => http_error(StatusCode::FORBIDDEN, -32000, refused.message()),
    }
}

/// Refuse a token in the query string, then find the request's principal
/// (H-13) and leave it as its [`Caller`]; refused and audited when tokens
/// exist and the request has no valid one.
pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Err(e) = auth::check_query(request.uri()) {
        return http_error(StatusCode::BAD_REQUEST, -32000, &e.to_string());
    }
    let found = auth::authenticate(
        &state.token_presence,
        &state.broker.tokens(),
        request.headers(),
    )
    .await;
    match found {
        Ok(principal) => {
            request.extensions_mut().insert(Caller(principal));
            next.run(request).await
        }
        Err(AuthError::Store(e)) => {
            tracing::error!(error = %e, "token check failed");
            http_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error")
        }
        Err(e) => {
            let client = client_address(&request)
                .map(|a| a.to_string())
                .unwrap_or_else(|| "-".into());
            let token_id = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer tbk_"))
                .and_then(|rest| rest.split('_').next())
                .unwrap_or("-")
                .to_owned();
            tracing::info!(target: "audit", event = "auth.refused", reason = %e, client, token_id,
                           "audit: refused");
            unauthorized(&e)
        }
    }
}

/// Refuse a request beyond its requestor's rate (T-38), with Retry-After.
pub async fn rate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let principal = request
        .extensions()
        .get::<Caller>()
        .and_then(|Caller(p)| p.as_ref());
    let address = client_address(&request);
    let who = requestor(&state, principal, request.headers(), address).await;
    if let Err(refused) = state.limiter.check(who) {
        // When to come back, in the error's data and (from it) in
        // Retry-After.
        let secs = refused.wait.as_secs_f64().ceil().max(1.0) as u64;
        let body = json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": { "code": -32000, "message": refused.message, "data": { "retryAfter": secs } },
        });
        tracing::warn!(target: "audit", requestor = %who, "rate limit hit");
        return json_response(StatusCode::TOO_MANY_REQUESTS, &body);
    }
    next.run(request).await
}

/// The client's IP address, when the connection recorded it.
fn client_address(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip())
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
