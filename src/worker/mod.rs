//! The worker pool: claims queued jobs in batches, runs their tools under a
//! lease it renews by heartbeat, and records each outcome with a write fenced
//! by the lease token. The embedded pool of `serve` is this code.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::broker::records::PoolRecords;
use crate::broker::slots::{Slot, Slots};
use crate::broker::{Feed, FeedEvent, HandedOff, Handoff, Writer, outcome_to_record};
use crate::clock::now_ms;
use crate::mcp::RpcError;
use crate::store::{
    ClaimedJob, NewWorker, StoreError, TaskMessage, TaskStatus, WorkerKind, WorkerState,
};
use crate::tools::{Registry, ToolContext, ToolEvent, ToolOutcome};

/// How a pool runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Jobs run at once in this process, whatever their tools (each tool
    /// may have a lower limit of its own).
    pub concurrency: usize,
    /// Lease length; renewed every third of it.
    pub lease: Duration,
    /// Longest wait of an idle pool between looks for due jobs (jobs of
    /// other processes wake it sooner through the change feed).
    pub idle_max: Duration,
    /// On shutdown, how long running jobs may go on before their leases are
    /// released for another worker.
    pub grace: Duration,
    /// In `serve`, or a `taskbroker worker` process.
    pub kind: WorkerKind,
}

