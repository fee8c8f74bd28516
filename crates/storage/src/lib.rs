//! taskbroker's storage interface.
//!
//! Every driver (SQLite, PostgreSQL) implements [`Storage`]: one trait per
//! entity (tasks, jobs, messages, sessions, tokens, workers, keys), plus the
//! group commit ([`Storage::write_batch`]) and a change signal
//! ([`Storage::change_feed`]). Methods are entity then verb, take `now` as
//! a parameter (callers own the clock), and speak the plain values of
//! [`model`]: no database type, no JSON-RPC shape crosses this interface.
//! Only the broker calls it.
//!
//! # What the drivers share, and what they do not
//!
//! The Rust logic both drivers need is written here once: the group
//! commit's two passes, savepoints and fan-out ([`batch`], over the
//! per-driver [`batch::GroupCommit`] statements), the served form of a new
//! task ([`as_served`]), the decoding of stored text into enums ([`text`],
//! and [`ops`] for the operators' rows) and the schema-version rule
//! ([`schema::check_version`]).
//!
//! Each driver keeps its own copy of every SQL statement, even one that
//! reads the same in both dialects once placeholders are set aside: a
//! statement is a `query!` string literal checked against its own
//! database, and the offline data (`.sqlx/`) is keyed by the statement's
//! text alone (one describe per text, naming one database), so one text
//! cannot serve both. A statement of PostgreSQL must therefore never be
//! word for word one of SQLite. The dialects differ in:
//! - placeholders: `?` or `?N` (SQLite), `$N` (PostgreSQL);
//! - nullability and type hints sqlx needs: SQLite cannot infer them
//!   through views, `RETURNING` and aggregates (`AS "seq!"`,
//!   `AS "n!: i64"`), PostgreSQL through its views;
//! - rows passed in bulk: one JSON array read with `json_each` and
//!   `value ->> 'key'` (SQLite), `jsonb_to_recordset` or arrays with
//!   `unnest` (PostgreSQL);
//! - writing: SQLite has one writer (`BEGIN IMMEDIATE` on the write
//!   connection); PostgreSQL has many, so writes to tasks take the feed's
//!   advisory lock (`pg_advisory_xact_lock`) for the change feed's order,
//!   and claims lock rows (`FOR UPDATE ... SKIP LOCKED`);
//! - functions: `MAX(a, b)` against `GREATEST(a, b)`, integer flags
//!   against `boolean`, `sqlite_master` against `to_regclass`,
//!   `EXPLAIN QUERY PLAN` against `EXPLAIN`;
//! - the change signal: `PRAGMA data_version` and a wake file (SQLite),
//!   `LISTEN`/`NOTIFY` (PostgreSQL).

#[cfg(feature = "sqlx")]
pub mod batch;
mod error;
mod metrics;
pub mod model;
pub mod ops;
pub mod retention;
pub mod schema;
mod status;
pub mod text;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use error::StoreError;
pub use metrics::{MetricsStore, QueueDepth, SchemaVersions, WorkerCounts};
pub use model::*;
pub use ops::OpsStore;
pub use retention::{Fate, PurgeReport, Retention, RetentionCandidate};
pub use status::TaskStatus;

/// How hard every commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// A commit survives power loss (SQLite `synchronous=FULL`;
    /// PostgreSQL `synchronous_commit=on`). The default.
    #[default]
    Full,
    /// A commit survives a process crash; the last transactions may roll
    /// back on power loss (SQLite `synchronous=NORMAL`; PostgreSQL
    /// `synchronous_commit=off`). Faster.
    Normal,
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Ok(Self::Full),
            "normal" => Ok(Self::Normal),
            other => Err(format!(
                "unknown durability '{other}' (expected full or normal)"
            )),
        }
    }
}

