//! The values that cross the storage interface: rows as stored and what
//! writes take, in plain Rust types (no database type).

use crate::TaskStatus;
use std::fmt;
use std::str::FromStr;

/// What a terminal task's stored outcome is, in no protocol's terms: each
/// front end maps it to its own wire shape (status, error object, `_meta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResultKind {
    /// The tool returned: the stored text is its result as the tool gave
    /// it (a `CallToolResult`, the same object in every protocol
    /// generation). [`TaskRow::tool_error`] says whether the tool flagged
    /// it as an error (`isError`; the task then failed).
    Result,
    /// The call ended without a result: the stored text is an error record
    /// `{"code"?, "message", "data"?}`. `code` is the numeric code a tool or
    /// upstream server gave; a failure of the broker itself (a worker lost
    /// too often) has none.
    Error,
}

impl ResultKind {
    /// The stored value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Result => "result",
            Self::Error => "error",
        }
    }
}

impl FromStr for ResultKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "result" => Ok(Self::Result),
            "error" => Ok(Self::Error),
            other => Err(format!("unknown result kind '{other}'")),
        }
    }
}

/// Where a worker pool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerKind {
    /// Inside `taskbroker serve`.
    Embedded,
    /// A `taskbroker worker` process.
    Process,
}

impl WorkerKind {
    /// The stored value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::Process => "process",
        }
    }
}

/// What a worker pool says of itself (`dead` is only ever set by others).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerState {
    /// Finishing its running jobs, claiming nothing new.
    Stopping,
    /// Gone, cleanly.
    Stopped,
}

impl WorkerState {
    /// The stored value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
        }
    }
}

impl fmt::Display for WorkerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A row of `tasks`, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// Row key: orders tasks/list, encoded in cursors.
    pub seq: i64,
    /// The id clients use.
    pub task_id: String,
    /// Who may see the task (session or principal).
    pub owner: String,
    /// Tool name.
    pub tool: String,
    /// Tool arguments (JSON text).
    pub arguments: String,
    /// One of the five MCP statuses.
    pub status: TaskStatus,
    /// Human-readable word on the status.
    pub status_message: Option<String>,
    /// Creation time, ms since the epoch.
    pub created_at: i64,
    /// Last change, ms since the epoch.
    pub updated_at: i64,
    /// Actual ttl; `None` = unlimited.
    pub ttl_ms: Option<i64>,
    /// `created_at + ttl_ms`.
    pub expires_at: Option<i64>,
    /// Suggested polling interval.
    pub poll_interval_ms: Option<i64>,
    /// The caller's progressToken (JSON text), kept for the task's life.
    pub progress_token: Option<String>,
    /// The outcome (JSON text, see [`ResultKind`]) once terminal.
    pub result: Option<String>,
    /// What `result` holds, once terminal.
    pub result_kind: Option<ResultKind>,
    /// The task failed because its tool returned a result flagged as an
    /// error (`isError`), stored as the tool gave it.
    pub tool_error: bool,
}

/// A just-created row as reads of the `tasks_as_served` view show it:
/// while its job waits in the queue (`queued`: created with a job that no
/// claim of the same commit took), a working task's statusMessage says
/// `queued`; otherwise a working task's is what is stored, which for a new
/// task is nothing. `row` may be the row as stored (the grouped insert
/// returns it) or as the view read it inside the transaction, before a
/// claim of the same commit took its job (then the word goes: the new run
/// has said nothing yet). Terminal rows are left as they are.
pub fn as_served(mut row: TaskRow, queued: bool) -> TaskRow {
    if row.status == TaskStatus::Working {
        if queued {
            row.status_message = Some("queued".to_owned());
        } else if row.status_message.as_deref() == Some("queued") {
            row.status_message = None;
        }
    }
    row
}

impl TaskRow {
    /// The row once `outcome` was recorded on it at `at`, as the stores
    /// write it (status, statusMessage, result, its kind, the tool error
    /// flag, lastUpdatedAt): for a process that committed the outcome and
    /// has the row from before, instead of reading it again.
    pub fn ended_with(mut self, outcome: &TaskOutcome, at: i64) -> TaskRow {
        self.status = outcome.status;
        self.status_message = outcome.status_message.clone();
        self.result = Some(outcome.result.clone());
        self.result_kind = Some(outcome.result_kind);
        self.tool_error = outcome.tool_error;
        self.updated_at = at;
        self
    }
}