/// A pool of job runners in this process.
#[derive(Debug, Clone)]
pub struct WorkerPool {
    /// Its rows and leases, through the broker.
    store: PoolRecords,
    tools: Arc<Registry>,
    feed: Feed,
    config: WorkerConfig,
    /// Identifies this pool in `jobs.lease_owner` and `workers`.
    worker_id: String,
    /// Woken when this process queues a job.
    job_queued: Arc<Notify>,
    /// Jobs running now (for the workers table).
    running: Arc<AtomicUsize>,
    /// Group commit of completions.
    writer: Writer,
    /// Free slots: the process's, and each capped tool's.
    slots: Arc<Slots>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Shortest idle wait.
const IDLE_MIN: Duration = Duration::from_millis(50);

impl WorkerPool {
    /// A pool; `job_queued` wakes it early.
    pub fn new(
        store: PoolRecords,
        tools: Arc<Registry>,
        feed: Feed,
        config: WorkerConfig,
        job_queued: Arc<Notify>,
        writer: Writer,
    ) -> Self {
        let worker_id = format!(
            "{}:{}:{}",
            hostname(),
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let slots = Arc::new(Slots::new(config.concurrency, tools.definitions()));
        Self {
            store,
            tools,
            feed,
            config,
            worker_id,
            job_queued,
            running: Arc::new(AtomicUsize::new(0)),
            writer,
            slots,
        }
    }

    /// This pool's id (`host:pid:random`).
    pub fn id(&self) -> &str {
        &self.worker_id
    }

    /// Claim and run jobs until `shutdown`; then stop claiming, let running
    /// jobs finish for up to the grace period, and release the rest so
    /// another worker takes them at once.
    pub async fn run(self, shutdown: CancellationToken) {
        let concurrency = self.slots.cap();
        let registered = self
            .store
            .worker_register(
                &NewWorker {
                    worker_id: self.worker_id.clone(),
                    pid: i64::from(std::process::id()),
                    host: hostname(),
                    kind: self.config.kind,
                    concurrency: concurrency as i64,
                    lease_ms: millis(self.config.lease),
                },
                now_ms(),
            )
            .await;
        if let Err(e) = registered {
            tracing::warn!(error = %e, "worker registration failed");
        }
        tracing::info!(worker = %self.worker_id, concurrency, "worker pool started");
        let heartbeat = tokio::spawn(self.clone().heartbeat_loop(shutdown.clone()));
        let release = CancellationToken::new();
        let mut jobs = tokio::task::JoinSet::new();
        // An embedded pool gets the jobs its server creates straight from
        // the writer, claimed in the creating transaction, while it has free
        // slots; the rest it claims itself.
        let (handoff_tx, mut handed) = mpsc::unbounded_channel::<HandedOff>();
        if self.config.kind == WorkerKind::Embedded {
            self.writer.hand_off_to(Handoff {
                worker_id: self.worker_id.clone(),
                lease_ms: millis(self.config.lease),
                slots: self.slots.clone(),
                jobs: handoff_tx,
            });
        } else {
            drop(handoff_tx);
        }
        let mut idle = IDLE_MIN;
        // Whether the queue may hold more than the last claim took; when it
        // does not, wait for word of a new job before claiming again.
        let mut drained = false;
        // Whether that word is certain (a job queued by this process), so
        // the claim need not look first.
        let mut certain = true;
        // Tasks created by other processes come through the change feed; an
        // embedded pool hears of its server's own at once (`job_queued`, or
        // the jobs themselves), so it leaves the feed alone (another server
        // on the same file would be found within `idle_max`).
        let mut commits = self.feed.commits();
        // Whether the last claim found a tool at its limit.
        let mut tool_capped = false;
        let feed_wakes = self.config.kind != WorkerKind::Embedded;
        loop {
            while jobs.try_join_next().is_some() {}
            while let Ok((job, slot)) = handed.try_recv() {
                self.spawn_job(&mut jobs, job, slot, &release);
            }
            if drained {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    Some((job, slot)) = handed.recv() => {
                        self.spawn_job(&mut jobs, job, slot, &release);
                        continue;
                    }
                    _ = self.job_queued.notified() => { idle = IDLE_MIN; certain = true; }
                    // A slot came back: a tool that was at its limit may
                    // take a queued job now.
                    _ = self.slots.freed(), if tool_capped => { idle = IDLE_MIN; certain = false; }
                    // A job created, given back or rescued elsewhere: any
                    // commit is worth a look (a read first).
                    Ok(()) = commits.changed(), if feed_wakes => { idle = IDLE_MIN; certain = false; }
                    _ = tokio::time::sleep(idle) => {
                        idle = (idle * 2).min(self.config.idle_max);
                        certain = false;
                    }
                }
            }
            // Every slot is held before the claim: the writer's hand-off
            // takes slots too, and a claimed job must never lack one.
            let reserved = tokio::select! {
                _ = shutdown.cancelled() => break,
                Some((job, slot)) = handed.recv() => {
                    self.spawn_job(&mut jobs, job, slot, &release);
                    continue;
                }
                reserved = self.slots.reserve(self.slots.cap()) => reserved,
            };
            commits.borrow_and_update();
            let Some(mut reserved) = reserved else {
                // Every tool is at its limit: wait for a slot to come back.
                drained = true;
                tool_capped = true;
                continue;
            };
            tool_capped = reserved.capped();
            let want = reserved.len();
            let claimed = self.claim(&reserved, certain).await;
            drained = claimed.len() < want;
            certain = true;
            if claimed.is_empty() {
                continue;
            }
            idle = IDLE_MIN;
            // Within the reservation: the claim's limits; the rest goes back
            // when it is dropped.
            for job in claimed {
                match reserved.take(&job.tool) {
                    Some(slot) => self.spawn_job(&mut jobs, job, slot, &release),
                    None => {
                        tracing::error!(task_id = %job.task_id, tool = %job.tool,
                                        "claim took more than its slots; job queued again");
                        let _ = self
                            .store
                            .job_unclaim(job.task_seq, &job.lease_token, now_ms())
                            .await;
                    }
                }
            }
        }
        // No more hand-offs; what was handed off already runs like the rest.
        self.writer.stop_hand_off();
        while let Ok((job, slot)) = handed.try_recv() {
            self.spawn_job(&mut jobs, job, slot, &release);
        }
        self.shutdown(jobs, release).await;
        let _ = heartbeat.await;
        if let Err(e) = self
            .store
            .worker_set_state(&self.worker_id, WorkerState::Stopped, now_ms())
            .await
        {
            tracing::warn!(error = %e, "could not mark the worker stopped");
        }
        tracing::info!(worker = %self.worker_id, "worker pool stopped");
    }

