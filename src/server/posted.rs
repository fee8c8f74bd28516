//! The body of a POST to `/mcp` as an axum extractor: its media type
//! (415), what the client accepts (406), its size (413) and deadline
//! (408), then one JSON-RPC message (400 if it is none).

use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::AppState;
use super::responses::{header_str, http_error, json_response};
use super::sse::accepts;
use crate::mcp::{self, Incoming, error_response};

/// A POST's headers and the one JSON-RPC message of its body.
#[derive(Debug)]
pub struct PostedMessage {
    /// The request's headers (session, protocol version, MCP headers).
    pub headers: HeaderMap,
    /// The message.
    pub message: Incoming,
}

impl FromRequest<AppState> for PostedMessage {
    type Rejection = Response;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Response> {
        let (parts, body) = request.into_parts();
        let headers = parts.headers;
        if let Some(ct) = header_str(&headers, header::CONTENT_TYPE.as_str()) {
            let media = ct.split(';').next().unwrap_or("").trim();
            if !media.eq_ignore_ascii_case("application/json") {
                return Err(http_error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    -32000,
                    "Unsupported Media Type: POST bodies must be application/json",
                ));
            }
        }
        if header_str(&headers, header::ACCEPT.as_str()).is_some()
            && !accepts(&headers, "application/json")
            && !accepts(&headers, "text/event-stream")
        {
            return Err(http_error(
                StatusCode::NOT_ACCEPTABLE,
                -32000,
                "Not Acceptable: Accept must include application/json or text/event-stream",
            ));
        }
        let limit = state.config.max_body_bytes;
        let declared = header_str(&headers, header::CONTENT_LENGTH.as_str())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large(limit));
        }
        // A stalled body must not hold the connection (issue 14); responses,
        // SSE streams included, have no such deadline.
        let timeout = state.config.body_timeout;
        let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
            Ok(Ok(b)) => b,
            Ok(Err(_)) => return Err(too_large(limit)),
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
                return Err(r);
            }
        };
        match mcp::parse_message(&bytes) {
            Ok(message) => Ok(Self { headers, message }),
            Err(e) => Err(json_response(
                StatusCode::BAD_REQUEST,
                &error_response(None, &e),
            )),
        }
    }
}

/// 413 for a body beyond `limit` bytes.
fn too_large(limit: usize) -> Response {
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
}
