//! Request params and result shapes (schema 2025-11-25, `$defs` names).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::RpcError;

/// Read `params` into a typed struct; a mismatch is -32602 naming the
/// method and serde's reason.
pub fn parse_params<T: serde::de::DeserializeOwned>(
    method: &str,
    params: Option<&Value>,
) -> Result<T, RpcError> {
    let value = params.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    serde_json::from_value(value)
        .map_err(|e| RpcError::invalid_params(format!("Invalid params for {method}: {e}")))
}

/// `initialize` params.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// The version the client wants.
    pub protocol_version: String,
    /// What the client can do.
    #[serde(default)]
    pub capabilities: Map<String, Value>,
    /// Name and version of the client.
    #[serde(default)]
    pub client_info: Map<String, Value>,
}

/// `params.task` of a task-augmented request.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TaskMetadata {
    /// Requested lifetime from creation, ms.
    #[serde(default)]
    pub ttl: Option<i64>,
}

/// `params._meta` of a request.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RequestMeta {
    /// Token for notifications/progress: a string or an integer.
    #[serde(default)]
    pub progress_token: Option<ProgressToken>,
}

/// A progressToken: string or integer.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum ProgressToken {
    /// `"abc"`.
    String(String),
    /// `7`.
    Integer(i64),
}

/// `tools/call` params.
#[derive(Debug, Deserialize)]
pub struct CallToolParams {
    /// The tool.
    pub name: String,
    /// Its arguments (an object).
    #[serde(default)]
    pub arguments: Option<Map<String, Value>>,
    /// Present: run as a task.
    #[serde(default)]
    pub task: Option<TaskMetadata>,
    /// progressToken and friends.
    #[serde(default, rename = "_meta")]
    pub meta: Option<RequestMeta>,
}

/// `tasks/get`, `tasks/result`, `tasks/cancel` params. `_meta` is ignored
/// (T-29: the taskId param is authoritative).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskIdParams {
    /// The task.
    pub task_id: String,
}

/// `tasks/list` and `tools/list` params.
#[derive(Debug, Deserialize, Default)]
pub struct PaginatedParams {
    /// Opaque cursor from the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// The `Task` object (schema `$defs/Task`).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// Id made by the receiver.
    pub task_id: String,
    /// working | input_required | completed | failed | cancelled.
    pub status: String,
    /// Human-readable word on the status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub last_updated_at: String,
    /// Actual ttl in ms; null = unlimited. The key is always present (T-10).
    pub ttl: Option<i64>,
    /// Suggested ms between polls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<i64>,
}

/// Whether a client that declared `capabilities` can receive `method`:
/// `sampling/createMessage` needs `sampling`; `elicitation/create` needs
/// `elicitation` with the request's mode (an empty `elicitation` object
/// means form mode only). Other methods need nothing.
pub fn client_supports(capabilities: &Value, method: &str, params: &Value) -> bool {
    match method {
        "sampling/createMessage" => capabilities.get("sampling").is_some(),
        "roots/list" => capabilities.get("roots").is_some(),
        "elicitation/create" => {
            let Some(elicitation) = capabilities.get("elicitation") else {
                return false;
            };
            match params.get("mode").and_then(Value::as_str).unwrap_or("form") {
                "form" => {
                    elicitation.get("form").is_some()
                        || elicitation
                            .as_object()
                            .is_some_and(|o| o.is_empty() || !o.contains_key("url"))
                }
                mode => elicitation.get(mode).is_some(),
            }
        }
        _ => true,
    }
}

/// MCP log levels (RFC 5424 severities), least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// debug
    Debug,
    /// info
    Info,
    /// notice
    Notice,
    /// warning
    Warning,
    /// error
    Error,
    /// critical
    Critical,
    /// alert
    Alert,
    /// emergency
    Emergency,
}

impl LogLevel {
    /// Every level, least severe first.
    pub const ALL: [LogLevel; 8] = [
        Self::Debug,
        Self::Info,
        Self::Notice,
        Self::Warning,
        Self::Error,
        Self::Critical,
        Self::Alert,
        Self::Emergency,
    ];
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Notice => "notice",
            Self::Warning => "warning",
            Self::Error => "error",
            Self::Critical => "critical",
            Self::Alert => "alert",
            Self::Emergency => "emergency",
        }
    }
    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.as_str() == s)
    }
}
