//! The single writer of a process's hot writes (task creations, claims,
//! job completions): requests queue on a channel, and whatever queued while
//! the previous transaction committed goes into the next one (group commit),
//! so with `synchronous=FULL` k writes share one fsync. Each caller is
//! answered only after its write committed.
//!
//! Hand-off: when this process's own worker pool has free slots, jobs are
//! claimed for it in the very transaction that creates them, and handed to
//! it with their slots, instead of the pool being woken to claim them in a
//! later one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc, oneshot};

use super::Feed;
use super::slots::{Reservation, Slot, Slots};
use crate::clock::now_ms;
use crate::store::{
    ClaimedJob, NewJob, NewTask, Store, StoreError, TaskOutcome, TaskRow, ToolQuota, WriteOp,
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

/// Handle on the writer task.
#[derive(Debug, Clone)]
pub struct Writer {
    ops: mpsc::Sender<WriteOp>,
    handoff: Arc<Mutex<Option<Handoff>>>,
}

fn gone() -> StoreError {
    StoreError::Batch("the writer stopped".into())
}

impl Writer {
    /// Start the writer task; it runs until every handle is dropped.
    /// `job_queued` is woken after a commit that queued jobs nobody took.
    pub fn spawn(store: Store, feed: Feed, job_queued: Arc<Notify>) -> Self {
        let (ops, mut rx) = mpsc::channel::<WriteOp>(4 * MAX_BATCH);
        let handoff: Arc<Mutex<Option<Handoff>>> = Arc::default();
        let pool = handoff.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(op) => batch.push(op),
                        Err(_) => break,
                    }
                }
                let n = batch.len();
                let mut finished = Vec::new();
                let mut created = HashSet::new();
                for op in &batch {
                    match op {
                        WriteOp::Complete { task_id, .. } => finished.push(task_id.clone()),
                        WriteOp::Create {
                            new,
                            job: Some(_),
                            outcome: None,
                            ..
                        } => {
                            created.insert(new.task_id.clone());
                        }
                        _ => {}
                    }
                }
                let queued = created.len();
                let handed = if queued > 0 {
                    hand_off(&pool, &mut batch, queued)
                } else {
                    None
                };
                let now = now_ms();
                store.write_batch(batch, now).await;
                tracing::trace!(writes = n, "group commit");
                let taken = match handed {
                    Some((answer, permits, token)) => {
                        deliver(&store, &pool, answer, permits, &token).await
                    }
                    None => Vec::new(),
                };
                // Wake the pool for what it was not given: this batch's jobs
                // not handed off (an older due job may have been taken
                // instead of one of them).
                let all_handed =
                    taken.len() == queued && taken.iter().all(|id| created.contains(id));
                if queued > 0 && !all_handed {
                    job_queued.notify_one();
                }
                for task_id in &finished {
                    feed.written(task_id);
                }
                feed.kick();
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
            .send(WriteOp::Create {
                new,
                job,
                outcome,
                reply,
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
            .send(WriteOp::Complete {
                task_seq,
                task_id: task_id.to_owned(),
                lease_token: lease_token.to_owned(),
                outcome,
                reply,
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
            .send(WriteOp::Claim {
                worker: worker.to_owned(),
                lease_token: lease_token.to_owned(),
                quotas,
                limit,
                lease_ms,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// What a hand-off claim waits for: its answer, the slots it holds, its
/// lease token.
type Pending = (
    oneshot::Receiver<Result<Vec<ClaimedJob>, StoreError>>,
    Reservation,
    String,
);

/// Append a claim for the pool to `batch` if it has free slots (as many as
/// the batch queues jobs, at most).
fn hand_off(
    pool: &Mutex<Option<Handoff>>,
    batch: &mut Vec<WriteOp>,
    queued: usize,
) -> Option<Pending> {
    let guard = pool.lock().unwrap_or_else(|p| p.into_inner());
    let handoff = guard.as_ref()?;
    let reserved = handoff.slots.try_reserve(queued)?;
    let (reply, answer) = oneshot::channel();
    let token = uuid::Uuid::new_v4().to_string();
    batch.push(WriteOp::Claim {
        worker: handoff.worker_id.clone(),
        lease_token: token.clone(),
        quotas: reserved.quotas().to_vec(),
        limit: i64::try_from(reserved.len()).unwrap_or(i64::MAX),
        lease_ms: handoff.lease_ms,
        reply,
    });
    Some((answer, reserved, token))
}

/// Give the pool what the hand-off claim took, one slot each; unused slots
/// go back. A pool that has gone gets nothing: its jobs are queued again as
/// they were (the attempt does not count), and hand-offs stop. Returns the
/// ids of the tasks whose jobs the pool got.
async fn deliver(
    store: &Store,
    pool: &Mutex<Option<Handoff>>,
    answer: oneshot::Receiver<Result<Vec<ClaimedJob>, StoreError>>,
    mut reserved: Reservation,
    token: &str,
) -> Vec<String> {
    let jobs = match answer.await {
        Ok(Ok(jobs)) => jobs,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "hand-off claim failed");
            return Vec::new();
        }
        Err(_) => return Vec::new(),
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
