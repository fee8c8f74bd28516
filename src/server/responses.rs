//! The plain HTTP answers of `/mcp` that carry a JSON-RPC body, and header
//! reading, shared by the handler and both protocol paths.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::auth::AuthError;

/// An HTTP-level refusal with a JSON-RPC error body (`id` null).
pub(super) fn http_error(status: StatusCode, code: i64, message: &str) -> Response {
    let body =
        json!({ "jsonrpc": "2.0", "id": null, "error": { "code": code, "message": message } });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A JSON body with `status`. An error that says when to come back
/// (`error.data.retryAfter`, seconds: a limit was hit) also says it in
/// `Retry-After`, for HTTP clients and proxies that read only headers.
pub(super) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(secs) = body
        .pointer("/error/data/retryAfter")
        .and_then(Value::as_u64)
    {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// A header's value, when it is text.
pub(super) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// 401 with a Bearer challenge (H-13).
pub(super) fn unauthorized(e: &AuthError) -> Response {
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
