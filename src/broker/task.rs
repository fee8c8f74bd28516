//! Tasks as the rules see them ([`Task`], [`TaskDetail`], [`WaitEvent`])
//! and how they are read from stored rows and events (the outcome's own
//! values are in `outcome`).

use serde_json::Value;

use super::outcome::TaskResult;
use crate::store::{ProgressEvent, TaskEvent, TaskMessage, TaskRow, TaskStatus};

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
    /// It failed with a result its tool flagged as an error.
    pub tool_error: bool,
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
        tool_error: row.tool_error,
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
        tool_error: event.tool_error,
    }
}
