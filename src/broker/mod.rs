//! The task rules both protocol generations share: create, get, result,
//! list, cancel, ttl, input requests, owners, cursors, the keys that sign
//! what clients carry. Speaks in domain types; knows nothing of HTTP, and
//! leaves every SQL statement to the storage drivers.

mod created;
pub mod cursor;
mod feed;
pub mod idempotency;
pub mod keys;
pub mod maintenance;
mod open_tasks;
mod outcome;
mod owner;
pub mod records;
pub mod schedule;
mod session_expiry;
pub mod slots;
mod start_alarm;
mod task;

mod writer;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{Notify, mpsc};

use crate::clock::now_ms;
use crate::defaults;
use crate::store::{
    AnswerOutcome, CancelOutcome, Driver, NewJob, NewTask, Store, StoreError, TaskEvent, TaskRow,
};
use crate::tools::{Registry, TaskSupport, Tool, ToolCatalog, ToolOutcome};
use crate::traces::{self, TraceContext};
use open_tasks::OpenTasks;

pub use crate::store::TaskStatus;
pub use feed::{Feed, FeedEvent, Following, TaskWatch};
use outcome::result_of;
pub use outcome::{ClientAnswer, ErrorRecord, TaskResult, outcome_to_record};
pub use owner::Owner;
pub use session_expiry::SessionExpiry;
use task::task_from_row;
pub use task::{Task, TaskDetail, WaitEvent, task_at_event};
pub use writer::{HandedOff, Handoff, Writer};

/// Limits and defaults of task handling.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// ttl when the client asks for none; `None` = unlimited.
    pub default_ttl_ms: Option<i64>,
    /// Requested ttls are clamped to this (T-34).
    pub max_ttl_ms: i64,
    /// pollInterval on every task.
    pub poll_interval_ms: i64,
    /// Tasks per tasks/list page.
    pub page_size: i64,
    /// Non-terminal tasks one owner may have at once (T-38).
    pub max_open_tasks: i64,
    /// Largest tool arguments, in bytes of JSON.
    pub max_argument_bytes: usize,
    /// Every tool's retention rule, unless its own config says otherwise.
    pub retention: crate::tools::RetentionSettings,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            default_ttl_ms: Some(defaults::DEFAULT_TTL.as_millis() as i64),
            max_ttl_ms: defaults::MAX_TTL.as_millis() as i64,
            poll_interval_ms: defaults::POLL_INTERVAL.as_millis() as i64,
            page_size: defaults::PAGE_SIZE as i64,
            max_open_tasks: defaults::MAX_OPEN_TASKS,
            max_argument_bytes: defaults::MAX_ARGUMENT_BYTES,
            retention: Default::default(),
        }
    }
}

/// Who creates a task, as a front end knows it.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// Whose task it is.
    pub owner: &'a Owner,
    /// The 2025-11-25 session the request came in (its capabilities apply).
    pub session_id: Option<&'a str>,
    /// The client capabilities the request itself declared (2026-07-28).
    pub client_capabilities: Option<&'a Value>,
    /// The client's idempotency key for a task call
    /// ([`idempotency::key_of`]).
    pub idempotency_key: Option<&'a str>,
    /// The priority and start the call asked for
    /// ([`schedule::Requested::of`]).
    pub schedule: schedule::Requested,
    /// The W3C trace context the call came with
    /// ([`TraceContext::of_request`]).
    pub trace: Option<&'a TraceContext>,
}

