//! JSON-RPC 2.0 framing (H-3, H-8).

use serde_json::{Map, Value, json};

/// The JSON-RPC error codes MCP uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// -32700: the body is not JSON.
    ParseError,
    /// -32600: JSON, but not a single JSON-RPC message.
    InvalidRequest,
    /// -32601: no such method (or a task mode the tool refuses, T-4/T-5).
    MethodNotFound,
    /// -32602: the params are wrong, or name no visible task (T-35).
    InvalidParams,
    /// -32603: the broker failed.
    InternalError,
    /// -32800: the task was cancelled, answered by `tasks/result`.
    RequestCancelled,
    /// -32020 (2026-07-28): an MCP header disagrees with the body.
    HeaderMismatch,
    /// -32021 (2026-07-28): the request needs a client capability it did
    /// not declare.
    MissingCapability,
    /// -32022 (2026-07-28): the protocol version is not served.
    UnsupportedVersion,
    /// Any other code (e.g. from a client's error response).
    Other(i64),
}

impl ErrorCode {
    /// The code a number names.
    pub fn from_code(code: i64) -> Self {
        match code {
            -32700 => Self::ParseError,
            -32600 => Self::InvalidRequest,
            -32601 => Self::MethodNotFound,
            -32602 => Self::InvalidParams,
            -32603 => Self::InternalError,
            -32800 => Self::RequestCancelled,
            -32020 => Self::HeaderMismatch,
            -32021 => Self::MissingCapability,
            -32022 => Self::UnsupportedVersion,
            other => Self::Other(other),
        }
    }

    /// The numeric code.
    pub fn code(self) -> i64 {
        match self {
            Self::ParseError => -32700,
            Self::InvalidRequest => -32600,
            Self::MethodNotFound => -32601,
            Self::InvalidParams => -32602,
            Self::InternalError => -32603,
            Self::RequestCancelled => -32800,
            Self::HeaderMismatch => -32020,
            Self::MissingCapability => -32021,
            Self::UnsupportedVersion => -32022,
            Self::Other(code) => code,
        }
    }
}

/// A JSON-RPC error to send.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// Which error.
    pub code: ErrorCode,
    /// Human-readable, precise.
    pub message: String,
    /// Optional structured detail.
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }
    /// -32602 with a message.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParams, message)
    }
    /// -32601 for an unknown method.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            ErrorCode::MethodNotFound,
            format!("Method not found: {method}"),
        )
    }
    /// The error a JSON-RPC error object describes (e.g. a client's answer).
    pub fn from_json(error: &Value) -> Self {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(-32603);
        let code = ErrorCode::from_code(code);
        Self {
            code,
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("error without a message")
                .to_owned(),
            data: error.get("data").cloned(),
        }
    }
    /// The same error with `data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
    /// -32603; the detail is logged by the caller, not sent.
    pub fn internal() -> Self {
        Self::new(ErrorCode::InternalError, "Internal error")
    }
    /// -32600 with a message.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }
    /// The JSON-RPC error object.
    pub fn to_json(&self) -> Value {
        let mut obj = Map::new();
        obj.insert("code".into(), json!(self.code.code()));
        obj.insert("message".into(), json!(self.message));
        if let Some(data) = &self.data {
            obj.insert("data".into(), data.clone());
        }
        Value::Object(obj)
    }
}

/// A request id: a string or an integer (never null, H-8).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestId(pub Value);

impl std::fmt::Display for RequestId {
    /// As written by the client, without JSON quotes (for logs), control
    /// characters escaped so that an id cannot forge a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Value::String(s) => write!(f, "{}", s.escape_debug()),
            other => write!(f, "{other}"),
        }
    }
}

/// One message POSTed by a client.
#[derive(Debug, Clone)]
pub enum Incoming {
    /// Has `id` and `method`: answer it.
    Request {
        /// Echoed in the response.
        id: RequestId,
        /// The method name.
        method: String,
        /// `params`, if any (an object).
        params: Option<Value>,
    },
    /// Has `method`, no `id`: never answered.
    Notification {
        /// The method name.
        method: String,
        /// `params`, if any.
        params: Option<Value>,
    },
    /// Has `id` and `result` or `error`: the answer to a request we sent.
    Response {
        /// The id of our request.
        id: RequestId,
        /// The whole message.
        body: Value,
    },
}

/// Parse one POST body into a JSON-RPC message. Batches and non-objects are
/// -32600 (MCP 2025-11-25 has no batches); bad JSON is -32700.
pub fn parse_message(body: &[u8]) -> Result<Incoming, RpcError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| RpcError::new(ErrorCode::ParseError, format!("Parse error: {e}")))?;
    let obj = match value {
        Value::Object(obj) => obj,
        Value::Array(_) => {
            return Err(RpcError::invalid_request(
                "Invalid Request: batches are not supported; send one JSON-RPC message per POST",
            ));
        }
        _ => {
            return Err(RpcError::invalid_request(
                "Invalid Request: a JSON-RPC message must be a JSON object",
            ));
        }
    };
    if obj.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return Err(RpcError::invalid_request(
            "Invalid Request: \"jsonrpc\" must be \"2.0\"",
        ));
    }
    let id = match obj.get("id") {
        None => None,
        Some(v @ Value::String(_)) => Some(RequestId(v.clone())),
        Some(v @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(RequestId(v.clone())),
        Some(_) => {
            return Err(RpcError::invalid_request(
                "Invalid Request: \"id\" must be a string or an integer",
            ));
        }
    };
    let params = match obj.get("params") {
        None => None,
        Some(p @ Value::Object(_)) => Some(p.clone()),
        Some(_) => {
            return Err(RpcError::invalid_request(
                "Invalid Request: \"params\" must be an object",
            ));
        }
    };
    match (obj.get("method"), id) {
        (Some(Value::String(method)), Some(id)) => Ok(Incoming::Request {
            id,
            method: method.clone(),
            params,
        }),
        (Some(Value::String(method)), None) => Ok(Incoming::Notification {
            method: method.clone(),
            params,
        }),
        (Some(_), _) => Err(RpcError::invalid_request(
            "Invalid Request: \"method\" must be a string",
        )),
        (None, Some(id)) if obj.contains_key("result") || obj.contains_key("error") => {
            Ok(Incoming::Response {
                id,
                body: Value::Object(obj),
            })
        }
        (None, _) => Err(RpcError::invalid_request(
            "Invalid Request: a message needs \"method\" (request, notification) or \"id\" with \"result\"/\"error\" (response)",
        )),
    }
}

/// `{"jsonrpc":"2.0","id":..,"result":..}`.
pub fn success_response(id: &RequestId, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id.0, "result": result })
}

/// `{"jsonrpc":"2.0","id":..,"error":..}`; `id` null when the request's id
/// could not be read.
pub fn error_response(id: Option<&RequestId>, error: &RpcError) -> Value {
    let id = id.map(|i| i.0.clone()).unwrap_or(Value::Null);
    json!({ "jsonrpc": "2.0", "id": id, "error": error.to_json() })
}

/// `{"jsonrpc":"2.0","method":..,"params":..}`.
pub fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h8_framing_errors_have_the_right_codes() {
        let code = |b: &str| {
            parse_message(b.as_bytes())
                .map(|_| 0)
                .unwrap_or_else(|e| e.code.code())
        };
        assert_eq!(code("{"), -32700);
        assert_eq!(code("[]"), -32600);
        assert_eq!(code("3"), -32600);
        assert_eq!(code(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#), -32600);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#),
            -32600
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#),
            -32600
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":[1]}"#),
            -32600
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#), 0);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            0
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#), 0);
    }
}