    /// Run `job` in its slot.
    fn spawn_job(
        &self,
        jobs: &mut tokio::task::JoinSet<()>,
        job: ClaimedJob,
        slot: Slot,
        release: &CancellationToken,
    ) {
        let pool = self.clone();
        let release = release.clone();
        jobs.spawn(async move {
            pool.running.fetch_add(1, Ordering::Relaxed);
            pool.run_job(job, slot, release).await;
            pool.running.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Claim what `reserved` has room for. Unless jobs are `likely` there,
    /// a cheap read (no write lock) looks first.
    async fn claim(
        &self,
        reserved: &crate::broker::slots::Reservation,
        likely: bool,
    ) -> Vec<ClaimedJob> {
        let now = now_ms();
        if !likely {
            match self.store.job_any_runnable(now).await {
                Ok(false) => return Vec::new(),
                Ok(true) => {}
                Err(e) => tracing::warn!(error = %e, "queue check failed"),
            }
        }
        let token = uuid::Uuid::new_v4().to_string();
        // Through the writer: the claim shares a group commit (one fsync)
        // with the creations and completions queued meanwhile.
        match self
            .writer
            .claim(
                &self.worker_id,
                &token,
                reserved.quotas().to_vec(),
                i64::try_from(reserved.len()).unwrap_or(i64::MAX),
                millis(self.config.lease),
            )
            .await
        {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!(error = %e, "claim failed");
                Vec::new()
            }
        }
    }

    async fn shutdown(&self, mut jobs: tokio::task::JoinSet<()>, release: CancellationToken) {
        // Jobs that ended but were not reaped yet are not running.
        while jobs.try_join_next().is_some() {}
        let running = jobs.len();
        if running > 0 {
            tracing::info!(worker = %self.worker_id, running, grace_s = self.config.grace.as_secs_f64(),
                           "stopping: letting running jobs finish");
            let _ = self
                .store
                .worker_set_state(&self.worker_id, WorkerState::Stopping, now_ms())
                .await;
            let finished = tokio::time::timeout(self.config.grace, async {
                while jobs.join_next().await.is_some() {}
            })
            .await;
            if finished.is_err() {
                tracing::info!(worker = %self.worker_id, left = jobs.len(), "grace period over: releasing leases");
                release.cancel();
                while jobs.join_next().await.is_some() {}
            }
        }
    }

    async fn heartbeat_loop(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    let running = self.running.load(Ordering::Relaxed) as i64;
                    if let Err(e) = self.store.worker_heartbeat(&self.worker_id, running, now_ms()).await {
                        tracing::warn!(error = %e, "worker heartbeat failed");
                    }
                }
            }
        }
    }

