//! The single writer of a process's hot writes (task creations, claims,
//! job completions): requests queue on a channel, and whatever queued while
//! the previous transaction committed goes into the next one (group commit),
//! so with `synchronous=FULL` k writes share one fsync. Each caller is
//! answered only after its write committed.
//!
//! Hand-off: when this process's own worker pool has free slots, jobs are
//! claimed for it in the very transaction that creates them, and handed to
//! it with their slots, instead of the pool being woken to claim them in a
//! later one. A job queued to start later wakes nobody until its start
//! (`start_alarm`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc, oneshot};

use super::Feed;
use super::slots::{Reservation, Slot, Slots};
use super::start_alarm::StartAlarm;
use crate::clock::now_ms;
use crate::store::{
    ClaimedJob, NewJob, NewTask, QueuedJobs, Store, StoreError, TaskOutcome, TaskRow, ToolQuota,
    Write, Written,
};

/// Most writes in one transaction.
const MAX_BATCH: usize = 512;

/// A job claimed for the pool, with the slot it runs in.
pub type HandedOff = (ClaimedJob, Slot);

/// Where the writer hands jobs to this process's worker pool.
#[derive(Debug)]
pub struct Handoff {
    /// The pool's id (the claims' `lease_owner`).
    pub worker_id: String,
    /// The pool's lease length.
    pub lease_ms: i64,
    /// The pool's slots: a claim takes as many as it has jobs for, within
    /// each tool's.
    pub slots: Arc<Slots>,
    /// The pool's inbox.
    pub jobs: mpsc::UnboundedSender<HandedOff>,
}

/// Where the outcome of one queued write goes, once committed.
#[derive(Debug)]
enum Reply {
    Create(oneshot::Sender<Result<TaskRow, StoreError>>),
    Complete(oneshot::Sender<Result<bool, StoreError>>),
    Claim(oneshot::Sender<Result<Vec<ClaimedJob>, StoreError>>),
}

impl Reply {
    /// Answer with what the write came to.
    fn send(self, done: Result<Written, StoreError>) {
        let mismatch = || StoreError::Batch("mismatched reply".into());
        match self {
            Reply::Create(tx) => {
                let _ = tx.send(done.and_then(|w| match w {
                    Written::Created(row) => Ok(row),
                    _ => Err(mismatch()),
                }));
            }
            Reply::Complete(tx) => {
                let _ = tx.send(done.and_then(|w| match w {
                    Written::Completed(took) => Ok(took),
                    _ => Err(mismatch()),
                }));
            }
            Reply::Claim(tx) => {
                let _ = tx.send(done.and_then(|w| match w {
                    Written::Claimed(jobs) => Ok(jobs),
                    _ => Err(mismatch()),
                }));
            }
        }
    }
}

/// A write waiting for the next group commit.
#[derive(Debug)]
struct Queued {
    write: Write,
    reply: Reply,
}

/// Handle on the writer task.
#[derive(Debug, Clone)]
pub struct Writer {
    ops: mpsc::Sender<Queued>,
    handoff: Arc<Mutex<Option<Handoff>>>,
}

fn gone() -> StoreError {
    StoreError::Batch("the writer stopped".into())
}