/// One write of a group commit.
#[derive(Debug, Clone)]
pub enum Write {
    /// Insert a task (status working) and, when given, its job; with
    /// `outcome` the task also finishes at once (history still shows
    /// working then the end).
    Create {
        /// The task (boxed: the largest of the writes by far).
        new: Box<NewTask>,
        /// Its job.
        job: Option<NewJob>,
        /// An immediate outcome (refused arguments).
        outcome: Option<TaskOutcome>,
    },
    /// Record the outcome and close the job, fenced by its lease
    /// (`LeaseLost` when the lease no longer holds); `Completed(false)`
    /// when the task was already terminal.
    Complete {
        /// The job.
        task_seq: i64,
        /// Its task's id.
        task_id: String,
        /// Its lease.
        lease_token: String,
        /// What to record.
        outcome: TaskOutcome,
    },
    /// Claim up to `limit` due jobs, highest priority first then oldest, within each
    /// tool's quota; all share `lease_token`. Claims share the batch's
    /// commit and see the jobs created earlier in the same batch.
    Claim {
        /// The claiming pool.
        worker: String,
        /// The new lease.
        lease_token: String,
        /// Jobs at most, per tool.
        quotas: Vec<ToolQuota>,
        /// Jobs at most.
        limit: i64,
        /// Lease length.
        lease_ms: i64,
    },
}

/// What one write of a group commit came to.
// Most writes are creations: boxing the row would cost an allocation each
// to save space in the rarer variants.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Written {
    /// The new task, as served (a queued task says so).
    Created(TaskRow),
    /// Whether the task took the outcome (false: it was already terminal).
    Completed(bool),
    /// The claimed jobs.
    Claimed(Vec<ClaimedJob>),
}

/// What a commit of one process may mean to the others: each kind wakes
/// only the processes that act on it, so the work per task does not grow
/// with the number of processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Statuses, progress or input requests changed: change feeds that
    /// follow every task (servers, for their waiting clients).
    Changed,
    /// A job became claimable (created and left queued, given back,
    /// rescued): claimers.
    Queued,
    /// A running task was cancelled, or its client answered its request:
    /// the process running it.
    Control,
    /// A slot of a tool limited across processes came back (its job ended,
    /// or waits for its client): claimers may take another job of it. No
    /// row says so, so the process says it (on every driver).
    SlotFreed,
    /// A job queued to start later became due: claimers may take it. No
    /// row changes then, so the process that queued it says it.
    Due,
}

/// Which commits of other processes wake a change feed (its `remote`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedInterest {
    /// Every change: a server, whose clients wait on any task.
    Everything,
    /// Cancellations and answers only: a worker process, which follows
    /// only the tasks it runs. Other changes are read when one of these
    /// comes (or a lease heartbeat finds them).
    Control,
}

/// The worker id of the process's worker pool, once it has one: a queued
/// signal naming other claimers does not wake it at once.
pub type ClaimerId = Arc<std::sync::OnceLock<String>>;

/// Whether a change of a task (its id, its owner) is one this process acts
/// on at once: a waiter of its own watches the task, a stream of its own
/// follows the owner or everything, or it keeps the row of a task it just
/// created (see [`ChangeFeed::wake_only_for`]). Not a pure predicate: the
/// driver calls it exactly once per notice that names a task, in the order
/// the notices are delivered (the first notice of a task created here is
/// its creation's, passed over).
pub type Concerned = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// How a queued signal's payload starts when it names the worker
/// processes to claim at once: `claim:` and their ids, separated by
/// spaces (PostgreSQL: migration V15; SQLite: the queue's wake file).
pub const NAMED_CLAIMERS: &str = "claim:";

/// Jobs a process just made claimable, as it tells them to a driver whose
/// signals name claimers ([`Storage::announce_queued`]): named are only
/// worker processes that serve the jobs' tools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuedJobs {
    /// The tool of each job whose tool is known (a tool once per job).
    pub tools: Vec<String>,
    /// How many more jobs, of tools not told (any worker may serve them).
    pub untold: usize,
}

impl QueuedJobs {
    /// One job of `tool`.
    pub fn one_of(tool: &str) -> Self {
        Self {
            tools: vec![tool.to_owned()],
            untold: 0,
        }
    }

    /// `n` jobs of tools not told.
    pub fn untold(n: usize) -> Self {
        Self {
            tools: Vec::new(),
            untold: n,
        }
    }
}

/// Whether a queued signal's `payload` asks `claimer` (this process's
/// worker id, if it has a pool) to claim at once: yes unless it names
/// claimers and not this one.
pub fn asks_to_claim(payload: &str, claimer: Option<&str>) -> bool {
    match (payload.strip_prefix(NAMED_CLAIMERS), claimer) {
        (Some(named), Some(me)) => named.split(' ').any(|id| id == me),
        _ => true,
    }
}

