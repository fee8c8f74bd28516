//! One claimed job, run to its end: the tool's progress, logs and
//! questions to the client (the slot goes back while it waits for people),
//! its cancellation, and its outcome recorded with a write fenced by the
//! lease token.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{WorkerPool, millis};
use crate::broker::records::PoolRecords;
use crate::broker::slots::Slot;
use crate::broker::{ClientAnswer, FeedEvent, outcome_to_record};
use crate::clock::now_ms;
use crate::mcp::RpcError;
use crate::store::{ClaimedJob, QueuedJobs, StoreError, TaskMessage, TaskStatus};
use crate::tools::{Checkpoints, ToolContext, ToolEvent, ToolOutcome};
use crate::traces::{self, KeyValue, SpanKind, TraceContext, key};

impl WorkerPool {
    /// Run one claimed job to its end, or until its lease is lost, its task
    /// cancelled, or `release` (shutdown after the grace period).
    ///
    /// While the tool waits for its client's answers the job holds no slot:
    /// the slot goes back when the question is stored, and the answers are
    /// handed to the tool only once a slot is held again, so a thousand
    /// tasks waiting for people delay nobody and the limits still hold for
    /// the tools that run.
    pub(super) async fn run_job(&self, job: ClaimedJob, slot: Slot, release: CancellationToken) {
        let mut slot = Some(slot);
        // Answers the client gave, held until the job has a slot again.
        let mut answered: Vec<(Answer, Result<Value, RpcError>)> = Vec::new();
        let started = std::time::Instant::now();
        tracing::info!(task_id = %job.task_id, tool = %job.tool, attempt = job.attempt, "job started");
        crate::metrics::get().job_started(job.attempt);
        let mut span = self.attempt_span(&job);
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let ctx = ToolContext::new(
            events_tx,
            cancel.clone(),
            Some(job.task_id.clone()),
            job.attempt,
        )
        .with_trace(span.context().cloned())
        .with_checkpoints(
            job.checkpoint.clone(),
            Arc::new(JobCheckpoints {
                store: self.store.clone(),
                task_seq: job.task_seq,
                task_id: job.task_id.clone(),
                lease_token: job.lease_token.clone(),
            }),
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
                    span.set(|| vec![KeyValue::new(key::STATUS, "released")]);
                    match self.store.job_release(job.task_seq, &job.lease_token, now_ms()).await {
                        Ok(true) => {
                            self.feed.announce_queued(&QueuedJobs::one_of(&job.tool));
                            tracing::info!(task_id = %job.task_id, "job released: queued for another worker, attempt not counted");
                        }
                        Ok(false) => tracing::info!(task_id = %job.task_id, "job of a cancelled task closed"),
                        Err(e) => tracing::warn!(task_id = %job.task_id, error = %e, "releasing the job failed; its lease will expire"),
                    }
                    self.feed.kick();
                    return;
                }
                Some(event) = events.recv() => match event {
                    ToolEvent::Progress { progress: p, total, message } => {
                        progress.pending = Some((p, total, progress_text(p, total, message)));
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
                                self.announce_if_limited_globally(&job);
                            }
                            Err(e) => {
                                let _ = reply.send(Err(e));
                            }
                        }
                    }
                    other => {
                        // A status said after a progress report that still
                        // waits for its turn must not be overwritten by it.
                        if matches!(other, ToolEvent::Status(_)) {
                            progress.flush(self, &job).await;
                        }
                        self.on_tool_event(&job, other).await
                    }
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
                            span.fail(|| "lease lost: tool stopped, nothing written".into());
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
            span.set(|| {
                vec![KeyValue::new(
                    key::STATUS,
                    TaskStatus::Cancelled.to_string(),
                )]
            });
            match self
                .store
                .job_finish_cancelled(job.task_seq, &job.lease_token, now_ms())
                .await
            {
                Ok(()) => {
                    self.announce_if_limited_globally(&job);
                    tracing::info!(task_id = %job.task_id, "job stopped: task cancelled");
                }
                Err(e) => {
                    tracing::warn!(task_id = %job.task_id, error = %e, "closing cancelled job failed")
                }
            }
            return;
        };
        // Progress reported just before the end is stored before the end;
        // what else is still queued (status, logs) is overtaken by the
        // outcome.
        while let Ok(event) = events.try_recv() {
            if let ToolEvent::Progress {
                progress: p,
                total,
                message,
            } = event
            {
                progress.pending = Some((p, total, progress_text(p, total, message)));
            }
        }
        progress.flush(self, &job).await;
        self.record(&job, &outcome, started, &mut span).await;
        self.announce_if_limited_globally(&job);
    }

    /// The job no longer counts against its tool's limit across processes
    /// (it ended, or waits for its client): if the tool has one, tell the
    /// claimers of every process, which no row change wakes.
    fn announce_if_limited_globally(&self, job: &ClaimedJob) {
        let limited = self
            .tools
            .current()
            .get(&job.tool)
            .is_some_and(|tool| tool.definition().global_concurrency.is_some());
        if limited {
            self.feed.announce_slot_freed();
        }
    }

    /// Run the tool in its own task so a panic becomes a failed task, and
    /// dropping the returned future stops the tool.
    fn spawn_tool(
        &self,
        job: &ClaimedJob,
        ctx: ToolContext,
    ) -> impl std::future::Future<Output = ToolOutcome> + use<> {
        let tool = self.tools.current().get(&job.tool).cloned();
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

    /// Store a request of the tool to the client, as the tool gave it: the
    /// task moves to input_required (T-24) and each front end delivers it
    /// its own way (2025-11-25 with the related-task _meta, T-25). Returns
    /// the request id to wait on.
    async fn ask_client(
        &self,
        job: &ClaimedJob,
        method: &str,
        params: Value,
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
            let result = match ClientAnswer::from_stored(&response) {
                Some(ClientAnswer::Result(r)) => Ok(r),
                Some(ClientAnswer::Error(e)) => Err(e.to_rpc()),
                None => Err(RpcError::invalid_request(
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
            log_not_stored(&job.task_id, "status message", &e);
        }
    }

    /// The span of this run: under the context the task was created with,
    /// in whichever process claimed it.
    fn attempt_span(&self, job: &ClaimedJob) -> traces::Span {
        let parent = job_trace(job);
        traces::Span::start(SpanKind::Consumer, parent.as_ref(), || {
            ("task attempt".into(), run_attributes(job, &self.worker_id))
        })
    }

    /// Store the run's outcome (a span of its own, under the run's).
    async fn record(
        &self,
        job: &ClaimedJob,
        outcome: &ToolOutcome,
        started: std::time::Instant,
        run: &mut traces::Span,
    ) {
        let record = outcome_to_record(outcome);
        run.set(|| vec![KeyValue::new(key::STATUS, record.status.to_string())]);
        if record.status != TaskStatus::Completed {
            run.fail(|| {
                record
                    .status_message
                    .clone()
                    .unwrap_or_else(|| record.status.to_string())
            });
        }
        let mut span = traces::Span::start(SpanKind::Internal, run.context(), || {
            (
                "task complete".into(),
                vec![
                    KeyValue::new(key::TASK_ID, job.task_id.clone()),
                    KeyValue::new(key::STATUS, record.status.to_string()),
                ],
            )
        });
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
                    span.fail(|| "lease lost before completion: outcome dropped".into());
                    tracing::warn!(task_id = %job.task_id, "lease lost before completion: outcome dropped");
                    return;
                }
                Err(e) => {
                    tracing::warn!(task_id = %job.task_id, error = %e, attempt, "recording outcome failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
            }
        }
        span.fail(|| "outcome not recorded: its lease will expire and the task run again".into());
    }
}

/// The trace context stored with a claimed job's task, if any.
pub(super) fn job_trace(job: &ClaimedJob) -> Option<TraceContext> {
    TraceContext::stored(job.traceparent.as_deref(), job.tracestate.as_deref())
}

/// The attributes of a run's spans (its claim, its attempt).
pub(super) fn run_attributes(job: &ClaimedJob, worker_id: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new(key::TASK_ID, job.task_id.clone()),
        KeyValue::new(key::TOOL, job.tool.clone()),
        KeyValue::new(key::ATTEMPT, job.attempt),
        KeyValue::new(key::WORKER, worker_id.to_owned()),
    ]
}

