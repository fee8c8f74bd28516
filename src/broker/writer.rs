//! The single writer of a process's hot writes (task creations and job
//! completions): requests queue on a channel, and whatever queued while the
//! previous transaction committed goes into the next one (group commit), so
//! with `synchronous=FULL` k writes share one fsync. Each caller is answered
//! only after its write committed.

use tokio::sync::{mpsc, oneshot};

use super::Feed;
use crate::clock::now_ms;
use crate::store::{ClaimedJob, NewJob, NewTask, Store, StoreError, TaskOutcome, TaskRow, WriteOp};

/// Most writes in one transaction.
const MAX_BATCH: usize = 512;

/// Handle on the writer task.
#[derive(Debug, Clone)]
pub struct Writer {
    ops: mpsc::Sender<WriteOp>,
}

fn gone() -> StoreError {
    StoreError::Batch("the writer stopped".into())
}

impl Writer {
    /// Start the writer task; it runs until every handle is dropped.
    pub fn spawn(store: Store, feed: Feed) -> Self {
        let (ops, mut rx) = mpsc::channel::<WriteOp>(4 * MAX_BATCH);
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
                let finished: Vec<String> = batch
                    .iter()
                    .filter_map(|op| match op {
                        WriteOp::Complete { task_id, .. } => Some(task_id.clone()),
                        WriteOp::Create { .. } | WriteOp::Claim { .. } => None,
                    })
                    .collect();
                store.write_batch(batch, now_ms()).await;
                tracing::trace!(writes = n, "group commit");
                for task_id in &finished {
                    feed.written(task_id);
                }
                feed.kick();
            }
        });
        Self { ops }
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

    /// Claim up to `limit` jobs for `worker` in the next group commit.
    pub async fn claim(
        &self,
        worker: &str,
        lease_token: &str,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.ops
            .send(WriteOp::Claim {
                worker: worker.to_owned(),
                lease_token: lease_token.to_owned(),
                limit,
                lease_ms,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}
