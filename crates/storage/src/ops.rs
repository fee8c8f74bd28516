//! What operators read straight from the database (`taskbroker stats`,
//! `taskbroker workers`, `taskbroker tasks list --db`): counts that index
//! searches answer, never a scan of every task, and pages of every
//! owner's tasks.

use std::str::FromStr;

use async_trait::async_trait;

use crate::text::status;
use crate::{StoreError, TaskRow, TaskStatus, WorkerKind};

/// Jobs of one tool waiting in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolQueue {
    /// The tool.
    pub tool: String,
    /// Queued jobs.
    pub jobs: i64,
    /// The earliest time one of them became runnable (its creation, or
    /// its requeue plus backoff), ms.
    pub oldest_since: i64,
}

/// Jobs of one tool a worker runs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRunning {
    /// The tool.
    pub tool: String,
    /// Running jobs (leased by a worker).
    pub jobs: i64,
}

/// Tasks that finished with one status lately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// `completed`, `failed` or `cancelled`.
    pub status: TaskStatus,
    /// Finished in the last minute.
    pub last_minute: i64,
    /// Finished in the last hour.
    pub last_hour: i64,
}

/// The failures of one tool lately.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailures {
    /// The tool.
    pub tool: String,
    /// Tasks of it that failed in the last hour.
    pub failed: i64,
    /// When the latest failed, ms.
    pub last_at: i64,
    /// The latest one's statusMessage.
    pub last_message: Option<String>,
}

/// Tasks of one tool that finished lately, whatever their final status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFinished {
    /// The tool.
    pub tool: String,
    /// Finished in the last minute.
    pub last_minute: i64,
    /// Finished in the last hour.
    pub last_hour: i64,
}

/// The state of the queue and of recent tasks at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsStats {
    /// When this was read, ms.
    pub now: i64,
    /// Queued jobs by tool, by tool name.
    pub queued: Vec<ToolQueue>,
    /// Running jobs by tool, by tool name.
    pub running: Vec<ToolRunning>,
    /// Unfinished tasks by status (`working`, `input_required`); a status
    /// with none is absent.
    pub open: Vec<(TaskStatus, i64)>,
    /// Finished tasks by status over the last minute and hour; a status
    /// with none is absent.
    pub finished: Vec<Finished>,
    /// Failed tasks by tool over the last hour, by tool name.
    pub failures: Vec<ToolFailures>,
    /// Finished tasks by tool over the last minute and hour (throughput),
    /// by tool name.
    pub finished_by_tool: Vec<ToolFinished>,
}

/// One minute, ms.
pub const MINUTE_MS: i64 = 60_000;
/// One hour, ms.
pub const HOUR_MS: i64 = 3_600_000;

/// What a worker pool is, as its row says and its heartbeat shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerLife {
    /// Claiming jobs.
    Live,
    /// Finishing its running jobs, claiming nothing new.
    Stopping,
    /// Exited cleanly.
    Stopped,
    /// Stopped heartbeating: killed or hung (marked by a broker, or its
    /// heartbeat is older than two leases).
    Dead,
}

impl WorkerLife {
    /// The stored (and shown) value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Dead => "dead",
        }
    }
}

impl FromStr for WorkerLife {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "live" => Self::Live,
            "stopping" => Self::Stopping,
            "stopped" => Self::Stopped,
            "dead" => Self::Dead,
            other => return Err(format!("unknown worker state '{other}'")),
        })
    }
}

impl FromStr for WorkerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "embedded" => Ok(Self::Embedded),
            "process" => Ok(Self::Process),
            other => Err(format!("unknown worker kind '{other}'")),
        }
    }
}

/// A row of `workers`, with the jobs it holds counted from `jobs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// `host:pid:random`.
    pub worker_id: String,
    /// In a server, or a process of its own.
    pub kind: WorkerKind,
    /// As stored; [`WorkerInfo::life`] says what it is now.
    pub state: WorkerLife,
    /// Host name.
    pub host: String,
    /// OS process id.
    pub pid: i64,
    /// Jobs at once.
    pub concurrency: i64,
    /// Its lease, ms.
    pub lease_ms: i64,
    /// ms.
    pub started_at: i64,
    /// ms.
    pub heartbeat_at: i64,
    /// ms, once stopped.
    pub stopped_at: Option<i64>,
    /// Running jobs leased to it.
    pub jobs_running: i64,
}

impl WorkerInfo {
    /// Its state at `now`: a live or stopping pool whose heartbeat is
    /// older than two leases is dead, whether or not a broker has marked
    /// it so yet (the rule of `WorkerStore::worker_mark_dead`).
    pub fn life(&self, now: i64) -> WorkerLife {
        match self.state {
            WorkerLife::Live | WorkerLife::Stopping
                if self.heartbeat_at < now.saturating_sub(self.lease_ms.saturating_mul(2)) =>
            {
                WorkerLife::Dead
            }
            other => other,
        }
    }
}