/// Reads of what committed, in commit order, for the change feed of one
/// process. Each feed keeps its own position; it starts at the head.
#[async_trait]
pub trait ChangeFeed: Send {
    /// Notified when another process may have committed a change of the
    /// feed's interest ([`FeedInterest`]; commits that touch only sessions,
    /// tokens, workers or leases wake no one).
    fn remote(&self) -> Arc<Notify>;
    /// Notified when any process may have made a job claimable
    /// ([`Signal::Queued`]), whatever the feed's interest, and the signal
    /// names no claimer or names this process's ([`ChangeFeed::claimer`]).
    fn queued(&self) -> Arc<Notify>;
    /// Notified when a job was queued and the signal named other worker
    /// processes to claim it (both drivers name as many live ones serving
    /// the jobs' tools as their room needs, usually one): this process looks
    /// a moment later, in case none of them could take it. `None` where
    /// signals name no one: every signal wakes [`ChangeFeed::queued`].
    fn queued_for_others(&self) -> Option<Arc<Notify>> {
        None
    }
    /// Where this process's worker id goes once its pool starts (read by
    /// the driver for each signal; until set, every signal is this
    /// process's). `None` where signals name no one.
    fn claimer(&self) -> Option<ClaimerId> {
        None
    }
    /// A number that changes after a commit of the feed's interest (cheap;
    /// used to skip reads when nothing happened). It may lag this process's
    /// own commits (on PostgreSQL it moves when the notification arrives),
    /// and, once [`ChangeFeed::wake_only_for`] was said, others' commits of
    /// tasks that concern no one here by up to about a second.
    async fn version(&mut self) -> Result<i64, StoreError>;
    /// Whether [`ChangeFeed::remote`] also wakes for this process's own
    /// commits (PostgreSQL's notifications reach every listener, the sender
    /// included). When not, a process kicks its feed after its own commits;
    /// when so, a kick would only read the same commit twice.
    fn hears_own_commits(&self) -> bool {
        false
    }
    /// Wake [`ChangeFeed::remote`] at once only for the changes of tasks
    /// that `concerned` says this process acts on; the feed catches up on
    /// the others' status changes at its leisure (about once a second), so
    /// its position keeps up, and reads their progress only along with
    /// progress that concerns it. For drivers whose signals name no task
    /// (SQLite) every change wakes, as before.
    fn wake_only_for(&mut self, _concerned: Concerned) {}
    /// Whether progress may have been committed since the last read of it
    /// (a read can be skipped when not). True unless the driver is told
    /// of progress apart: on PostgreSQL a progress commit notifies with a
    /// payload of its own. Asking counts as the start of a read.
    fn progress_may_have_changed(&mut self) -> bool {
        true
    }
    /// Progress reports committed since the last call, oldest first.
    async fn next_progress(&mut self, limit: i64) -> Result<Vec<ProgressEvent>, StoreError>;
    /// Status changes committed since the last call, oldest first.
    async fn next_events(&mut self, limit: i64) -> Result<Vec<TaskEvent>, StoreError>;
    /// Only the cancellations and answers (a change to `cancelled`, or from
    /// `input_required` back to `working`) committed since the last call,
    /// oldest first; the other changes are passed over unread. What a
    /// worker process's feed reads: the rows it reads do not grow with the
    /// tasks others run.
    async fn next_control_events(&mut self, limit: i64) -> Result<Vec<TaskEvent>, StoreError>;
}

