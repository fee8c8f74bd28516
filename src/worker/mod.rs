//! The worker pool: claims queued jobs in batches, runs their tools under a
//! lease it renews by heartbeat, and records each outcome with a write fenced
//! by the lease token. The embedded pool of `serve` is this code.

mod job;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::broker::records::PoolRecords;
use crate::broker::slots::{Slot, Slots};
use crate::broker::{Feed, HandedOff, Handoff, Writer};
use crate::clock::now_ms;
use crate::store::{ClaimedJob, NewWorker, QueuedJobs, WorkerKind, WorkerState};
use crate::tools::ToolCatalog;

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
    tools: Arc<ToolCatalog>,
    feed: Feed,
    config: WorkerConfig,
    /// Identifies this pool in `jobs.lease_owner` and `workers`.
    worker_id: String,
    /// Woken when this process queues a job.
    job_queued: Arc<Notify>,
    /// Group commit of completions.
    writer: Writer,
    /// Free slots: the process's, and each capped tool's.
    slots: Arc<Slots>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A pool registered and, if embedded, taking its server's jobs
/// ([`WorkerPool::start`]), not yet claiming.
pub struct StartedPool {
    pool: WorkerPool,
    handed: mpsc::UnboundedReceiver<HandedOff>,
}

impl StartedPool {
    /// Claim and run jobs until `shutdown`; then stop claiming, let running
    /// jobs finish for up to the grace period, and release the rest so
    /// another worker takes them at once.
    pub async fn run(self, shutdown: CancellationToken) {
        self.pool.run_started(self.handed, shutdown).await;
    }
}

/// Shortest time between two heartbeats sent because the pool filled up or
/// had room again (at most one such write a second, however often it does).
const FULLNESS_REPORT_MIN: Duration = Duration::from_secs(1);

/// Shortest idle wait.
const IDLE_MIN: Duration = Duration::from_millis(50);

/// How long after jobs were queued for other worker processes to claim
/// (the signal named them) this one looks, in case the named ones could
/// not take them all (busy, another tool, gone).
const LOOK_AFTER_OTHERS: Duration = Duration::from_millis(50);

/// While such signals keep coming, each puts that look off again (the next
/// named process claims what an earlier one left, oldest first), up to this
/// long after the first: so that idle processes do not claim as often as
/// jobs are queued, and a job left behind waits this long at most for
/// them.
const LOOK_AFTER_OTHERS_AT_MOST: Duration = Duration::from_millis(250);

impl WorkerPool {
    /// A pool; `job_queued` wakes it early.
    pub fn new(
        store: PoolRecords,
        tools: Arc<ToolCatalog>,
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
        let slots = Arc::new(Slots::new(
            config.concurrency,
            tools.current().definitions(),
        ));
        Self {
            store,
            tools,
            feed,
            config,
            worker_id,
            job_queued,
            writer,
            slots,
        }
    }

    /// This pool's id (`host:pid:random`).
    pub fn id(&self) -> &str {
        &self.worker_id
    }

    /// [`WorkerPool::start`], then [`StartedPool::run`].
    pub async fn run(self, shutdown: CancellationToken) {
        self.start().await.run(shutdown).await;
    }

    /// Register the pool (its row in `workers`) and, for an embedded pool,
    /// take the hand-off from its server's writer: from then on the jobs
    /// its server creates are claimed in the creating commit. A server
    /// starts its pool so before it answers, so that its first tasks are
    /// not left `queued` for the pool's first look.
    pub async fn start(self) -> StartedPool {
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
        // An embedded pool gets the jobs its server creates straight from
        // the writer, claimed in the creating transaction, while it has free
        // slots; the rest it claims itself.
        let (handoff_tx, handed) = mpsc::unbounded_channel::<HandedOff>();
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
        StartedPool { pool: self, handed }
    }