/// Why a task operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// No task with that id for this requestor (T-35, T-36).
    #[error("Task not found")]
    NotFound,
    /// Its ttl has passed (T-33).
    #[error("Task has expired")]
    Expired,
    /// tasks/list cursor that is not ours (T-19).
    #[error("Invalid cursor")]
    InvalidCursor,
    /// Cancel of a terminal task (T-20).
    #[error("Cannot cancel task: already in terminal status '{0}'")]
    Terminal(TaskStatus),
    /// tools/call of a name we do not serve.
    #[error("Unknown tool: {0}")]
    UnknownTool(String),
    /// Task call of a forbidden tool (T-4).
    #[error(
        "Tool '{0}' does not support task-augmented calls (execution.taskSupport is 'forbidden')"
    )]
    TaskForbidden(String),
    /// Plain call of a task-only tool (T-5).
    #[error(
        "Tool '{0}' must be called as a task (execution.taskSupport is 'required'); add params.task"
    )]
    TaskRequired(String),
    /// Params the rules refuse (e.g. a negative ttl).
    #[error("{0}")]
    InvalidParams(String),
    /// The process is stopping: the change feed closed under a waiter.
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// A limit of the broker (T-38), and when to try again.
    #[error("{0}")]
    Limit(String, Duration),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The task engine of one process.
#[derive(Debug, Clone)]
pub struct Broker {
    store: Store,
    tools: Arc<ToolCatalog>,
    config: BrokerConfig,
    feed: Feed,
    /// Wakes the embedded worker pool when a job is queued and not handed
    /// to it (the writer and maintenance notify it).
    job_queued: Arc<Notify>,
    /// Group commit of task creations.
    writer: Writer,
    /// Bounds of open tasks per requestor (T-38).
    open_tasks: Arc<OpenTasks>,
    /// The keys shared by every broker on the database.
    signing_keys: Arc<keys::SigningKeys>,
}

/// How often a waiting tasks/result looks for further requests of an
/// input_required task.
const INPUT_REQUIRED_LOOK: Duration = Duration::from_secs(1);

/// What the first look of a tasks/result found.
#[derive(Debug)]
pub enum ResultLook {
    /// The task is terminal: its outcome.
    Ready(TaskResult),
    /// Not yet: wait with [`Broker::tasks_result_wait`].
    Pending(PendingResult),
}

/// A tasks/result that waits: the row as first read, and the feed
/// subscribed before that read.
#[derive(Debug)]
pub struct PendingResult {
    feed: TaskWatch,
    row: Box<TaskRow>,
}

impl PendingResult {
    /// The task as first read.
    pub fn task(&self) -> Task {
        task_from_row(&self.row)
    }
}

impl Broker {
    /// A broker over `store` serving `tools`.
    pub fn new(
        store: Store,
        tools: Arc<ToolCatalog>,
        config: BrokerConfig,
        feed: Feed,
        writer: Writer,
        job_queued: Arc<Notify>,
    ) -> Self {
        let shared = store.driver() == Driver::Postgres;
        Self {
            writer,
            signing_keys: Arc::new(keys::SigningKeys::new(store.clone())),
            store,
            tools,
            feed,
            job_queued,
            open_tasks: Arc::new(OpenTasks::new(config.max_open_tasks, shared)),
            config,
        }
    }