/// Tasks and their status history (creations are writes of the group
/// commit: [`Write`]).
#[async_trait]
pub trait TaskStore {
    /// One task by id, whoever owns it (the caller checks ownership).
    async fn task_get(&self, task_id: &str) -> Result<Option<TaskRow>, StoreError>;
    /// The task `owner` created for `tool` with the idempotency key `key`,
    /// if it is still kept (expired or not).
    async fn task_by_idempotency_key(
        &self,
        owner: &str,
        tool: &str,
        key: &str,
    ) -> Result<Option<TaskRow>, StoreError>;
    /// A page of `owner`'s unexpired tasks, newest first, before `before_seq`.
    async fn task_list_page(
        &self,
        owner: &str,
        before_seq: Option<i64>,
        limit: i64,
        now: i64,
    ) -> Result<Vec<TaskRow>, StoreError>;
    /// Cancel `owner`'s task: terminal at once unless a worker runs it (then
    /// the worker is asked to stop).
    async fn task_cancel(
        &self,
        task_id: &str,
        owner: &str,
        message: &str,
        now: i64,
    ) -> Result<CancelOutcome, StoreError>;
    /// A running task's status message, fenced by the lease.
    async fn task_set_status_message(
        &self,
        task_seq: i64,
        lease_token: &str,
        message: &str,
        now: i64,
    ) -> Result<(), StoreError>;
    /// A running task's progress report, fenced by the lease.
    async fn task_record_progress(
        &self,
        task_seq: i64,
        lease_token: &str,
        progress: f64,
        total: Option<f64>,
        message: &str,
        now: i64,
    ) -> Result<(), StoreError>;
    /// Delete progress reports older than `before` (ms).
    async fn task_progress_prune(&self, before: i64) -> Result<u64, StoreError>;
    /// One bounded pass over up to `limit` tasks past their ttl, and up
    /// to `limit` kept ones now due, in one transaction: each is kept,
    /// archived or deleted with its rows as [`retention::fate`] says.
    async fn task_purge(&self, now: i64, limit: i64) -> Result<PurgeReport, StoreError>;
    /// Read only: up to `limit` tasks a purge at `now` would look at, with
    /// row keys above `after_seq`, in row order (`taskbroker prune
    /// --dry-run` pages through them).
    async fn task_purge_candidates(
        &self,
        now: i64,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<RetentionCandidate>, StoreError>;
    /// `owner`'s status changes after feed position `after_id` (GET-stream
    /// replay).
    async fn task_events_for_owner_since(
        &self,
        owner: &str,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<TaskEvent>, StoreError>;
    /// The newest feed position.
    async fn task_events_head(&self) -> Result<i64, StoreError>;
    /// How many unfinished tasks `owner` has.
    async fn task_count_open(&self, owner: &str) -> Result<i64, StoreError>;
}

/// Jobs: leases, rescue (claims and completions are writes of the group
/// commit: [`Write`]).
#[async_trait]
pub trait JobStore {
    /// Extend a lease; reports a requested cancellation.
    async fn job_heartbeat(
        &self,
        task_seq: i64,
        lease_token: &str,
        lease_ms: i64,
        now: i64,
    ) -> Result<HeartbeatOutcome, StoreError>;
    /// Close the job of a cancelled task, fenced.
    async fn job_finish_cancelled(
        &self,
        task_seq: i64,
        lease_token: &str,
        now: i64,
    ) -> Result<(), StoreError>;
    /// Give back a claimed job that never started (no attempt used).
    async fn job_unclaim(
        &self,
        task_seq: i64,
        lease_token: &str,
        now: i64,
    ) -> Result<bool, StoreError>;
    /// Whether any job could be claimed now.
    async fn job_any_runnable(&self, now: i64) -> Result<bool, StoreError>;
    /// A stopping worker gives back a running job (no attempt used).
    async fn job_release(
        &self,
        task_seq: i64,
        lease_token: &str,
        now: i64,
    ) -> Result<bool, StoreError>;
    /// Requeue (or fail) jobs whose lease expired.
    async fn job_rescue_expired(
        &self,
        backoff_ms: i64,
        now: i64,
    ) -> Result<RescueReport, StoreError>;
    /// Keep where a running job has got to (JSON text), fenced by the
    /// lease: a later attempt of the job is claimed with it.
    async fn job_checkpoint(
        &self,
        task_seq: i64,
        lease_token: &str,
        checkpoint: &str,
        now: i64,
    ) -> Result<(), StoreError>;
}

/// Upstream MCP servers: the state of each link and its last tool list.
#[async_trait]
pub trait UpstreamStore {
    /// The last tool list kept for `name` (JSON array text) and when it
    /// was listed.
    async fn upstream_tools_saved(&self, name: &str) -> Result<Option<(String, i64)>, StoreError>;
    /// Keep `name`'s tool list (`tools`, JSON array text) and the names
    /// served from it (`served`, JSON array text).
    async fn upstream_save_tools(
        &self,
        name: &str,
        tools: &str,
        served: &str,
        now: i64,
    ) -> Result<(), StoreError>;
    /// The names served of `name`'s tools changed (another upstream took
    /// or gave back a name): `served`, JSON array text. The kept tool
    /// list and when it was listed stay.
    async fn upstream_set_served(&self, name: &str, served: &str) -> Result<(), StoreError>;
    /// `name`'s link entered `state` (`starting`, `ready`, `down`);
    /// `restarted` counts a restart.
    async fn upstream_set_state(
        &self,
        name: &str,
        state: &str,
        last_error: Option<&str>,
        restarted: bool,
        now: i64,
    ) -> Result<(), StoreError>;
    /// Every upstream ever started on this database, by name.
    async fn upstreams_list(&self) -> Result<Vec<UpstreamRow>, StoreError>;
}

/// Requests a running task sends its client, and the answers.
#[async_trait]
pub trait MessageStore {
    /// Store a request and move the task to input_required, fenced.
    async fn task_message_ask(
        &self,
        task_seq: i64,
        lease_token: &str,
        message: &TaskMessage,
        now: i64,
    ) -> Result<(), StoreError>;
    /// The task's unanswered requests.
    async fn task_messages_pending(&self, task_id: &str) -> Result<Vec<TaskMessage>, StoreError>;
    /// One request by its JSON-RPC id.
    async fn task_message_get(&self, request_id: &str) -> Result<Option<TaskMessage>, StoreError>;
    /// Store `owner`'s answer; the task works again once nothing is pending.
    async fn task_message_answer(
        &self,
        request_id: &str,
        owner: &str,
        response: &str,
        now: i64,
    ) -> Result<AnswerOutcome, StoreError>;
    /// The capabilities (JSON text) of the client that created the task.
    async fn task_client_capabilities(&self, task_seq: i64) -> Result<Option<String>, StoreError>;
}

/// MCP sessions (2025-11-25).
#[async_trait]
pub trait SessionStore {
    /// Record a new session.
    async fn session_create(&self, new: &NewSession, now: i64) -> Result<(), StoreError>;
    /// One session.
    async fn session_get(&self, session_id: &str) -> Result<Option<SessionRow>, StoreError>;
    /// End a session; false when it was not live.
    async fn session_end(&self, session_id: &str, now: i64) -> Result<bool, StoreError>;
    /// Note activity.
    async fn session_touch(&self, session_id: &str, now: i64) -> Result<(), StoreError>;
    /// Sessions neither ended nor idle longer than `idle_ms`.
    async fn session_count_live(&self, idle_ms: i64, now: i64) -> Result<i64, StoreError>;
    /// Whether the session owns an unexpired, unfinished task.
    async fn session_owns_open_tasks(&self, session_id: &str, now: i64)
    -> Result<bool, StoreError>;
    /// End idle sessions and delete long-ended ones: (ended, deleted).
    async fn session_expire_idle(
        &self,
        idle_ms: i64,
        now: i64,
        batch: i64,
    ) -> Result<(u64, u64), StoreError>;
}

/// Bearer tokens, stored as hashes.
#[async_trait]
pub trait TokenStore {
    /// Store a new token.
    async fn token_create(&self, token: &NewToken, now: i64) -> Result<(), StoreError>;
    /// One token.
    async fn token_get(&self, token_id: &str) -> Result<Option<TokenRow>, StoreError>;
    /// Every token, newest first.
    async fn token_list(&self) -> Result<Vec<TokenRow>, StoreError>;
    /// Revoke; false when unknown or revoked already.
    async fn token_revoke(&self, token_id: &str, now: i64) -> Result<bool, StoreError>;
    /// Whether any token was ever created (authentication is on).
    async fn tokens_exist(&self) -> Result<bool, StoreError>;
    /// Note a use.
    async fn token_touch(&self, token_id: &str, now: i64) -> Result<(), StoreError>;
}

/// Worker pools: registration and heartbeats.
#[async_trait]
pub trait WorkerStore {
    /// Record a starting pool.
    async fn worker_register(&self, w: &NewWorker, now: i64) -> Result<(), StoreError>;
    /// The pool is alive, and its running jobs hold `jobs_running` slots
    /// (a job waiting for its client holds none).
    async fn worker_heartbeat(
        &self,
        worker_id: &str,
        jobs_running: i64,
        now: i64,
    ) -> Result<(), StoreError>;
    /// The tools the pool claims (their names), at its start and whenever
    /// they change: claim signals name a worker process only for jobs of
    /// its tools (until it says, for any).
    async fn worker_serves(&self, worker_id: &str, tools: &[String]) -> Result<(), StoreError>;
    /// The pool is stopping or stopped.
    async fn worker_set_state(
        &self,
        worker_id: &str,
        state: WorkerState,
        now: i64,
    ) -> Result<(), StoreError>;
    /// Mark pools whose heartbeat is overdue as dead.
    async fn worker_mark_dead(&self, now: i64) -> Result<u64, StoreError>;
    /// Forget pools that stopped or died before `before` (ms) and hold no
    /// running job: every start of a worker adds a row, and months of
    /// restarts would otherwise keep them all. The job history keeps
    /// their ids.
    async fn worker_purge_gone(&self, before: i64) -> Result<u64, StoreError>;
}

/// Secrets shared by every process on the database: the keys that sign
/// the `requestState` of MCP 2026-07-28 multi-round calls, one per
/// rotation period (`epoch`).
#[async_trait]
pub trait KeyStore {
    /// The key of `epoch`: the stored one, or `candidate` stored now when
    /// there was none (of processes asking at once, one wins; all get the
    /// winner).
    async fn request_state_key_get_or_create(
        &self,
        epoch: i64,
        candidate: &[u8],
        now: i64,
    ) -> Result<Vec<u8>, StoreError>;
    /// The key of `epoch`, when some process made one.
    async fn request_state_key_get(&self, epoch: i64) -> Result<Option<Vec<u8>>, StoreError>;
    /// Delete the keys of epochs before `before_epoch`.
    async fn request_state_key_purge(&self, before_epoch: i64) -> Result<u64, StoreError>;
}

/// A process's turn to write, as a driver orders writers among processes
/// (SQLite: a lock beside the database file; see its driver), held until
/// the batch it was taken for has ended. Empty for drivers with none.
#[derive(Default)]
pub struct WriteTurn(Option<Box<dyn std::any::Any + Send>>);

impl WriteTurn {
    /// A driver's turn.
    pub fn new(turn: impl std::any::Any + Send) -> Self {
        Self(Some(Box::new(turn)))
    }

    /// The driver's turn, if this is one of type `T`.
    pub fn into_inner<T: std::any::Any>(self) -> Option<T> {
        self.0
            .and_then(|t| (t as Box<dyn std::any::Any>).downcast::<T>().ok())
            .map(|t| *t)
    }
}

impl fmt::Debug for WriteTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "WriteTurn(held)"
        } else {
            "WriteTurn(none)"
        })
    }
}

