//! The worker pool: claims queued jobs in batches, runs their tools under a
//! lease it renews by heartbeat, and records each outcome with a write fenced
//! by the lease token. The embedded pool of `serve` is this code.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::broker::{Feed, outcome_to_record};
use crate::clock::now_ms;
use crate::mcp::RpcError;
use crate::store::{ClaimedJob, Store, StoreError};
use crate::tools::{Registry, ToolContext, ToolEvent, ToolOutcome};

/// How a pool runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Jobs run at once.
    pub concurrency: usize,
    /// Lease length; renewed every third of it.
    pub lease: Duration,
    /// How often an idle pool looks for jobs queued by other processes or
    /// due after a backoff.
    pub idle_tick: Duration,
}

/// A pool of job runners in this process.
#[derive(Debug, Clone)]
pub struct WorkerPool {
    store: Store,
    tools: Arc<Registry>,
    feed: Feed,
    config: WorkerConfig,
    /// Identifies this pool in `jobs.lease_owner`.
    worker_id: String,
    /// Woken when this process queues a job.
    job_queued: Arc<Notify>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl WorkerPool {
    /// A pool; `job_queued` wakes it early.
    pub fn new(
        store: Store,
        tools: Arc<Registry>,
        feed: Feed,
        config: WorkerConfig,
        job_queued: Arc<Notify>,
    ) -> Self {
        let worker_id = format!(
            "{}:{}:{}",
            hostname(),
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            store,
            tools,
            feed,
            config,
            worker_id,
            job_queued,
        }
    }

    /// Claim and run jobs until `shutdown`; running jobs are then dropped
    /// (their leases expire and another worker takes them).
    pub async fn run(self, shutdown: CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        tracing::info!(worker = %self.worker_id, concurrency = self.config.concurrency, "worker pool started");
        let running = CancellationToken::new();
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let free = 1 + slots.available_permits();
            let token = uuid::Uuid::new_v4().to_string();
            let claimed = self
                .store
                .job_claim_available(
                    &self.worker_id,
                    &token,
                    free as i64,
                    millis(self.config.lease),
                    now_ms(),
                )
                .await;
            let jobs = match claimed {
                Ok(jobs) => jobs,
                Err(e) => {
                    tracing::warn!(error = %e, "claim failed");
                    Vec::new()
                }
            };
            if jobs.is_empty() {
                drop(first);
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = self.job_queued.notified() => {},
                    _ = tokio::time::sleep(self.config.idle_tick) => {},
                }
                continue;
            }
            let mut permits = vec![first];
            for _ in 1..jobs.len() {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            for (job, permit) in jobs.into_iter().zip(permits) {
                let pool = self.clone();
                let stop = running.child_token();
                tokio::spawn(async move {
                    pool.run_job(job, stop).await;
                    drop(permit);
                });
            }
        }
        running.cancel();
        tracing::info!(worker = %self.worker_id, "worker pool stopped");
    }

    /// Run one claimed job to its end, or until its lease is lost, its task
    /// cancelled, or the pool stops.
    async fn run_job(&self, job: ClaimedJob, stop: CancellationToken) {
        let started = std::time::Instant::now();
        tracing::info!(task_id = %job.task_id, tool = %job.tool, attempt = job.attempt, "job started");
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
        let mut feed = self.feed.subscribe();
        let lease_ms = millis(self.config.lease);
        let outcome = loop {
            tokio::select! {
                outcome = &mut tool_run => break Some(outcome),
                _ = stop.cancelled() => {
                    cancel.cancel();
                    tracing::info!(task_id = %job.task_id, "job abandoned: worker stopping");
                    return;
                }
                Some(event) = events.recv() => self.on_tool_event(&job, event).await,
                Ok(change) = feed.recv() => {
                    if change.task_id == job.task_id && change.to_status == "cancelled" {
                        cancel.cancel();
                        break None;
                    }
                }
                _ = heartbeat.tick() => {
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

    async fn on_tool_event(&self, job: &ClaimedJob, event: ToolEvent) {
        let message = match event {
            ToolEvent::Status(message) => message,
            ToolEvent::Progress {
                message: Some(m), ..
            } => m,
            ToolEvent::Progress {
                progress, total, ..
            } => match total {
                Some(t) => format!("{progress}/{t}"),
                None => format!("{progress}"),
            },
            ToolEvent::Request { method, reply, .. } => {
                // Asking the client from inside a task (input_required) is
                // not served yet: the tool hears so and decides.
                let _ = reply.send(Err(RpcError::new(
                    crate::mcp::ErrorCode::MethodNotFound,
                    format!("{method} is not available to tools running as tasks"),
                )));
                return;
            }
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
                .store
                .job_complete(job.task_seq, &job.lease_token, &record, now_ms())
                .await
            {
                Ok(took) => {
                    self.feed.kick();
                    tracing::info!(task_id = %job.task_id, status = record.status, recorded = took,
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