/// Which tasks an operator lists; empty fields match every task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Any of these statuses.
    pub statuses: Vec<TaskStatus>,
    /// This tool.
    pub tool: Option<String>,
    /// This owner (principal or session).
    pub owner: Option<String>,
}

impl TaskFilter {
    /// Whether it asks only for unfinished statuses (working,
    /// input_required): few tasks, found by the `tasks_open_status` index
    /// instead of walking the row key.
    pub fn only_open(&self) -> bool {
        !self.statuses.is_empty() && self.statuses.iter().all(|s| !s.is_terminal())
    }
}

/// A task as listed for operators (no arguments, no result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSummary {
    /// Row key: the paging cursor.
    pub seq: i64,
    /// The id clients use.
    pub task_id: String,
    /// Its status.
    pub status: TaskStatus,
    /// Tool name.
    pub tool: String,
    /// Who owns it.
    pub owner: String,
    /// ms.
    pub created_at: i64,
    /// ms.
    pub updated_at: i64,
    /// As served (`queued` while its job waits).
    pub status_message: Option<String>,
    /// Its job's priority, higher first (None: it has no job).
    pub priority: Option<i64>,
    /// When its job may start, while that is still to come (ms).
    pub starts_at: Option<i64>,
}

/// A task's job, as the queue holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobInfo {
    /// `queued`, `running` or `done`.
    pub state: String,
    /// Attempts started.
    pub attempt: i64,
    /// Attempts allowed.
    pub max_attempts: i64,
    /// Higher runs first.
    pub priority: i64,
    /// Runnable from, ms.
    pub run_after: i64,
    /// The worker holding its lease, or (once the job ended) the one that
    /// held it last.
    pub lease_owner: Option<String>,
    /// When that lease runs out, ms.
    pub lease_expires_at: Option<i64>,
    /// A cancel waits for the worker.
    pub cancel_requested: bool,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// ms, once done.
    pub finished_at: Option<i64>,
}

/// One status change of a task (a `task_events` row).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusChange {
    /// Feed position.
    pub id: i64,
    /// None: the task was created.
    pub from_status: Option<TaskStatus>,
    /// The new status.
    pub to_status: TaskStatus,
    /// The statusMessage that came with it.
    pub message: Option<String>,
    /// ms.
    pub at: i64,
}

/// One event of a task's job (a `job_events` row).
#[derive(Debug, Clone, PartialEq)]
pub struct JobEventInfo {
    /// Row key.
    pub id: i64,
    /// The attempt it belongs to.
    pub attempt: i64,
    /// `claimed`, `requeued` or `finished`.
    pub event: String,
    /// The worker that held the job.
    pub worker: Option<String>,
    /// Why it was requeued or how it finished.
    pub reason: Option<String>,
    /// ms.
    pub at: i64,
}

/// One progress report of a task.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgressReport {
    /// Row key.
    pub id: i64,
    /// Increases with every report.
    pub progress: f64,
    /// Known total.
    pub total: Option<f64>,
    /// What is happening.
    pub message: Option<String>,
    /// ms.
    pub at: i64,
}

/// A request a task sent to its client (elicitation, sampling), and the
/// answer.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageInfo {
    /// The id the request went out with.
    pub request_id: String,
    /// `elicitation/create`, `sampling/createMessage`, ...
    pub method: String,
    /// Its params, JSON text.
    pub params: String,
    /// `pending`, `answered` or `abandoned`.
    pub state: String,
    /// The answer, JSON text.
    pub response: Option<String>,
    /// ms.
    pub created_at: i64,
    /// ms.
    pub answered_at: Option<i64>,
}

/// Everything stored about one task, for the console's task page.
#[derive(Debug, Clone)]
pub struct TaskHistory {
    /// The task as served (arguments, status, result).
    pub task: TaskRow,
    /// Its job; None for a task whose job was purged.
    pub job: Option<JobInfo>,
    /// Its status changes, oldest first (the latest [`HISTORY_LIMIT`]).
    pub events: Vec<StatusChange>,
    /// Its job's claims, requeues and finish, oldest first (the latest
    /// [`HISTORY_LIMIT`]).
    pub job_events: Vec<JobEventInfo>,
    /// Its latest progress reports, oldest first (at most
    /// [`PROGRESS_LIMIT`]).
    pub progress: Vec<ProgressReport>,
    /// Its requests to the client, oldest first (the latest
    /// [`HISTORY_LIMIT`]).
    pub messages: Vec<MessageInfo>,
}

/// Status changes, job events and requests read for one task at most.
pub const HISTORY_LIMIT: i64 = 500;
/// Progress reports read for one task at most (the latest).
pub const PROGRESS_LIMIT: i64 = 100;

/// The plan the database picks for one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryPlan {
    /// Which query.
    pub name: &'static str,
    /// EXPLAIN's output, one line per row.
    pub plan: String,
}

