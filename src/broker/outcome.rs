//! How a task ended and how a client answered, in no protocol's terms: the
//! values the broker stores and reads back. Each front end maps them to its
//! own wire shape (a 2025-11-25 `failed` status for a tool error, a JSON-RPC
//! error object, related-task `_meta`...); nothing here is a wire message.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mcp::{ErrorCode, RpcError};
use crate::store::{ResultKind, TaskOutcome, TaskRow, TaskStatus};
use crate::tools::ToolOutcome;

/// An outcome without a result: what went wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// The numeric code the tool, upstream server or client gave; `None`
    /// for a failure of the broker itself (a worker lost too often), which
    /// front ends report as an internal error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    /// What went wrong, for people.
    pub message: String,
    /// Anything more the error carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ErrorRecord {
    /// A failure of the broker itself (no code).
    pub fn broker(message: impl Into<String>) -> Self {
        Self {
            code: None,
            message: message.into(),
            data: None,
        }
    }
}

impl ErrorRecord {
    /// As the error a tool (or a front end) works with: a record without a
    /// code is an internal error.
    pub fn to_rpc(&self) -> RpcError {
        let mut error = RpcError::new(
            ErrorCode::from_code(self.code.unwrap_or(ErrorCode::InternalError.code())),
            self.message.clone(),
        );
        error.data = self.data.clone();
        error
    }
}

impl From<&RpcError> for ErrorRecord {
    fn from(e: &RpcError) -> Self {
        Self {
            code: Some(e.code.code()),
            message: e.message.clone(),
            data: e.data.clone(),
        }
    }
}

/// What a terminal task holds, as read back.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskResult {
    /// The tool returned this result (a `CallToolResult`). `tool_error`:
    /// the tool flagged it as an error (`isError`; the task failed).
    Result {
        /// The result, as the tool gave it.
        value: Value,
        /// The tool flagged it as an error.
        tool_error: bool,
    },
    /// The call ended without a result (the task failed).
    Error(ErrorRecord),
    /// Cancelled: there is no result.
    Cancelled,
    /// Not terminal yet.
    Pending,
}

/// A client's answer to a request of a task, as stored: a result or an
/// error, without any envelope. Serialised as `{"result": ...}` or
/// `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAnswer {
    /// The answer (an `ElicitResult`, a `CreateMessageResult`...).
    Result(Value),
    /// The client refused or failed the request.
    Error(ErrorRecord),
}

impl ClientAnswer {
    /// The stored form.
    pub fn to_stored(&self) -> String {
        // A Value-only enum always serialises.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Read a stored answer back; `None` if it is not one. Keys other than
    /// `result` and `error` are ignored.
    pub fn from_stored(text: &str) -> Option<Self> {
        let mut stored: serde_json::Map<String, Value> = serde_json::from_str(text).ok()?;
        if let Some(result) = stored.remove("result") {
            return Some(Self::Result(result));
        }
        serde_json::from_value(stored.remove("error")?)
            .ok()
            .map(Self::Error)
    }
}

/// The status and stored form of a tool's outcome. Both a result the tool
/// flagged as an error (`isError`) and an error make the task *failed*
/// (the tool did not do its job), with a statusMessage that says why; the
/// first is stored as the tool gave it with `tool_error`, so each front end
/// can show it its own way (2025-11-25: failed, T-12; 2026-07-28: completed
/// with the result, SEP-2663) without looking into the outcome.
pub fn outcome_to_record(outcome: &ToolOutcome) -> TaskOutcome {
    match outcome {
        ToolOutcome::Result(result) => {
            let tool_error = result.get("isError").and_then(Value::as_bool) == Some(true);
            let status_message = tool_error.then(|| {
                let text = result
                    .get("content")
                    .and_then(Value::as_array)
                    .and_then(|c| c.iter().find_map(|b| b.get("text").and_then(Value::as_str)))
                    .unwrap_or("the tool reported an error");
                format!("Tool execution failed: {}", truncate(text, 500))
            });
            TaskOutcome {
                status: if tool_error {
                    TaskStatus::Failed
                } else {
                    TaskStatus::Completed
                },
                status_message,
                result: result.to_string(),
                result_kind: ResultKind::Result,
                tool_error,
            }
        }
        ToolOutcome::Error(error) => TaskOutcome {
            status: TaskStatus::Failed,
            status_message: Some(format!(
                "Tool execution failed: {}",
                truncate(&error.message, 500)
            )),
            result: serde_json::to_string(&ErrorRecord::from(error))
                .unwrap_or_else(|_| "{}".to_owned()),
            result_kind: ResultKind::Error,
            tool_error: false,
        },
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(max).collect();
        format!("{cut}...")
    }
}

/// The outcome a stored row holds.
pub(super) fn result_of(row: &TaskRow) -> TaskResult {
    let status = row.status;
    if !status.is_terminal() {
        return TaskResult::Pending;
    }
    if status == TaskStatus::Cancelled {
        return TaskResult::Cancelled;
    }
    let text = row.result.as_deref();
    match row.result_kind {
        Some(ResultKind::Result) => {
            if let Some(value) = text.and_then(|r| serde_json::from_str::<Value>(r).ok()) {
                return TaskResult::Result {
                    value,
                    tool_error: row.tool_error,
                };
            }
        }
        Some(ResultKind::Error) => {
            if let Some(record) = text.and_then(|r| serde_json::from_str::<ErrorRecord>(r).ok()) {
                return TaskResult::Error(record);
            }
        }
        None => {}
    }
    // A terminal task without a readable outcome: say so plainly.
    TaskResult::Error(ErrorRecord::broker(format!(
        "Task {} ended '{}' without a stored result{}",
        row.task_id,
        row.status,
        row.status_message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_error_and_an_error_fail_without_any_wire_shape() {
        let flagged = outcome_to_record(&ToolOutcome::tool_error("disk full"));
        assert_eq!(flagged.status, TaskStatus::Failed);
        assert_eq!(flagged.result_kind, ResultKind::Result);
        assert!(flagged.tool_error);
        assert_eq!(
            flagged.status_message.as_deref(),
            Some("Tool execution failed: disk full")
        );
        let failed = outcome_to_record(&ToolOutcome::Error(RpcError::invalid_params("bad")));
        assert_eq!(failed.status, TaskStatus::Failed);
        assert!(!failed.tool_error);
        let record: ErrorRecord = serde_json::from_str(&failed.result).expect("a record");
        assert_eq!(record.code, Some(-32602));
        assert!(!failed.result.contains("jsonrpc"));
    }

    #[test]
    fn answers_are_stored_without_an_envelope_and_read_back() {
        let answer = ClientAnswer::Result(serde_json::json!({"action": "accept"}));
        assert_eq!(answer.to_stored(), r#"{"result":{"action":"accept"}}"#);
        assert_eq!(ClientAnswer::from_stored(&answer.to_stored()), Some(answer));
        // An answer with more keys than the one it needs still reads.
        let old = r#"{"jsonrpc":"2.0","id":"tb-1","error":{"code":-1,"message":"no"}}"#;
        assert!(matches!(
            ClientAnswer::from_stored(old),
            Some(ClientAnswer::Error(ErrorRecord { code: Some(-1), .. }))
        ));
    }
}