/// What a new task row holds.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// Random id (>= 122 bits).
    pub task_id: String,
    /// Owner (session or principal).
    pub owner: String,
    /// Tool name.
    pub tool: String,
    /// Arguments as JSON text.
    pub arguments: String,
    /// Actual ttl (already clamped).
    pub ttl_ms: Option<i64>,
    /// Suggested polling interval.
    pub poll_interval_ms: Option<i64>,
    /// progressToken as JSON text.
    pub progress_token: Option<String>,
    /// The session that created it (2025-11-25).
    pub session_id: Option<String>,
    /// The client capabilities (JSON text) the creating request declared,
    /// for requests without a session (2026-07-28).
    pub client_capabilities: Option<String>,
    /// The client's idempotency key: unique per owner and tool while the
    /// task is kept (a second creation with it fails with
    /// [`StoreError::IdempotencyKeyTaken`](crate::StoreError::IdempotencyKeyTaken)).
    pub idempotency_key: Option<String>,
    /// What becomes of it once its ttl has passed.
    pub retention: crate::retention::Retention,
    /// The W3C trace context it runs under (`traceparent`, 55 characters),
    /// if the call had one or the broker exports traces.
    pub traceparent: Option<String>,
    /// The `tracestate` that came with it (at most 512 characters).
    pub tracestate: Option<String>,
}

/// The job that runs a new task.
#[derive(Debug, Clone, Copy)]
pub struct NewJob {
    /// How many times a lost worker may be replaced before the task fails.
    pub max_attempts: i64,
    /// Higher runs first.
    pub priority: i64,
    /// Not claimed before this, ms (None: now, the creating commit's
    /// time).
    pub run_after: Option<i64>,
}

/// A terminal outcome to record on a task.
#[derive(Debug, Clone)]
pub struct TaskOutcome {
    /// `Completed`, or `Failed` (an error, or a result the tool flagged as
    /// an error).
    pub status: TaskStatus,
    /// Explanation (failures and tool errors).
    pub status_message: Option<String>,
    /// JSON text of the outcome (see [`ResultKind`]).
    pub result: String,
    /// What `result` holds.
    pub result_kind: ResultKind,
    /// The tool flagged its result as an error (only with `Failed` and a
    /// `Result` kind).
    pub tool_error: bool,
}

/// What `task_cancel` found.
#[derive(Debug)]
pub enum CancelOutcome {
    /// The task is now cancelled.
    Cancelled(Box<TaskRow>),
    /// Already terminal: its status.
    Terminal(TaskStatus),
    /// No such task for this owner.
    NotFound,
}

/// A progress report of a running task, from the change feed.
#[derive(Debug, Clone)]
pub struct ProgressEvent {
    /// Feed position (in `task_progress`).
    pub id: i64,
    /// The task.
    pub task_id: String,
    /// Increases with every report.
    pub progress: f64,
    /// Known total.
    pub total: Option<f64>,
    /// What is happening.
    pub message: Option<String>,
}

/// A row of the change feed.
#[derive(Debug, Clone)]
pub struct TaskEvent {
    /// Feed position.
    pub id: i64,
    /// The task that changed.
    pub task_id: String,
    /// Its status before (`None`: the task was created).
    pub from_status: Option<TaskStatus>,
    /// Its new status.
    pub to_status: TaskStatus,
    /// Who owns the task.
    pub owner: String,
    /// The statusMessage that came with the change.
    pub message: Option<String>,
    /// The task failed with a result its tool flagged as an error
    /// (meaningful when `to_status` is `Failed`).
    pub tool_error: bool,
    /// What was recorded, when the change ended the task (completed or
    /// failed) and the outcome is small (up to 4 KB): a waiter needs not
    /// read the task again. `None` otherwise, and in reads that do not
    /// carry it.
    pub outcome: Option<TaskOutcome>,
    /// When it changed (the task's lastUpdatedAt then), ms.
    pub at: i64,
    /// The task's creation time, ms.
    pub created_at: i64,
    /// The task's ttl.
    pub ttl_ms: Option<i64>,
    /// The task's pollInterval.
    pub poll_interval_ms: Option<i64>,
}

/// A job this worker now holds a lease on.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    /// The task's row key (also the job's key).
    pub task_seq: i64,
    /// The task's id.
    pub task_id: String,
    /// Tool to run.
    pub tool: String,
    /// Arguments (JSON text).
    pub arguments: String,
    /// progressToken (JSON text), if the caller gave one.
    pub progress_token: Option<String>,
    /// 1 for the first run.
    pub attempt: i64,
    /// Attempts allowed before the task fails.
    pub max_attempts: i64,
    /// Lower runs first.
    pub priority: i64,
    /// Fences every later write of this run.
    pub lease_token: String,
    /// Where an earlier attempt had got to, as it saved it (JSON text), so
    /// that a tool that can resume does not start over.
    pub checkpoint: Option<String>,
    /// The task's W3C trace context, as stored at its creation.
    pub traceparent: Option<String>,
    /// Its `tracestate`, if any.
    pub tracestate: Option<String>,
    /// When the job last became runnable (ms; `run_after`: its creation,
    /// its delayed start, or its requeue), for the time it waited.
    pub runnable_since: i64,
}