/// Reads for operators.
#[async_trait]
pub trait OpsStore {
    /// Queue, running jobs, open tasks, recent finishes and failures.
    async fn ops_stats(&self, now: i64) -> Result<OpsStats, StoreError>;
    /// Every worker pool that ever registered, newest first.
    async fn ops_workers(&self) -> Result<Vec<WorkerInfo>, StoreError>;
    /// A page of every owner's tasks matching `filter`, newest first,
    /// strictly older than `before_seq` when given (expired tasks not yet
    /// purged included).
    async fn ops_task_page(
        &self,
        filter: &TaskFilter,
        before_seq: Option<i64>,
        limit: i64,
    ) -> Result<Vec<TaskSummary>, StoreError>;
    /// Everything stored about one task (any owner's); None when unknown.
    async fn ops_task_history(&self, task_id: &str) -> Result<Option<TaskHistory>, StoreError>;
    /// The plan of each query of [`OpsStore::ops_stats`] (PostgreSQL:
    /// with sequential scans discouraged, as on a large table), to check
    /// that they search indexes.
    async fn ops_stats_plans(&self, now: i64) -> Result<Vec<QueryPlan>, StoreError>;
}

/// A row of `workers` with its enum columns as stored text.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct WorkerText {
    pub worker_id: String,
    pub kind: String,
    pub state: String,
    pub host: String,
    pub pid: i64,
    pub concurrency: i64,
    pub lease_ms: i64,
    pub started_at: i64,
    pub heartbeat_at: i64,
    pub stopped_at: Option<i64>,
    pub jobs_running: i64,
}

impl TryFrom<WorkerText> for WorkerInfo {
    type Error = StoreError;
    fn try_from(w: WorkerText) -> Result<Self, StoreError> {
        Ok(WorkerInfo {
            kind: w
                .kind
                .parse()
                .map_err(|e: String| StoreError::Decode(format!("workers.kind: {e}")))?,
            state: w
                .state
                .parse()
                .map_err(|e: String| StoreError::Decode(format!("workers.state: {e}")))?,
            worker_id: w.worker_id,
            host: w.host,
            pid: w.pid,
            concurrency: w.concurrency,
            lease_ms: w.lease_ms,
            started_at: w.started_at,
            heartbeat_at: w.heartbeat_at,
            stopped_at: w.stopped_at,
            jobs_running: w.jobs_running,
        })
    }
}

/// A listed task with its status as stored text.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct TaskSummaryText {
    pub seq: i64,
    pub task_id: String,
    pub status: String,
    pub tool: String,
    pub owner: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub status_message: Option<String>,
    pub priority: Option<i64>,
    pub starts_at: Option<i64>,
}

impl TryFrom<TaskSummaryText> for TaskSummary {
    type Error = StoreError;
    fn try_from(t: TaskSummaryText) -> Result<Self, StoreError> {
        Ok(TaskSummary {
            status: status("tasks.status", &t.status)?,
            seq: t.seq,
            task_id: t.task_id,
            tool: t.tool,
            owner: t.owner,
            created_at: t.created_at,
            updated_at: t.updated_at,
            status_message: t.status_message,
            priority: t.priority,
            starts_at: t.starts_at,
        })
    }
}

/// A count by status, as stored text.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct StatusCountText {
    pub status: String,
    pub tasks: i64,
}

/// Finished tasks by status, as stored text.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct FinishedText {
    pub status: String,
    pub last_minute: i64,
    pub last_hour: i64,
}

impl TryFrom<FinishedText> for Finished {
    type Error = StoreError;
    fn try_from(f: FinishedText) -> Result<Self, StoreError> {
        Ok(Finished {
            status: status("tasks.status", &f.status)?,
            last_minute: f.last_minute,
            last_hour: f.last_hour,
        })
    }
}

/// Open counts with their statuses read.
pub fn status_counts(rows: Vec<StatusCountText>) -> Result<Vec<(TaskStatus, i64)>, StoreError> {
    rows.into_iter()
        .map(|r| Ok((status("tasks.status", &r.status)?, r.tasks)))
        .collect()
}

/// The statuses of a filter as one text, `,working,failed,` (empty: any),
/// for drivers that match with `instr`/`string_to_array`.
pub fn status_list(statuses: &[TaskStatus]) -> String {
    if statuses.is_empty() {
        return String::new();
    }
    let mut text = String::from(",");
    for s in statuses {
        text.push_str(s.as_str());
        text.push(',');
    }
    text
}

/// A status change with its statuses as stored text.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct StatusChangeText {
    pub id: i64,
    pub from_status: Option<String>,
    pub to_status: String,
    pub message: Option<String>,
    pub at: i64,
}

impl TryFrom<StatusChangeText> for StatusChange {
    type Error = StoreError;
    fn try_from(e: StatusChangeText) -> Result<Self, StoreError> {
        Ok(StatusChange {
            id: e.id,
            from_status: e
                .from_status
                .map(|s| status("task_events.from_status", &s))
                .transpose()?,
            to_status: status("task_events.to_status", &e.to_status)?,
            message: e.message,
            at: e.at,
        })
    }
}