    /// [`StartedPool::run`].
    async fn run_started(
        self,
        mut handed: mpsc::UnboundedReceiver<HandedOff>,
        shutdown: CancellationToken,
    ) {
        let heartbeat = tokio::spawn(self.clone().heartbeat_loop(shutdown.clone()));
        let follower = tokio::spawn(follow_served_tools(
            self.clone(),
            self.job_queued.clone(),
            shutdown.clone(),
        ));
        let release = CancellationToken::new();
        let mut jobs = tokio::task::JoinSet::new();
        let mut idle = IDLE_MIN;
        // Whether the queue may hold more than the last claim took; when it
        // does not, wait for word of a new job before claiming again.
        let mut drained = false;
        // Whether that word is certain (a job queued by this process), so
        // the claim need not look first.
        let mut certain = true;
        // Jobs queued by other processes are signalled through the feed
        // (only those: completions and progress wake no claimer); an
        // embedded pool hears of its server's own at once (`job_queued`, or
        // the jobs themselves), so it leaves the signal alone (another
        // server on the same file would be found within `idle_max`).
        let mut queued_elsewhere = self.feed.queued();
        // Jobs queued elsewhere that the signal asked other worker
        // processes to claim (both drivers name them, usually one): looked
        // at a moment later, in case none of them could take them (busy,
        // another tool, gone).
        let mut queued_for_others = self.feed.queued_for_others();
        // Whether the last claim found a tool at its limit.
        let mut tool_capped = false;
        let feed_wakes = self.config.kind != WorkerKind::Embedded;
        if feed_wakes {
            self.feed.claim_as(&self.worker_id);
        }
        'run: loop {
            while jobs.try_join_next().is_some() {}
            while let Ok((job, slot)) = handed.try_recv() {
                self.spawn_job(&mut jobs, job, slot, &release);
            }
            if drained {
                let idle_until = tokio::time::Instant::now() + idle;
                let mut look_at = idle_until;
                // The look comes early for jobs others were asked to claim:
                // a moment after the last such word, and at most a while
                // after the first (while words keep coming, the next named
                // claim takes what an earlier one left, oldest first).
                let mut for_others = false;
                let mut first_for_others = None;
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => break 'run,
                        Some((job, slot)) = handed.recv() => {
                            self.spawn_job(&mut jobs, job, slot, &release);
                            continue 'run;
                        }
                        _ = self.job_queued.notified() => { idle = IDLE_MIN; certain = true; }
                        // A slot came back: a tool that was at its limit may
                        // take a queued job now.
                        _ = self.slots.freed(), if tool_capped => { idle = IDLE_MIN; certain = false; }
                        // A job created, given back or rescued elsewhere (a
                        // read first: another claimer may have taken it).
                        Ok(()) = queued_elsewhere.changed(), if feed_wakes => { idle = IDLE_MIN; certain = false; }
                        Ok(()) = queued_for_others.changed(), if feed_wakes => {
                            let now = tokio::time::Instant::now();
                            let first = *first_for_others.get_or_insert(now);
                            let soon = (now + LOOK_AFTER_OTHERS).min(first + LOOK_AFTER_OTHERS_AT_MOST);
                            if soon < idle_until {
                                look_at = soon;
                                for_others = true;
                            }
                            continue;
                        }
                        _ = tokio::time::sleep_until(look_at) => {
                            if !for_others {
                                idle = (idle * 2).min(self.config.idle_max);
                            }
                            certain = false;
                        }
                    }
                    break;
                }
            }
            // Unless word of a job is certain, a cheap read (no write lock)
            // looks first, where a claim that finds nothing costs more than
            // that read; it holds no slot, so the writer's hand-off of a job
            // created meanwhile is not refused for want of one.
            queued_elsewhere.borrow_and_update();
            queued_for_others.borrow_and_update();
            if !certain && !self.looks_runnable().await {
                drained = true;
                continue;
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
            let Some(mut reserved) = reserved else {
                // Every tool is at its limit: wait for a slot to come back.
                drained = true;
                tool_capped = true;
                continue;
            };
            tool_capped = reserved.capped();
            let want = reserved.len();
            let claimed = self.claim(&reserved).await;
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
                        self.feed.announce_queued(&QueuedJobs::one_of(&job.tool));
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
        let _ = follower.await;
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
        jobs.spawn(async move { pool.run_job(job, slot, release).await });
    }

    /// Whether a claim may find a job: a read where a claim that finds
    /// nothing costs more than it (yes where it does not, or the read fails).
    async fn looks_runnable(&self) -> bool {
        if self.store.empty_claim_is_cheap() {
            return true;
        }
        match self.store.job_any_runnable(now_ms()).await {
            Ok(any) => any,
            Err(e) => {
                tracing::warn!(error = %e, "queue check failed");
                true
            }
        }
    }

    /// Claim what `reserved` has room for.
    async fn claim(&self, reserved: &crate::broker::slots::Reservation) -> Vec<ClaimedJob> {
        let token = uuid::Uuid::new_v4().to_string();
        let began = crate::traces::enabled().then(std::time::SystemTime::now);
        // Through the writer: the claim shares a group commit (one fsync)
        // with the creations and completions queued meanwhile.
        let claimed = match self
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
        };
        if let Some(began) = began {
            self.trace_claims(&claimed, began);
        }
        claimed
    }

    /// A span per job claimed (traces on): the claim statement's time, under
    /// the task's stored context. (A job handed to this pool in its
    /// creation's transaction has none: its claim is the creation.)
    fn trace_claims(&self, jobs: &[ClaimedJob], began: std::time::SystemTime) {
        use crate::traces::{Span, SpanKind};
        for job in jobs {
            let parent = job::job_trace(job);
            let _claim = Span::start_at(SpanKind::Consumer, parent.as_ref(), Some(began), || {
                (
                    "task claim".into(),
                    job::run_attributes(job, &self.worker_id),
                )
            });
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

    /// A heartbeat every third of the lease, with the slots running jobs
    /// hold (a job waiting for its client holds none); and, in a worker
    /// process, when the pool fills up or has room again, one within
    /// [`FULLNESS_REPORT_MIN`] of the last, so that claim signals, which
    /// name worker processes by the room they reported, do not go on
    /// naming a full one (or passing over one with room) for a third of a
    /// lease.
    async fn heartbeat_loop(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = tokio::time::Instant::now();
        // Only worker processes are named by their room.
        let named_by_room = self.config.kind == WorkerKind::Process;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
                _ = self.slots.fullness_changed(), if named_by_room => {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep_until(last + FULLNESS_REPORT_MIN) => {}
                    }
                }
            }
            last = tokio::time::Instant::now();
            // The next periodic one a third of a lease from this one.
            tick.reset();
            let running = i64::try_from(self.slots.held()).unwrap_or(i64::MAX);
            if let Err(e) = self
                .store
                .worker_heartbeat(&self.worker_id, running, now_ms())
                .await
            {
                tracing::warn!(error = %e, "worker heartbeat failed");
            }
        }
    }
}

