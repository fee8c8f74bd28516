//! Rows with their enum columns as the text the database stores, for the
//! drivers' `query_as!` (which cannot name this crate's enums without a
//! database type); each turns into its domain row in one checked place.

use crate::{StoreError, TaskEvent, TaskOutcome, TaskRow};

/// A stored status (`column` names it in the error).
pub fn status(column: &str, value: &str) -> Result<crate::TaskStatus, StoreError> {
    value
        .parse()
        .map_err(|e| StoreError::Decode(format!("{column}: {e}")))
}

/// A stored `tasks.result_kind`.
fn result_kind(value: &str) -> Result<crate::ResultKind, StoreError> {
    value
        .parse()
        .map_err(|e: String| StoreError::Decode(format!("tasks.result_kind: {e}")))
}

/// A `tasks` row with text `status` and `result_kind`.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct TaskText {
    pub seq: i64,
    pub task_id: String,
    pub owner: String,
    pub tool: String,
    pub arguments: String,
    pub status: String,
    pub status_message: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub ttl_ms: Option<i64>,
    pub expires_at: Option<i64>,
    pub poll_interval_ms: Option<i64>,
    pub progress_token: Option<String>,
    pub result: Option<String>,
    pub result_kind: Option<String>,
    pub tool_error: bool,
}

impl TryFrom<TaskText> for TaskRow {
    type Error = StoreError;
    fn try_from(t: TaskText) -> Result<Self, StoreError> {
        Ok(TaskRow {
            status: status("tasks.status", &t.status)?,
            result_kind: t.result_kind.as_deref().map(result_kind).transpose()?,
            seq: t.seq,
            task_id: t.task_id,
            owner: t.owner,
            tool: t.tool,
            arguments: t.arguments,
            status_message: t.status_message,
            created_at: t.created_at,
            updated_at: t.updated_at,
            ttl_ms: t.ttl_ms,
            expires_at: t.expires_at,
            poll_interval_ms: t.poll_interval_ms,
            progress_token: t.progress_token,
            result: t.result,
            tool_error: t.tool_error,
        })
    }
}

/// A `task_events` row (joined with its task) with text statuses.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct TaskEventText {
    pub id: i64,
    pub task_id: String,
    pub from_status: Option<String>,
    pub to_status: String,
    pub owner: String,
    pub message: Option<String>,
    pub at: i64,
    pub created_at: i64,
    pub ttl_ms: Option<i64>,
    pub poll_interval_ms: Option<i64>,
    pub tool_error: bool,
    /// The outcome, when the change ended the task and the outcome is
    /// small (the feed reads say which).
    pub result: Option<String>,
    pub result_kind: Option<String>,
}

impl TryFrom<TaskEventText> for TaskEvent {
    type Error = StoreError;
    fn try_from(e: TaskEventText) -> Result<Self, StoreError> {
        let to_status = status("task_events.to_status", &e.to_status)?;
        let outcome = match (e.result, e.result_kind) {
            (Some(result), Some(kind)) if to_status.is_terminal() => Some(TaskOutcome {
                status: to_status,
                status_message: e.message.clone(),
                result,
                result_kind: result_kind(&kind)?,
                tool_error: e.tool_error,
            }),
            _ => None,
        };
        Ok(TaskEvent {
            outcome,
            from_status: e
                .from_status
                .as_deref()
                .map(|s| status("task_events.from_status", s))
                .transpose()?,
            to_status,
            id: e.id,
            task_id: e.task_id,
            owner: e.owner,
            message: e.message,
            at: e.at,
            created_at: e.created_at,
            ttl_ms: e.ttl_ms,
            poll_interval_ms: e.poll_interval_ms,
            tool_error: e.tool_error,
        })
    }
}

/// Convert every row, failing on the first unreadable one.
pub fn rows<T, R: TryFrom<T, Error = StoreError>>(rows: Vec<T>) -> Result<Vec<R>, StoreError> {
    rows.into_iter().map(R::try_from).collect()
}