    /// Run one claimed job to its end, or until its lease is lost, its task
    /// cancelled, or `release` (shutdown after the grace period).
    ///
    /// While the tool waits for its client's answers the job holds no slot:
    /// the slot goes back when the question is stored, and the answers are
    /// handed to the tool only once a slot is held again, so a thousand
    /// tasks waiting for people delay nobody and the limits still hold for
    /// the tools that run.
    async fn run_job(&self, job: ClaimedJob, slot: Slot, release: CancellationToken) {
        let mut slot = Some(slot);
        // Answers the client gave, held until the job has a slot again.
        let mut answered: Vec<(Answer, Result<Value, RpcError>)> = Vec::new();
        let started = std::time::Instant::now();
        tracing::info!(task_id = %job.task_id, tool = %job.tool, attempt = job.attempt, "job started");
        crate::metrics::get().job_started(job.attempt);
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let ctx = ToolContext::new(
            events_tx,
            cancel.clone(),
            Some(job.task_id.clone()),
            job.attempt,
        );
        let tool_run = self.spawn_tool(&job, ctx);
        tokio::pin!(tool_run);
        let mut heartbeat = tokio::time::interval(self.config.lease / 3);
        heartbeat.tick().await;
        // The change feed says at once (any process, ~20 ms) when the task is
        // cancelled; the heartbeat is the fallback.
        let mut feed = self.feed.watch_task(&job.task_id);
        let lease_ms = millis(self.config.lease);
        let mut progress = ProgressThrottle::default();
        // Requests to the client this run waits on: (request id, reply).
        let mut asks: Vec<(String, Answer)> = Vec::new();
        let outcome = loop {
            if slot.is_some() && !answered.is_empty() {
                for (reply, answer) in answered.drain(..) {
                    let _ = reply.send(answer);
                }
                if !asks.is_empty() {
                    slot = None;
                }
            }
            tokio::select! {
                outcome = &mut tool_run => break Some(outcome),
                _ = release.cancelled() => {
                    cancel.cancel();
                    match self.store.job_release(job.task_seq, &job.lease_token, now_ms()).await {
                        Ok(true) => tracing::info!(task_id = %job.task_id, "job released: queued for another worker, attempt not counted"),
                        Ok(false) => tracing::info!(task_id = %job.task_id, "job of a cancelled task closed"),
                        Err(e) => tracing::warn!(task_id = %job.task_id, error = %e, "releasing the job failed; its lease will expire"),
                    }
                    self.feed.kick();
                    return;
                }
                Some(event) = events.recv() => match event {
                    ToolEvent::Progress { progress: p, total, message } => {
                        let text = message.unwrap_or_else(|| match total {
                            Some(t) => format!("{p}/{t}"),
                            None => format!("{p}"),
                        });
                        progress.pending = Some((p, total, text));
                        if tokio::time::Instant::now() >= progress.due() {
                            progress.flush(self, &job).await;
                        }
                    }
                    ToolEvent::Request { method, params, reply, .. } => {
                        match self.ask_client(&job, &method, params).await {
                            Ok(request_id) => {
                                asks.push((request_id, reply));
                                // Waiting for a person holds nothing.
                                slot = None;
                            }
                            Err(e) => {
                                let _ = reply.send(Err(e));
                            }
                        }
                    }
                    other => self.on_tool_event(&job, other).await,
                },
                Some(change) = feed.recv() => {
                    if let FeedEvent::Status(e) = change.as_ref()
                        && e.task_id == job.task_id
                    {
                        if e.to_status == TaskStatus::Cancelled {
                            cancel.cancel();
                            break None;
                        }
                        if e.to_status == TaskStatus::Working && !asks.is_empty() {
                            self.collect_answers(&mut asks, &mut answered).await;
                        }
                    }
                }
                _ = tokio::time::sleep_until(progress.due()), if progress.pending.is_some() => {
                    progress.flush(self, &job).await;
                }
                acquired = self.slots.acquire(&job.tool), if slot.is_none() && !answered.is_empty() => {
                    slot = acquired;
                }
                _ = heartbeat.tick() => {
                    if !asks.is_empty() {
                        self.collect_answers(&mut asks, &mut answered).await;
                    }
                    match self.store.job_heartbeat(job.task_seq, &job.lease_token, lease_ms, now_ms()).await {
                        Ok(hb) if hb.cancel_requested => { cancel.cancel(); break None; }
                        Ok(_) => {}
                        Err(StoreError::LeaseLost) => {
                            cancel.cancel();
                            tracing::warn!(task_id = %job.task_id, "lease lost: tool stopped, nothing written");
                            return;
                        }
                        Err(e) => tracing::warn!(task_id = %job.task_id, error = %e, "heartbeat failed"),
                    }
                }
            }
        };
        let Some(outcome) = outcome else {
            // Cancelled: the task already says so; close the job.
            match self
                .store
                .job_finish_cancelled(job.task_seq, &job.lease_token, now_ms())
                .await
            {
                Ok(()) => tracing::info!(task_id = %job.task_id, "job stopped: task cancelled"),
                Err(e) => {
                    tracing::warn!(task_id = %job.task_id, error = %e, "closing cancelled job failed")
                }
            }
            return;
        };
        // Progress reported just before the end is stored before the end.
        while let Ok(ToolEvent::Progress {
            progress: p,
            total,
            message,
        }) = events.try_recv()
        {
            progress.pending = Some((p, total, message.unwrap_or_else(|| format!("{p}"))));
        }
        progress.flush(self, &job).await;
        self.record(&job, &outcome, started).await;
    }