/// One database, whatever the driver.
#[async_trait]
pub trait Storage:
    TaskStore
    + JobStore
    + MessageStore
    + SessionStore
    + TokenStore
    + WorkerStore
    + KeyStore
    + UpstreamStore
    + OpsStore
    + MetricsStore
    + fmt::Debug
    + Send
    + Sync
{
    /// The driver's name (`sqlite`, `postgres`).
    fn driver(&self) -> Driver;
    /// The database, for logs and messages (never a password).
    fn describe(&self) -> String;
    /// Whether a claim that finds no job costs no more than a look at
    /// whether any is runnable (one statement, no write lock): then a
    /// claimer woken by another process's commit claims at once instead of
    /// looking first.
    fn empty_claim_is_cheap(&self) -> bool {
        false
    }
    /// This process's turn to write, for a batch whose writes are chosen
    /// once it has come ([`Storage::write_batch_in`]): a group commit that
    /// waits for another process's commit meanwhile gathers the writes
    /// that arrive. Drivers with no such turn give an empty one.
    async fn write_turn(&self) -> WriteTurn {
        WriteTurn::default()
    }
    /// Run `writes` in one transaction (one fsync), in `turn` (from
    /// [`Storage::write_turn`]; an empty one: the driver takes its own).
    /// Outer error: nothing committed. Inner errors: that write alone was
    /// refused and rolled back; the others committed.
    async fn write_batch_in(
        &self,
        turn: WriteTurn,
        writes: &[Write],
        now: i64,
    ) -> Result<Vec<Result<Written, StoreError>>, StoreError>;
    /// [`Storage::write_batch_in`] in a turn of its own.
    async fn write_batch(
        &self,
        writes: &[Write],
        now: i64,
    ) -> Result<Vec<Result<Written, StoreError>>, StoreError> {
        let turn = self.write_turn().await;
        self.write_batch_in(turn, writes, now).await
    }
    /// A change feed positioned at the head, woken by the commits of
    /// `interest`; `shutdown` ends its watchers.
    async fn change_feed(
        &self,
        interest: FeedInterest,
        shutdown: CancellationToken,
    ) -> Result<Box<dyn ChangeFeed>, StoreError>;
    /// Tell other processes that this one just committed a change of kind
    /// `signal` (where the database does not tell them itself).
    fn announce(&self, signal: Signal);
    /// [`Signal::Queued`] for `jobs` this process just made claimable: a
    /// driver whose signals name claimers names as many worker processes
    /// serving their tools as it takes to run them (where the database
    /// does not name them itself).
    fn announce_queued(&self, jobs: &QueuedJobs) {
        let _ = jobs;
        self.announce(Signal::Queued);
    }
    /// Close the connections.
    async fn close(&self);
}