/// How long after a failed write of the tools a pool claims it tries again.
const SERVED_RETRY: Duration = Duration::from_secs(5);

/// Claim the tools served now: upstream servers' tools come and go while
/// the pool runs. Each change wakes the pool (`wake`): jobs of a tool just
/// served may be queued already (requeued after a restart). The pool's row
/// says which tools it claims (claim signals name a worker process only
/// for jobs of its tools), written when they change (again every
/// [`SERVED_RETRY`] while the write fails; meanwhile claim signals name it
/// by what it last said, or for any tool).
async fn follow_served_tools(pool: WorkerPool, wake: Arc<Notify>, shutdown: CancellationToken) {
    let mut changed = pool.tools.changed();
    let mut reported: Option<Vec<String>> = None;
    // The first time round: a change between the slots' making and the
    // subscription above would be missed, so the list is taken as it is.
    let mut catalog_changed = true;
    loop {
        if catalog_changed {
            pool.slots.serve(pool.tools.current().definitions());
            wake.notify_one();
        }
        let served = pool.slots.served();
        let mut retry = None;
        if reported.as_ref() != Some(&served) {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                written = pool.store.worker_serves(&pool.worker_id, &served) => match written {
                    Ok(()) => reported = Some(served),
                    Err(e) => {
                        tracing::warn!(error = %e, "recording the tools served failed; trying again");
                        retry = Some(tokio::time::Instant::now() + SERVED_RETRY);
                    }
                },
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            seen = changed.changed() => {
                if seen.is_err() {
                    return;
                }
                catalog_changed = true;
            }
            _ = tokio::time::sleep_until(retry.unwrap_or_else(tokio::time::Instant::now)), if retry.is_some() => {
                catalog_changed = false;
            }
        }
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