    /// Run the tool in its own task so a panic becomes a failed task, and
    /// dropping the returned future stops the tool.
    fn spawn_tool(
        &self,
        job: &ClaimedJob,
        ctx: ToolContext,
    ) -> impl std::future::Future<Output = ToolOutcome> + use<> {
        let tool = self.tools.get(&job.tool).cloned();
        let arguments: Value = serde_json::from_str(&job.arguments).unwrap_or(Value::Null);
        let name = job.tool.clone();
        async move {
            let Some(tool) = tool else {
                return ToolOutcome::Error(RpcError::invalid_params(format!(
                    "Unknown tool: {name} (not served by this worker)"
                )));
            };
            let handle = tokio::spawn(async move { tool.call(arguments, ctx).await });
            let guard = AbortOnDrop(handle.abort_handle());
            let result = handle.await;
            drop(guard);
            match result {
                Ok(outcome) => outcome,
                Err(e) if e.is_panic() => ToolOutcome::Error(RpcError::new(
                    crate::mcp::ErrorCode::InternalError,
                    format!("Tool '{name}' panicked"),
                )),
                Err(_) => ToolOutcome::Error(RpcError::internal()),
            }
        }
    }

    /// Store a request of the tool to the client: the task moves to
    /// input_required (T-24) and the server delivers the request with the
    /// related-task _meta (T-25). Returns the request id to wait on.
    async fn ask_client(
        &self,
        job: &ClaimedJob,
        method: &str,
        mut params: Value,
    ) -> Result<String, RpcError> {
        let caps = self
            .store
            .task_client_capabilities(job.task_seq)
            .await
            .map_err(|_| RpcError::internal())?
            .and_then(|c| serde_json::from_str::<Value>(&c).ok())
            .unwrap_or(Value::Null);
        if !crate::mcp::client_supports(&caps, method, &params) {
            return Err(RpcError::new(
                crate::mcp::ErrorCode::MethodNotFound,
                format!("the client did not declare the capability for {method}"),
            ));
        }
        if let Value::Object(obj) = &mut params {
            let meta = obj.entry("_meta").or_insert_with(|| serde_json::json!({}));
            if let Value::Object(meta) = meta {
                meta.insert(
                    crate::mcp::RELATED_TASK_META.into(),
                    serde_json::json!({ "taskId": job.task_id }),
                );
            }
        }
        let message = TaskMessage {
            request_id: format!("tb-{}", uuid::Uuid::new_v4().simple()),
            task_id: job.task_id.clone(),
            method: method.to_owned(),
            params: params.to_string(),
            response: None,
        };
        match self
            .store
            .task_message_ask(job.task_seq, &job.lease_token, &message, now_ms())
            .await
        {
            Ok(()) => {
                // A second request while already input_required changes no
                // status (no feed event): tell this process's waiters here.
                self.feed.written(&job.task_id);
                self.feed.kick();
                tracing::info!(task_id = %job.task_id, method, request_id = %message.request_id, "task asks the client: input_required");
                Ok(message.request_id)
            }
            Err(e) => {
                tracing::warn!(task_id = %job.task_id, error = %e, "could not ask the client");
                Err(RpcError::internal())
            }
        }
    }