/// One write in a group commit of its own, for callers that have a single
/// write and no writer to queue it on (tests, benchmarks): the very path
/// the broker's writer takes ([`Storage::write_batch`]), with the write's
/// own error as the error.
#[async_trait]
pub trait OneWrite: Storage {
    /// [`Write::Create`]: the new task as served.
    async fn task_create(
        &self,
        new: &NewTask,
        job: Option<NewJob>,
        outcome: Option<&TaskOutcome>,
        now: i64,
    ) -> Result<TaskRow, StoreError> {
        let write = Write::Create {
            new: Box::new(new.clone()),
            job,
            outcome: outcome.cloned(),
        };
        match self.write_one(write, now).await? {
            Written::Created(row) => Ok(row),
            other => Err(unexpected(&other)),
        }
    }

    /// [`Write::Claim`]: the claimed jobs.
    async fn job_claim_available(
        &self,
        worker: &str,
        lease_token: &str,
        quotas: &[ToolQuota],
        limit: i64,
        lease_ms: i64,
        now: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let write = Write::Claim {
            worker: worker.to_owned(),
            lease_token: lease_token.to_owned(),
            quotas: quotas.to_vec(),
            limit,
            lease_ms,
        };
        match self.write_one(write, now).await? {
            Written::Claimed(jobs) => Ok(jobs),
            other => Err(unexpected(&other)),
        }
    }