    /// The store underneath.
    pub(in crate::broker) fn store(&self) -> &Store {
        &self.store
    }
    /// The sessions, for the 2025-11-25 front end.
    pub fn sessions(&self) -> records::SessionRecords {
        records::SessionRecords::new(self.store.clone())
    }
    /// The bearer tokens, for authentication and `taskbroker token`.
    pub fn tokens(&self) -> records::TokenRecords {
        records::TokenRecords::new(self.store.clone())
    }
    /// The keys that sign what clients carry between requests, shared by
    /// every broker on the database.
    pub fn signing_keys(&self) -> &keys::SigningKeys {
        &self.signing_keys
    }
    /// A worker pool's rows and leases.
    pub fn pool_records(&self) -> records::PoolRecords {
        records::PoolRecords::new(self.store.clone())
    }
    /// The newest position of the status-change feed (a GET stream that
    /// resumes nothing starts there).
    pub async fn status_feed_head(&self) -> Result<i64, BrokerError> {
        Ok(self.store.task_events_head().await?)
    }
    /// Sessions neither ended nor idle by `expiry`.
    pub async fn live_sessions(&self, expiry: SessionExpiry) -> Result<i64, BrokerError> {
        Ok(self
            .store
            .session_count_live(expiry.idle_ms(), now_ms())
            .await?)
    }
    /// The tools served now (upstream servers' tools change while the
    /// broker runs: take it again for each request).
    pub fn tools(&self) -> Arc<Registry> {
        self.tools.current()
    }
    /// The served tools as they change.
    pub fn catalog(&self) -> &Arc<ToolCatalog> {
        &self.tools
    }
    /// Limits in force.
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }
    /// The group-commit writer.
    pub fn writer(&self) -> &Writer {
        &self.writer
    }
    /// The change feed.
    pub fn feed(&self) -> &Feed {
        &self.feed
    }
    /// Notified whenever this process queues a job.
    pub fn job_queued(&self) -> Arc<Notify> {
        self.job_queued.clone()
    }

    /// The tool `owner` calls, after the taskSupport rules (T-4, T-5,
    /// T-6); a tool hidden from its principal is unknown to it.
    pub fn tool_for_call(
        &self,
        name: &str,
        owner: &Owner,
        as_task: bool,
    ) -> Result<Arc<dyn Tool>, BrokerError> {
        let tools = self.tools.current();
        let tool = tools
            .get_for(name, owner.principal_name())
            .ok_or_else(|| BrokerError::UnknownTool(name.to_owned()))?;
        match (tool.definition().task_support, as_task) {
            (TaskSupport::Forbidden, true) => Err(BrokerError::TaskForbidden(name.to_owned())),
            (TaskSupport::Required, false) => Err(BrokerError::TaskRequired(name.to_owned())),
            _ => Ok(tool.clone()),
        }
    }

    /// Refuse arguments larger than the limit (T-38).
    pub fn check_arguments_size(&self, arguments: &Value) -> Result<(), BrokerError> {
        let size = arguments.to_string().len();
        if size > self.config.max_argument_bytes {
            return Err(BrokerError::InvalidParams(format!(
                "Invalid params: arguments are {size} bytes, the limit is {} (max_argument_bytes)",
                self.config.max_argument_bytes
            )));
        }
        Ok(())
    }

    /// The ttl a task gets: the requested one clamped to the maximum, or the
    /// default (T-10, T-34).
    pub fn effective_ttl(&self, requested: Option<i64>) -> Result<Option<i64>, BrokerError> {
        match requested {
            Some(ttl) if ttl < 0 => Err(BrokerError::InvalidParams(
                "Invalid params: task.ttl must be a non-negative integer (milliseconds)".into(),
            )),
            Some(ttl) => Ok(Some(ttl.min(self.config.max_ttl_ms))),
            None => Ok(self
                .config
                .default_ttl_ms
                .map(|d| d.min(self.config.max_ttl_ms))),
        }
    }

    /// Accept a task-augmented tools/call: the task row and its job in one
    /// transaction, answered at once (T-7). Arguments that fail the tool's
    /// schema still make a task, which ends `failed` with the `isError`
    /// result (H-10) without running.
    ///
    /// Traced as the client's call (a server span under the context the
    /// call came with) and, inside it, the task's creation, whose context
    /// the task keeps for every later step.
    pub async fn tools_call_task(
        &self,
        caller: &Caller<'_>,
        name: &str,
        arguments: Map<String, Value>,
        requested_ttl: Option<i64>,
        progress_token: Option<Value>,
    ) -> Result<Task, BrokerError> {
        let mut call = traces::Span::start(traces::SpanKind::Server, caller.trace, || {
            let mut attributes = vec![
                traces::KeyValue::new(traces::key::METHOD, "tools/call"),
                traces::KeyValue::new(traces::key::TOOL, name.to_owned()),
            ];
            if let Some(session) = caller.session_id {
                attributes.push(traces::KeyValue::new(
                    traces::key::SESSION,
                    session.to_owned(),
                ));
            }
            (format!("tools/call {name}").into(), attributes)
        });
        let created = self
            .create_task(
                caller,
                &call,
                name,
                arguments,
                requested_ttl,
                progress_token,
            )
            .await;
        match &created {
            Ok(task) => call.set(|| {
                vec![traces::KeyValue::new(
                    traces::key::TASK_ID,
                    task.task_id.clone(),
                )]
            }),
            Err(e) => call.fail(|| e.to_string()),
        }
        created
    }

    async fn create_task(
        &self,
        caller: &Caller<'_>,
        call: &traces::Span,
        name: &str,
        arguments: Map<String, Value>,
        requested_ttl: Option<i64>,
        progress_token: Option<Value>,
    ) -> Result<Task, BrokerError> {
        let tool = self.tool_for_call(name, caller.owner, true)?;
        let owner = caller.owner.as_str();
        let ttl_ms = self.effective_ttl(requested_ttl)?;
        let placement = caller
            .schedule
            .place(name, &tool.definition().queue, ttl_ms, now_ms())?;
        let arguments = Value::Object(arguments);
        self.check_arguments_size(&arguments)?;
        if let Some(key) = caller.idempotency_key
            && let Some(row) = self.idempotent_task(owner, name, key, &arguments).await?
        {
            return Ok(task_from_row(&row));
        }
        if !self.open_tasks.try_reserve(owner) {
            let open = self.store.task_count_open(owner).await?;
            if open >= self.config.max_open_tasks {
                // Tasks end at their own pace: look again after a poll
                // interval, as for a task's status.
                return Err(BrokerError::Limit(
                    format!(
                        "Too many open tasks: {open} working or input_required, the limit per requestor is {} \
                         (max_open_tasks); wait for some to finish or cancel them",
                        self.config.max_open_tasks
                    ),
                    Duration::from_millis(self.config.poll_interval_ms.max(0).unsigned_abs()),
                ));
            }
            self.open_tasks.reserve_counted(owner, open);
        }
        let refused = self
            .tools
            .current()
            .validate(name, &arguments)
            .err()
            .map(|reason| outcome_to_record(&ToolOutcome::tool_error(reason)));
        let task_id = uuid::Uuid::new_v4().to_string();
        let mut creation = traces::Span::start(traces::SpanKind::Producer, call.context(), || {
            (
                "task create".into(),
                vec![
                    traces::KeyValue::new(traces::key::TASK_ID, task_id.clone()),
                    traces::KeyValue::new(traces::key::TOOL, name.to_owned()),
                    traces::KeyValue::new(traces::key::PRIORITY, placement.priority),
                ],
            )
        });
        let trace = creation.context();
        let new = NewTask {
            task_id,
            owner: owner.to_owned(),
            tool: name.to_owned(),
            arguments: arguments.to_string(),
            ttl_ms,
            poll_interval_ms: Some(self.config.poll_interval_ms),
            progress_token: progress_token.map(|t| t.to_string()),
            session_id: caller.session_id.map(str::to_owned),
            client_capabilities: caller.client_capabilities.map(Value::to_string),
            idempotency_key: caller.idempotency_key.map(str::to_owned),
            retention: tool.definition().retention.or(self.config.retention).rule(),
            traceparent: trace.map(|t| t.traceparent.clone()),
            tracestate: trace.and_then(|t| t.tracestate.clone()),
        };
        let job = refused.is_none().then_some(NewJob {
            max_attempts: tool.definition().max_attempts.max(1),
            priority: placement.priority,
            run_after: placement.run_after,
        });
        // The writer hands the job to this process's pool, or wakes it, and
        // kicks the feed.
        let created = self.writer.create(new, job, refused).await;
        if let Err(e) = &created {
            creation.fail(|| format!("not created: {e}"));
        }
        drop(creation);
        let row = match created {
            Ok(row) => row,
            // Another request with the key created it first (here, or on
            // another broker): that task is the answer.
            Err(StoreError::IdempotencyKeyTaken) => {
                let key = caller.idempotency_key.unwrap_or_default();
                return match self.idempotent_task(owner, name, key, &arguments).await? {
                    Some(row) => Ok(task_from_row(&row)),
                    None => Err(StoreError::IdempotencyKeyTaken.into()),
                };
            }
            Err(e) => return Err(e.into()),
        };
        let row = match placement.run_after {
            // Served as tasks_as_served will read it until the start.
            Some(at) if row.status_message.as_deref() == Some("queued") => TaskRow {
                status_message: Some(format!("queued: starts at {}", crate::mcp::format_time(at))),
                ..row
            },
            _ => row,
        };
        tracing::info!(task_id = %row.task_id, tool = name, ttl_ms, "task created");
        Ok(task_from_row(&row))
    }

    async fn visible_row(&self, owner: &Owner, task_id: &str) -> Result<TaskRow, BrokerError> {
        let row = self.store.task_get(task_id).await?;
        match row {
            Some(row) if row.owner == owner.as_str() => unexpired(row),
            // Another requestor's task is indistinguishable from none (T-36).
            _ => Err(BrokerError::NotFound),
        }
    }

    /// tasks/get.
    pub async fn tasks_get(&self, owner: &Owner, task_id: &str) -> Result<Task, BrokerError> {
        Ok(task_from_row(&self.visible_row(owner, task_id).await?))
    }

    /// A task with what a stateless client reads in one look (MCP
    /// 2026-07-28 `tasks/get`): its outcome once terminal, and its
    /// unanswered requests while input_required.
    pub async fn task_detail(
        &self,
        owner: &Owner,
        task_id: &str,
    ) -> Result<TaskDetail, BrokerError> {
        let row = self.visible_row(owner, task_id).await?;
        let pending = if row.status == TaskStatus::InputRequired {
            self.store.task_messages_pending(task_id).await?
        } else {
            Vec::new()
        };
        Ok(TaskDetail {
            task: task_from_row(&row),
            outcome: result_of(&row),
            pending,
        })
    }

    /// Answers to a task's requests, by request id (MCP 2026-07-28
    /// `tasks/update`): each answer of a request this task has pending is
    /// stored as the client's response; other ids are ignored. Returns how
    /// many were stored.
    pub async fn answer_task_requests(
        &self,
        owner: &Owner,
        task_id: &str,
        answers: &Map<String, Value>,
    ) -> Result<usize, BrokerError> {
        let row = self.visible_row(owner, task_id).await?;
        if answers.is_empty() || row.status != TaskStatus::InputRequired {
            return Ok(0);
        }
        let mut stored = 0;
        for message in self.store.task_messages_pending(task_id).await? {
            let Some(answer) = answers.get(&message.request_id) else {
                continue;
            };
            let answer = ClientAnswer::Result(answer.clone());
            if self
                .answer_task_request(owner, &message.request_id, &answer)
                .await?
            {
                stored += 1;
            }
        }
        Ok(stored)
    }

    /// tasks/result, first look: the stored outcome, or what waiting for it
    /// needs. The feed is subscribed before the row is read, so no change
    /// after this look goes unseen. A task this process created with a job
    /// due now, of which it has seen no change since, is not read: its row
    /// as created is the row as it is ([`Feed::take_created`]).
    pub async fn tasks_result_start(
        &self,
        owner: &Owner,
        task_id: &str,
    ) -> Result<ResultLook, BrokerError> {
        let feed = self.feed.watch_task(task_id);
        let row = match self.feed.take_created(task_id) {
            Some(row) if row.owner == owner.as_str() => unexpired(row)?,
            _ => self.visible_row(owner, task_id).await?,
        };
        Ok(match result_of(&row) {
            TaskResult::Pending => ResultLook::Pending(PendingResult {
                feed,
                row: Box::new(row),
            }),
            done => ResultLook::Ready(done),
        })
    }

    /// tasks/result: wait until the task is terminal (T-14), then its outcome.
    /// Woken by the change feed (a status change of this task only); re-reads
    /// the row then, and when its ttl runs out. No query while nothing
    /// happens, however many wait.
    /// Meanwhile `events` (when given) gets what the waiting client should
    /// see: the task's progress (T-32), its status changes (T-31), and the
    /// requests it has pending for the client while input_required (T-26),
    /// each request once per wait.
    pub async fn tasks_result_wait(
        &self,
        owner: &Owner,
        task_id: &str,
        pending: PendingResult,
        events: Option<mpsc::UnboundedSender<WaitEvent>>,
    ) -> Result<TaskResult, BrokerError> {
        let PendingResult { mut feed, row } = pending;
        // The row to look at next: read again unless the feed brought it.
        let mut next = Some(*row);
        let mut delivered: HashSet<String> = HashSet::new();
        let mut last_status: Option<TaskStatus> = None;
        loop {
            let row = match next.take() {
                Some(row) => unexpired(row)?,
                None => self.visible_row(owner, task_id).await?,
            };
            let task = task_from_row(&row);
            if let Some(tx) = &events {
                if last_status.is_some_and(|s| s != task.status) {
                    let _ = tx.send(WaitEvent::Status(Box::new(task.clone())));
                }
                if task.status == TaskStatus::InputRequired {
                    for message in self.store.task_messages_pending(task_id).await? {
                        if delivered.insert(message.request_id.clone()) {
                            let _ = tx.send(WaitEvent::Ask(Box::new(message)));
                        }
                    }
                }
            }
            last_status = Some(task.status);
            match result_of(&row) {
                TaskResult::Pending => {}
                done => return Ok(done),
            }
            // The ttl is fixed at creation: the row changes by expiring only
            // then. While input_required, look again now and then: a further
            // request of a task in another process changes no status (no
            // feed event) and must still reach this client.
            let expires_in = row
                .expires_at
                .map(|at| Duration::from_millis(at.saturating_sub(now_ms()).max(0) as u64 + 1));
            let expires_in = match task.status {
                TaskStatus::InputRequired => {
                    Some(expires_in.map_or(INPUT_REQUIRED_LOOK, |d| d.min(INPUT_REQUIRED_LOOK)))
                }
                _ => expires_in,
            };
            let expiry = async {
                match expires_in {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(expiry);
            loop {
                tokio::select! {
                    _ = &mut expiry => break,
                    event = feed.recv() => match event.as_deref() {
                        Some(FeedEvent::Progress(p)) => {
                            if let Some(tx) = &events {
                                let _ = tx.send(WaitEvent::Progress(Box::new(p.clone())));
                            }
                        }
                        // Its creation, seen late: nothing new to read.
                        Some(FeedEvent::Status(s))
                            if s.from_status.is_none() && task.status == TaskStatus::Working => {}
                        // Its end, committed here or read with the feed:
                        // the row as it now is.
                        Some(FeedEvent::Written(_, Some(ended))) => {
                            next = Some(row.clone().ended_with(&ended.outcome, ended.at));
                            break;
                        }
                        Some(FeedEvent::Status(TaskEvent {
                            outcome: Some(outcome),
                            at,
                            ..
                        })) => {
                            next = Some(row.clone().ended_with(outcome, *at));
                            break;
                        }
                        Some(FeedEvent::Status(_) | FeedEvent::Written(..)) => break,
                        None => return Err(BrokerError::ShuttingDown),
                    },
                }
            }
        }
    }

    /// A client's answer to a request a task sent it: stored, and the task
    /// goes back to working (T-27). False when no pending request of this
    /// owner has that id.
    pub async fn answer_task_request(
        &self,
        owner: &Owner,
        request_id: &str,
        answer: &ClientAnswer,
    ) -> Result<bool, BrokerError> {
        let outcome = self
            .store
            .task_message_answer(request_id, owner.as_str(), &answer.to_stored(), now_ms())
            .await?;
        if outcome == AnswerOutcome::Stored {
            self.feed.kick_control();
            tracing::info!(request_id, "the client answered a task's request");
        }
        Ok(outcome == AnswerOutcome::Stored)
    }

    /// Status changes of `owner`'s tasks after feed position `after_id`,
    /// as the tasks were then: what a GET stream missed.
    pub async fn status_changes_since(
        &self,
        owner: &Owner,
        after_id: i64,
    ) -> Result<Vec<(i64, Task)>, BrokerError> {
        let events = self
            .store
            .task_events_for_owner_since(owner.as_str(), after_id, 10_000)
            .await?;
        Ok(events.iter().map(|e| (e.id, task_at_event(e))).collect())
    }

    /// tasks/list: one page of the requestor's tasks, newest first, with the
    /// cursor of the next page while more exist (T-17, T-18, T-19).
    pub async fn tasks_list(
        &self,
        owner: &Owner,
        cursor: Option<&str>,
    ) -> Result<(Vec<Task>, Option<String>), BrokerError> {
        let before = match cursor {
            None => None,
            Some(c) => Some(cursor::decode(c, owner.as_str()).ok_or(BrokerError::InvalidCursor)?),
        };
        let limit = self.config.page_size;
        let mut rows = self
            .store
            .task_list_page(owner.as_str(), before, limit + 1, now_ms())
            .await?;
        let more = rows.len() as i64 > limit;
        rows.truncate(limit as usize);
        let next = if more {
            rows.last().map(|r| cursor::encode(r.seq, owner.as_str()))
        } else {
            None
        };
        Ok((rows.iter().map(task_from_row).collect(), next))
    }

    /// An operator's cancel (the console): any owner's task, cancelled as
    /// [`Broker::tasks_cancel`] does for its owner. Returns the task and
    /// its owner (for the audit line).
    pub async fn tasks_cancel_any(&self, task_id: &str) -> Result<(Task, Owner), BrokerError> {
        let owner = match self.store.task_get(task_id).await? {
            Some(row) => Owner::from_stored(row.owner),
            None => return Err(BrokerError::NotFound),
        };
        let task = self.tasks_cancel(&owner, task_id).await?;
        Ok((task, owner))
    }

    /// tasks/cancel: cancelled before this returns (T-21); the running job
    /// is told to stop.
    pub async fn tasks_cancel(&self, owner: &Owner, task_id: &str) -> Result<Task, BrokerError> {
        // Expired tasks answer as expired, like tasks/get.
        self.visible_row(owner, task_id).await?;
        let outcome = self
            .store
            .task_cancel(
                task_id,
                owner.as_str(),
                "The task was cancelled by request.",
                now_ms(),
            )
            .await?;
        match outcome {
            CancelOutcome::Cancelled(row) => {
                crate::metrics::get().task_finished(&row.tool, "cancelled");
                // Waiters here look at once (and a kept row of the task is
                // forgotten), before the feed reads the change.
                self.feed.written(task_id);
                self.feed.kick_control();
                tracing::info!(task_id, "task cancelled");
                Ok(task_from_row(&row))
            }
            CancelOutcome::Terminal(status) => Err(BrokerError::Terminal(status)),
            CancelOutcome::NotFound => Err(BrokerError::NotFound),
        }
    }
}

/// `row`, unless its ttl ran out (then it has expired, T-33).
fn unexpired(row: TaskRow) -> Result<TaskRow, BrokerError> {
    if row.expires_at.is_some_and(|at| at <= now_ms()) {
        Err(BrokerError::Expired)
    } else {
        Ok(row)
    }
}
