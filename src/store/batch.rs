//! Group commit: many writes in one `BEGIN IMMEDIATE` transaction, so k
//! task creations and completions cost one fsync instead of k. Each write
//! runs in a savepoint of its own: one that fails (a lost lease) is rolled
//! back alone and the rest commit.

use tokio::sync::oneshot;

use super::jobs::complete_in;
use super::tasks::create_in;
use super::{BEGIN_IMMEDIATE, NewJob, NewTask, Store, StoreError, TaskOutcome, TaskRow};

/// One write of a batch, with where its result goes (after the commit).
#[derive(Debug)]
pub enum WriteOp {
    /// `task_create`.
    Create {
        /// The task.
        new: NewTask,
        /// Its job.
        job: Option<NewJob>,
        /// An immediate outcome (refused arguments).
        outcome: Option<TaskOutcome>,
        /// The new row.
        reply: oneshot::Sender<Result<TaskRow, StoreError>>,
    },
    /// `job_complete`.
    Complete {
        /// The job.
        task_seq: i64,
        /// Its lease.
        lease_token: String,
        /// What to record.
        outcome: TaskOutcome,
        /// Whether the task took the outcome.
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
}

enum Done {
    Create(
        oneshot::Sender<Result<TaskRow, StoreError>>,
        Box<Result<TaskRow, StoreError>>,
    ),
    Complete(
        oneshot::Sender<Result<bool, StoreError>>,
        Result<bool, StoreError>,
    ),
}

impl Store {
    /// Run `ops` in one transaction and answer each once it committed.
    pub async fn write_batch(&self, ops: Vec<WriteOp>, now: i64) {
        let mut done = Vec::with_capacity(ops.len());
        let committed: Result<(), StoreError> = async {
            let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
            for op in ops {
                let mut sp = sqlx::Connection::begin(&mut *tx).await?;
                match op {
                    WriteOp::Create {
                        new,
                        job,
                        outcome,
                        reply,
                    } => {
                        let result = create_in(&mut sp, &new, job, outcome.as_ref(), now).await;
                        if result.is_ok() {
                            sp.commit().await?
                        } else {
                            sp.rollback().await?
                        }
                        done.push(Done::Create(reply, Box::new(result)));
                    }
                    WriteOp::Complete {
                        task_seq,
                        lease_token,
                        outcome,
                        reply,
                    } => {
                        let result =
                            complete_in(&mut sp, task_seq, &lease_token, &outcome, now).await;
                        if result.is_ok() {
                            sp.commit().await?
                        } else {
                            sp.rollback().await?
                        }
                        done.push(Done::Complete(reply, result));
                    }
                }
            }
            tx.commit().await?;
            Ok(())
        }
        .await;
        for d in done {
            match (d, &committed) {
                (Done::Create(reply, result), Ok(())) => {
                    let _ = reply.send(*result);
                }
                (Done::Complete(reply, result), Ok(())) => {
                    let _ = reply.send(result);
                }
                (Done::Create(reply, _), Err(e)) => {
                    let _ = reply.send(Err(StoreError::Batch(e.to_string())));
                }
                (Done::Complete(reply, _), Err(e)) => {
                    let _ = reply.send(Err(StoreError::Batch(e.to_string())));
                }
            }
        }
    }
}