impl Writer {
    /// Start the writer task; it runs until every handle is dropped.
    /// `job_queued` is woken after a commit that queued jobs nobody took.
    pub fn spawn(store: Store, feed: Feed, job_queued: Arc<Notify>) -> Self {
        let (ops, mut rx) = mpsc::channel::<Queued>(4 * MAX_BATCH);
        let handoff: Arc<Mutex<Option<Handoff>>> = Arc::default();
        let pool = handoff.clone();
        let alarm = StartAlarm::spawn(job_queued.clone(), feed.clone());
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // The turn first: the writes that arrive while another
                // process commits join this batch.
                let turn = store.write_turn().await;
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(op) => batch.push(op),
                        Err(_) => break,
                    }
                }
                let n = batch.len();
                let (mut writes, replies): (Vec<Write>, Vec<Reply>) =
                    batch.into_iter().map(|q| (q.write, q.reply)).unzip();
                let mut finished = Vec::new();
                // Tasks created with a job due now, and their tools.
                let mut created = HashMap::new();
                // Jobs that start later: nobody can claim them yet.
                let mut starts = Vec::new();
                let before = now_ms();
                for write in &writes {
                    match write {
                        Write::Complete { task_id, .. } => finished.push(task_id.clone()),
                        Write::Create {
                            new,
                            job: Some(job),
                            outcome: None,
                        } => match job.run_after.filter(|at| *at > before) {
                            Some(at) => starts.push(at),
                            None => {
                                created.insert(new.task_id.clone(), new.tool.clone());
                            }
                        },
                        _ => {}
                    }
                }
                let queued = created.len();
                let handed = if queued > 0 {
                    hand_off(&pool, &mut writes, queued)
                } else {
                    None
                };
                // Tasks created with a job due now: their rows are kept
                // after the commit unless a change of them comes first.
                for task_id in created.keys() {
                    feed.expect_created(task_id);
                }
                let now = now_ms();
                let metrics = crate::metrics::get();
                metrics.commit_started(writes.len());
                let committing = std::time::Instant::now();
                let mut done = match store.write_batch_in(turn, &writes, now).await {
                    Ok(done) => done,
                    Err(e) => {
                        tracing::warn!(error = %e, writes = writes.len(), "group commit failed");
                        let text = e.to_string();
                        writes
                            .iter()
                            .map(|_| Err(StoreError::Batch(text.clone())))
                            .collect()
                    }
                };
                metrics.commit_done(committing.elapsed());
                count_batch(&done, now);
                // The hand-off claim, if any, is the last write.
                let claimed = match handed {
                    Some(_) if done.len() == writes.len() => done.pop(),
                    _ => None,
                };
                // Their rows, kept as created for the first look of their
                // tasks/result, before their creators hear of them and their
                // jobs start (whoever runs them: this process's pool, in the
                // hand-off or later, or another process, whose changes the
                // feed reads at once for a task kept here); those whose
                // creation failed are forgotten.
                let mut kept_ids = HashSet::new();
                for d in &done {
                    if let Ok(Written::Created(row)) = d
                        && created.contains_key(&row.task_id)
                    {
                        feed.remember_created(row);
                        kept_ids.insert(row.task_id.as_str());
                    }
                }
                for task_id in created.keys().filter(|id| !kept_ids.contains(id.as_str())) {
                    feed.forget_created(task_id);
                }
                // Only the jobs of creations that took are queued.
                created.retain(|task_id, _| kept_ids.contains(task_id.as_str()));
                // Completions that took: this process's waiters get the
                // outcome with the word (no read of the task again).
                let mut ended = HashSet::new();
                for (write, d) in writes.iter().zip(&done) {
                    if let (
                        Write::Complete {
                            task_id, outcome, ..
                        },
                        Ok(Written::Completed(true)),
                    ) = (write, d)
                    {
                        feed.ended(task_id, || outcome.clone(), now);
                        ended.insert(task_id.as_str());
                    }
                }
                finished.retain(|id| !ended.contains(id.as_str()));
                for (reply, d) in replies.into_iter().zip(done) {
                    reply.send(d);
                }
                tracing::trace!(writes = n, "group commit");
                let taken = match (handed, claimed) {
                    (Some((permits, token)), Some(claimed)) => {
                        deliver(&store, &pool, claimed, permits, &token).await
                    }
                    _ => Vec::new(),
                };
                // Wake the pool for what it was not given: this batch's jobs
                // not handed off (an older due job may have been taken
                // instead of one of them).
                if let Some(left) = left_queued(&created, &taken) {
                    job_queued.notify_one();
                    feed.announce_queued(&left);
                }
                for at in starts {
                    alarm.set(at);
                }
                for task_id in &finished {
                    feed.written(task_id);
                }
                // Claims alone change no status: nobody's feed need look.
                // The writer writes no progress.
                if writes.iter().any(|w| !matches!(w, Write::Claim { .. })) {
                    feed.kick_statuses();
                }
                metrics.writer_idle();
            }
        });
        Self { ops, handoff }
    }

    /// Hand jobs to this process's pool from now on.
    pub fn hand_off_to(&self, handoff: Handoff) {
        *self.handoff.lock().unwrap_or_else(|p| p.into_inner()) = Some(handoff);
    }

    /// Stop handing jobs off (the pool is stopping).
    pub fn stop_hand_off(&self) {
        *self.handoff.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Create a task (and its job) in the next group commit.
    pub async fn create(
        &self,
        new: NewTask,
        job: Option<NewJob>,
        outcome: Option<TaskOutcome>,
    ) -> Result<TaskRow, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.ops
            .send(Queued {
                write: Write::Create {
                    new: Box::new(new),
                    job,
                    outcome,
                },
                reply: Reply::Create(reply),
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Complete a job (fenced by its lease) in the next group commit.
    pub async fn complete(
        &self,
        task_seq: i64,
        task_id: &str,
        lease_token: &str,
        outcome: TaskOutcome,
    ) -> Result<bool, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.ops
            .send(Queued {
                write: Write::Complete {
                    task_seq,
                    task_id: task_id.to_owned(),
                    lease_token: lease_token.to_owned(),
                    outcome,
                },
                reply: Reply::Complete(reply),
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Claim up to `limit` jobs for `worker`, within each tool's quota, in
    /// the next group commit.
    pub async fn claim(
        &self,
        worker: &str,
        lease_token: &str,
        quotas: Vec<ToolQuota>,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.ops
            .send(Queued {
                write: Write::Claim {
                    worker: worker.to_owned(),
                    lease_token: lease_token.to_owned(),
                    quotas,
                    limit,
                    lease_ms,
                },
                reply: Reply::Claim(reply),
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// What a hand-off claim holds: the slots it reserved, its lease token.
type Pending = (Reservation, String);

/// Append a claim for the pool to `batch` if it has free slots (as many as
/// the batch queues jobs, at most).
fn hand_off(
    pool: &Mutex<Option<Handoff>>,
    batch: &mut Vec<Write>,
    queued: usize,
) -> Option<Pending> {
    let guard = pool.lock().unwrap_or_else(|p| p.into_inner());
    let handoff = guard.as_ref()?;
    let reserved = handoff.slots.try_reserve(queued)?;
    let token = uuid::Uuid::new_v4().to_string();
    batch.push(Write::Claim {
        worker: handoff.worker_id.clone(),
        lease_token: token.clone(),
        quotas: reserved.quotas().to_vec(),
        limit: i64::try_from(reserved.len()).unwrap_or(i64::MAX),
        lease_ms: handoff.lease_ms,
    });
    Some((reserved, token))
}

/// Give the pool what the hand-off claim took, one slot each; unused slots
/// go back. A pool that has gone gets nothing: its jobs are queued again as
/// they were (the attempt does not count), and hand-offs stop. Returns the
/// ids of the tasks whose jobs the pool got.
async fn deliver(
    store: &Store,
    pool: &Mutex<Option<Handoff>>,
    claimed: Result<Written, StoreError>,
    mut reserved: Reservation,
    token: &str,
) -> Vec<String> {
    let jobs = match claimed {
        Ok(Written::Claimed(jobs)) => jobs,
        Ok(_) => return Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, "hand-off claim failed");
            return Vec::new();
        }
    };
    let mut orphans = Vec::new();
    let mut taken = Vec::new();
    {
        let mut guard = pool.lock().unwrap_or_else(|p| p.into_inner());
        for job in jobs {
            let task_id = job.task_id.clone();
            let sent = match (guard.as_ref(), reserved.take(&job.tool)) {
                (Some(handoff), Some(slot)) => handoff.jobs.send((job, slot)).map_err(|e| e.0.0),
                (_, _) => Err(job),
            };
            match sent {
                Ok(()) => taken.push(task_id),
                Err(job) => {
                    // The pool is gone: no more hand-offs.
                    *guard = None;
                    orphans.push(job);
                }
            }
        }
    }
    for job in orphans {
        match store.job_unclaim(job.task_seq, token, now_ms()).await {
            Ok(_) => {
                tracing::debug!(task_id = %job.task_id, "pool stopped: handed-off job queued again")
            }
            Err(e) => {
                tracing::warn!(task_id = %job.task_id, error = %e, "undoing a hand-off failed; its lease will expire")
            }
        }
    }
    taken
}

/// The jobs of a batch's creations that the hand-off did not take, by
/// tool (an older due job taken instead leaves one of them queued); None
/// when it took them all.
fn left_queued(created: &HashMap<String, String>, taken: &[String]) -> Option<QueuedJobs> {
    let tools: Vec<String> = created
        .iter()
        .filter(|(task_id, _)| !taken.contains(task_id))
        .map(|(_, tool)| tool.clone())
        .collect();
    (!tools.is_empty()).then_some(QueuedJobs { tools, untold: 0 })
}

/// Count what a group commit did: tasks created (and those finished at
/// once), and how long each claimed job had waited in the queue (since it
/// became runnable: the claim returns when that was).
fn count_batch(done: &[Result<Written, StoreError>], now: i64) {
    let metrics = crate::metrics::get();
    for row in done.iter().filter_map(|d| match d {
        Ok(Written::Created(row)) => Some(row),
        _ => None,
    }) {
        let status = row.status.is_terminal().then(|| row.status.to_string());
        metrics.task_created(&row.tool, status.as_deref());
    }
    for job in done.iter().flat_map(|d| match d {
        Ok(Written::Claimed(jobs)) => jobs.as_slice(),
        _ => &[],
    }) {
        metrics.job_claimed(&job.tool, now - job.runnable_since);
    }
}
