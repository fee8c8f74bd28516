//! MCP wire format: JSON-RPC framing and the message shapes of MCP
//! 2025-11-25 the broker reads and writes, and of 2026-07-28 in
//! [`modern`]. Pure data: no I/O.

mod jsonrpc;
pub mod modern;
mod types;

pub use jsonrpc::{
    ErrorCode, Incoming, RequestId, RpcError, error_response, notification, parse_message,
    success_response,
};
pub use types::*;

/// HTTP header carrying the session id (Streamable HTTP, H-5).
pub const SESSION_HEADER: &str = "mcp-session-id";
/// HTTP header carrying the protocol version (H-6; every 2026-07-28 request).
pub const VERSION_HEADER: &str = "mcp-protocol-version";

/// The newest protocol version this server speaks (the one with tasks).
pub const LATEST_PROTOCOL_VERSION: &str = "2025-11-25";

/// Every protocol version accepted in initialize and `MCP-Protocol-Version`.
pub const SUPPORTED_PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// The version assumed when a request carries no `MCP-Protocol-Version` (H-6).
pub const DEFAULT_PROTOCOL_VERSION: &str = "2025-03-26";

/// `_meta` key that ties a message to a task (T-16, T-28).
pub const RELATED_TASK_META: &str = "io.modelcontextprotocol/related-task";
/// `_meta` key of a task call that carries the client's idempotency key
/// (taskbroker's own: a repeated call with it gets the same task).
pub const IDEMPOTENCY_KEY_META: &str = "taskbroker/idempotencyKey";
/// `_meta` key of a task call that asks for a priority: a name (`low`,
/// `high`, ...) or a number, higher first, up to its tool's `max_priority`.
pub const PRIORITY_META: &str = "taskbroker/priority";
/// `_meta` key of a task call that asks to start later: seconds from now.
pub const DELAY_META: &str = "taskbroker/delay";
/// `_meta` key of a task call that asks to start at a time (RFC 3339).
pub const START_AT_META: &str = "taskbroker/startAt";

/// `{"io.modelcontextprotocol/related-task": {"taskId": ...}}`.
pub fn related_task_meta(task_id: &str) -> serde_json::Value {
    serde_json::json!({ RELATED_TASK_META: { "taskId": task_id } })
}

/// Format milliseconds since the epoch as RFC 3339 UTC with milliseconds,
/// e.g. `2025-11-25T10:30:00.123Z`.
pub fn format_time(ms: i64) -> String {
    use time::OffsetDateTime;
    const FORMAT: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    let nanos = i128::from(ms) * 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(FORMAT).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00.000Z".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc_with_millis() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_764_066_600_123), "2025-11-25T10:30:00.123Z");
    }
}