    /// Move every answered request out of `asks`, with its answer, into
    /// `answered` (the caller hands them to the tool once it has a slot).
    async fn collect_answers(
        &self,
        asks: &mut Vec<(String, Answer)>,
        ready: &mut Vec<(Answer, Result<Value, RpcError>)>,
    ) {
        let mut waiting = Vec::new();
        for (request_id, reply) in asks.drain(..) {
            let answered = match self.store.task_message_get(&request_id).await {
                Ok(Some(m)) => m.response,
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(request_id, error = %e, "reading an answer failed");
                    None
                }
            };
            let Some(response) = answered else {
                waiting.push((request_id, reply));
                continue;
            };
            let message: Value = serde_json::from_str(&response).unwrap_or(Value::Null);
            let result = match (message.get("result"), message.get("error")) {
                (Some(r), _) => Ok(r.clone()),
                (None, Some(e)) => Err(RpcError::from_json(e)),
                (None, None) => Err(RpcError::invalid_request(
                    "the client's answer has no result or error",
                )),
            };
            ready.push((reply, result));
        }
        *asks = waiting;
    }

    async fn on_tool_event(&self, job: &ClaimedJob, event: ToolEvent) {
        let message = match event {
            ToolEvent::Status(message) => message,
            // Progress goes through the throttle in run_job.
            ToolEvent::Progress { .. } => return,
            // Requests go through ask_client in run_job.
            ToolEvent::Request { .. } => return,
            ToolEvent::Log { level, data } => {
                tracing::info!(task_id = %job.task_id, level = level.as_str(), %data, "tool log");
                return;
            }
            ToolEvent::CloseStream => return,
        };
        if let Err(e) = self
            .store
            .task_set_status_message(job.task_seq, &job.lease_token, &message, now_ms())
            .await
        {
            tracing::debug!(task_id = %job.task_id, error = %e, "status message not stored");
        }
    }

    async fn record(&self, job: &ClaimedJob, outcome: &ToolOutcome, started: std::time::Instant) {
        let record = outcome_to_record(outcome);
        // A busy database is retried; a lost lease is final.
        for attempt in 0..5u32 {
            match self
                .writer
                .complete(job.task_seq, &job.task_id, &job.lease_token, record.clone())
                .await
            {
                Ok(took) => {
                    if took {
                        let m = crate::metrics::get();
                        m.task_finished(&job.tool, &record.status.to_string());
                        m.job_ran(&job.tool, started.elapsed());
                    }
                    tracing::info!(task_id = %job.task_id, status = %record.status, recorded = took,
                                   elapsed_ms = started.elapsed().as_millis() as u64, "task completed");
                    return;
                }
                Err(StoreError::LeaseLost) => {
                    tracing::warn!(task_id = %job.task_id, "lease lost before completion: outcome dropped");
                    return;
                }
                Err(e) => {
                    tracing::warn!(task_id = %job.task_id, error = %e, attempt, "recording outcome failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
            }
        }
    }
}

/// Progress is stored at most every `PROGRESS_EVERY` per job; the latest
/// report waits for its turn, older ones in between are dropped.
#[derive(Debug, Default)]
struct ProgressThrottle {
    pending: Option<(f64, Option<f64>, String)>,
    last: Option<tokio::time::Instant>,
}

const PROGRESS_EVERY: Duration = Duration::from_millis(100);

impl ProgressThrottle {
    fn due(&self) -> tokio::time::Instant {
        match self.last {
            Some(last) => last + PROGRESS_EVERY,
            None => tokio::time::Instant::now(),
        }
    }

    async fn flush(&mut self, pool: &WorkerPool, job: &ClaimedJob) {
        let Some((progress, total, message)) = self.pending.take() else {
            return;
        };
        self.last = Some(tokio::time::Instant::now());
        let stored = pool
            .store
            .task_record_progress(
                job.task_seq,
                &job.lease_token,
                progress,
                total,
                &message,
                now_ms(),
            )
            .await;
        match stored {
            Ok(()) => pool.feed.kick(),
            Err(e) => tracing::debug!(task_id = %job.task_id, error = %e, "progress not stored"),
        }
    }
}

/// Where a tool waits for the client's answer.
type Answer = tokio::sync::oneshot::Sender<Result<Value, RpcError>>;

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