/// A progress report's status text: its message, else `progress/total`.
fn progress_text(progress: f64, total: Option<f64>, message: Option<String>) -> String {
    message.unwrap_or_else(|| match total {
        Some(t) => format!("{progress}/{t}"),
        None => format!("{progress}"),
    })
}

/// A progress or status write that did not land: expected once the lease is
/// gone (the task ended or moved), worth a warning otherwise.
fn log_not_stored(task_id: &str, what: &str, error: &StoreError) {
    match error {
        StoreError::LeaseLost => tracing::debug!(
            task_id,
            what,
            "not stored: the run no longer holds the task"
        ),
        e => tracing::warn!(task_id, what, error = %e, "not stored"),
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
            Err(e) => log_not_stored(&job.task_id, "progress", &e),
        }
    }
}

/// A run's checkpoints, kept in its job's row under its lease: a run that
/// lost its lease cannot overwrite what the run after it keeps.
#[derive(Debug)]
struct JobCheckpoints {
    store: PoolRecords,
    task_seq: i64,
    task_id: String,
    lease_token: String,
}

impl Checkpoints for JobCheckpoints {
    fn save<'a>(
        &'a self,
        value: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            // A busy database is retried; a lost lease is final.
            let mut last = String::new();
            for attempt in 0..5u32 {
                match self
                    .store
                    .job_checkpoint(self.task_seq, &self.lease_token, value, now_ms())
                    .await
                {
                    Ok(()) => return Ok(()),
                    Err(StoreError::LeaseLost) => {
                        return Err(
                            "this run lost its lease (another worker runs the task now)".into()
                        );
                    }
                    Err(e) => {
                        tracing::warn!(task_id = %self.task_id, error = %e, attempt, "keeping the checkpoint failed; retrying");
                        last = e.to_string();
                        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    }
                }
            }
            Err(format!("the checkpoint could not be kept: {last}"))
        })
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