/// How many jobs of one tool a claim may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolQuota {
    /// The tool.
    pub tool: String,
    /// Free slots for it in the claiming pool.
    pub free: i64,
    /// Its limit across every process on the database, if it has one:
    /// the claim takes no more than this minus the tool's running jobs
    /// (those of tasks waiting for client input do not count).
    pub global: Option<i64>,
}

/// What a heartbeat learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// The task was cancelled: stop the tool.
    pub cancel_requested: bool,
}

/// What one rescue pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RescueReport {
    /// Jobs queued again for another attempt.
    pub requeued: u64,
    /// Tasks failed because no attempts remained: the tool of each.
    pub failed: Vec<String>,
    /// Jobs of cancelled tasks whose worker vanished, closed.
    pub closed: u64,
}

/// A request of a task to its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskMessage {
    /// The request's id (the key a client answers it by).
    pub request_id: String,
    /// The task.
    pub task_id: String,
    /// `elicitation/create` or `sampling/createMessage`.
    pub method: String,
    /// Params (JSON text) as the tool gave them: no protocol's `_meta`
    /// (each front end adds its own when it delivers the request).
    pub params: String,
    /// The client's answer (JSON text), once answered: `{"result": ...}` or
    /// `{"error": {"code"?, "message", "data"?}}`.
    pub response: Option<String>,
}

/// What an answer found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerOutcome {
    /// Stored; the task is back to working if nothing else is pending.
    Stored,
    /// No pending request with that id for that owner.
    Unknown,
}

/// A stored MCP session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// The Mcp-Session-Id value.
    pub session_id: String,
    /// Negotiated protocol version.
    pub protocol_version: String,
    /// The client's `clientInfo` (JSON text).
    pub client_info: String,
    /// The client's declared capabilities (JSON text).
    pub client_capabilities: String,
    /// When initialize made it, ms.
    pub created_at: i64,
    /// Last request seen (updated at most once a minute), ms.
    pub last_seen_at: i64,
    /// Set by DELETE: the session is over.
    pub ended_at: Option<i64>,
    /// The principal that opened it (None without authentication).
    pub principal: Option<String>,
}

/// What initialize stores.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// Random id.
    pub session_id: String,
    /// Negotiated protocol version.
    pub protocol_version: String,
    /// `clientInfo` as JSON text.
    pub client_info: String,
    /// `capabilities` as JSON text.
    pub client_capabilities: String,
    /// The authenticated principal, if any.
    pub principal: Option<String>,
}

/// A stored token (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    /// Public id.
    pub token_id: String,
    /// Whose it is.
    pub principal: String,
    /// SHA-256 of the secret.
    pub secret_hash: Vec<u8>,
    /// ms.
    pub created_at: i64,
    /// ms; None = never.
    pub expires_at: Option<i64>,
    /// ms; set by revoke.
    pub revoked_at: Option<i64>,
    /// ms; updated at most once a minute.
    pub last_used_at: Option<i64>,
    /// May open the web console, which shows every principal's tasks.
    pub operator: bool,
}

/// A token to store.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// Public id.
    pub token_id: String,
    /// Whose it is.
    pub principal: String,
    /// SHA-256 of the secret.
    pub secret_hash: Vec<u8>,
    /// ms; None = never.
    pub expires_at: Option<i64>,
    /// May open the web console, which shows every principal's tasks.
    pub operator: bool,
}

/// A pool announcing itself.
#[derive(Debug, Clone)]
pub struct NewWorker {
    /// `host:pid:random`.
    pub worker_id: String,
    /// OS process id.
    pub pid: i64,
    /// Host name.
    pub host: String,
    /// In a server process, or a worker process of its own.
    pub kind: WorkerKind,
    /// Jobs at once.
    pub concurrency: i64,
    /// Its lease length.
    pub lease_ms: i64,
}

/// An upstream MCP server as the process that runs its link last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamRow {
    /// Its name in the config file.
    pub name: String,
    /// `starting`, `ready` or `down`.
    pub state: String,
    /// Why it went down (or last failed), if it did.
    pub last_error: Option<String>,
    /// When the state was entered (ms).
    pub state_at: i64,
    /// How many times its connection was started again.
    pub restarts: i64,
    /// Its last `tools/list` (a JSON array), if it ever answered one.
    pub tools: Option<String>,
    /// The names the broker serves from it (a JSON array).
    pub served: Option<String>,
    /// When `tools` was listed (ms).
    pub listed_at: Option<i64>,
}