    /// [`Write::Complete`]: whether the task took the outcome.
    async fn job_complete(
        &self,
        task_seq: i64,
        lease_token: &str,
        outcome: &TaskOutcome,
        now: i64,
    ) -> Result<bool, StoreError> {
        let write = Write::Complete {
            task_seq,
            task_id: String::new(),
            lease_token: lease_token.to_owned(),
            outcome: outcome.clone(),
        };
        match self.write_one(write, now).await? {
            Written::Completed(took) => Ok(took),
            other => Err(unexpected(&other)),
        }
    }

    /// `write` alone in a batch: what it came to.
    async fn write_one(&self, write: Write, now: i64) -> Result<Written, StoreError> {
        self.write_batch(std::slice::from_ref(&write), now)
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::Batch("a batch of one came back empty".into())))
    }
}

impl<S: Storage + ?Sized> OneWrite for S {}

/// A batch answered a write with another kind of outcome.
fn unexpected(written: &Written) -> StoreError {
    StoreError::Batch(format!("a batch of one answered {written:?}"))
}

/// The storage drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// Embedded, one machine.
    Sqlite,
    /// A server, many machines.
    Postgres,
}

impl Driver {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::asks_to_claim;

    #[test]
    fn a_queued_payload_asks_the_named_claimers_or_everyone() {
        assert!(asks_to_claim("", Some("h:1:a")), "no names: everyone");
        assert!(asks_to_claim("", None));
        assert!(asks_to_claim("claim:h:1:a h:2:b", Some("h:2:b")));
        assert!(!asks_to_claim("claim:h:1:a h:2:b", Some("h:3:c")));
        assert!(
            !asks_to_claim("claim:h:1:ab", Some("h:1:a")),
            "whole ids only"
        );
        assert!(
            asks_to_claim("claim:h:1:a", None),
            "no pool yet: everyone's"
        );
        assert!(asks_to_claim("wlaim:h:1:a", Some("h:2:b")), "a plain poke");
    }
}
