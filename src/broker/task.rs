//! Tasks as the rules see them ([`Task`], [`TaskDetail`], [`TaskResult`],
//! [`WaitEvent`]), and how they are read from stored rows and events and
//! how a tool's outcome is stored.

use serde_json::Value;

use crate::mcp::{ErrorCode, RpcError};
use crate::store::{
    ProgressEvent, ResultKind, TaskEvent, TaskMessage, TaskOutcome, TaskRow, TaskStatus,
};
use crate::tools::ToolOutcome;

/// A task as the rules see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Id.
    pub task_id: String,
    /// Status.
    pub status: TaskStatus,
    /// Word on the status.
    pub status_message: Option<String>,
    /// ms since epoch.
    pub created_at: i64,
    /// ms since epoch.
    pub updated_at: i64,
    /// Actual ttl (None = unlimited).
    pub ttl_ms: Option<i64>,
    /// Suggested polling interval.
    pub poll_interval_ms: Option<i64>,
    /// The caller's progressToken, kept for the task's life (T-32).
    pub progress_token: Option<Value>,
}

/// One look at a task: the row, its outcome, its open requests.
#[derive(Debug, Clone)]
pub struct TaskDetail {
    /// The task.
    pub task: Task,
    /// Its outcome ([`TaskResult::Pending`] until terminal).
    pub outcome: TaskResult,
    /// Requests to the client it waits on (while input_required).
    pub pending: Vec<TaskMessage>,
}

/// What tasks/result finds.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskResult {
    /// Terminal with the underlying request's result object.
    Result(Value),
    /// Terminal with the underlying request's JSON-RPC error object, exactly
    /// as stored (T-15).
    Error(Value),
    /// Cancelled: there is no result.
    Cancelled,
    /// Not terminal yet.
    Pending,
}

/// What a client waiting on tasks/result is told meanwhile.
///
/// Boxed: every waiting tasks/result holds a channel of these, whose first
/// block has room for 32 (a few hundred bytes boxed, kilobytes unboxed).
#[derive(Debug, Clone)]
pub enum WaitEvent {
    /// The task reported progress.
    Progress(Box<ProgressEvent>),
    /// The task changed status (the full Task).
    Status(Box<Task>),
    /// The task needs the client: this request waits for its answer.
    Ask(Box<TaskMessage>),
}

/// The task a stored row describes.
pub(super) fn task_from_row(row: &TaskRow) -> Task {
    Task {
        task_id: row.task_id.clone(),
        status: row.status,
        status_message: row.status_message.clone(),
        created_at: row.created_at,
        updated_at: row.updated_at,
        ttl_ms: row.ttl_ms,
        poll_interval_ms: row.poll_interval_ms,
        progress_token: row
            .progress_token
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok()),
    }
}

/// The task as it was right after the change `event` (for status
/// notifications, live or replayed).
pub fn task_at_event(event: &TaskEvent) -> Task {
    Task {
        task_id: event.task_id.clone(),
        status: event.to_status,
        status_message: event.message.clone(),
        created_at: event.created_at,
        updated_at: event.at,
        ttl_ms: event.ttl_ms,
        poll_interval_ms: event.poll_interval_ms,
        progress_token: None,
    }
}

/// The terminal status and stored form of a tool outcome (T-12: `isError`
/// and JSON-RPC errors both make a task `failed`, with a statusMessage).
pub fn outcome_to_record(outcome: &ToolOutcome) -> TaskOutcome {
    match outcome {
        ToolOutcome::Result(result) => {
            let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
            let status_message = is_error.then(|| {
                let text = result
                    .get("content")
                    .and_then(Value::as_array)
                    .and_then(|c| c.iter().find_map(|b| b.get("text").and_then(Value::as_str)))
                    .unwrap_or("the tool reported an error");
                format!("Tool execution failed: {}", truncate(text, 500))
            });
            TaskOutcome {
                status: if is_error {
                    TaskStatus::Failed
                } else {
                    TaskStatus::Completed
                },
                status_message,
                result: result.to_string(),
                result_kind: ResultKind::Result,
            }
        }
        ToolOutcome::Error(error) => TaskOutcome {
            status: TaskStatus::Failed,
            status_message: Some(format!(
                "Tool execution failed: {}",
                truncate(&error.message, 500)
            )),
            result: error.to_json().to_string(),
            result_kind: ResultKind::Error,
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

/// The outcome a stored row holds, as tasks/result serves it.
pub(super) fn result_of(row: &TaskRow) -> TaskResult {
    let status = row.status;
    if !status.is_terminal() {
        return TaskResult::Pending;
    }
    if status == TaskStatus::Cancelled {
        return TaskResult::Cancelled;
    }
    let parsed = row
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str::<Value>(r).ok());
    match (row.result_kind, parsed) {
        (Some(ResultKind::Result), Some(value)) => TaskResult::Result(value),
        (Some(ResultKind::Error), Some(value)) => TaskResult::Error(value),
        // A terminal task without a stored outcome: say so plainly.
        _ => TaskResult::Error(
            RpcError::new(
                ErrorCode::InternalError,
                format!(
                    "Task {} ended '{}' without a stored result{}",
                    row.task_id,
                    row.status,
                    row.status_message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ),
            )
            .to_json(),
        ),
    }
}
