//! SQL for `jobs`: leases (heartbeat, release, cancellation) and the
//! rescue of lost leases. Claims and fenced completions are writes of the
//! group commit: `batch.rs`.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::{BEGIN_IMMEDIATE, SqliteStore};

#[async_trait]
impl JobStore for SqliteStore {
    /// Extend the lease of a running job. `LeaseLost` when the token no
    /// longer holds it.
    async fn job_heartbeat(
        &self,
        task_seq: i64,
        lease_token: &str,
        lease_ms: i64,
        now: i64,
    ) -> Result<HeartbeatOutcome, StoreError> {
        let expires = now + lease_ms;
        let row = sqlx::query_scalar!(
            "UPDATE jobs SET lease_expires_at = ?
              WHERE task_seq = ? AND lease_token = ? AND state = 'running'
              RETURNING cancel_requested",
            expires,
            task_seq,
            lease_token
        )
        .fetch_optional(&mut *self.writer().await?)
        .await?;
        match row {
            Some(flag) => Ok(HeartbeatOutcome {
                cancel_requested: flag != 0,
            }),
            None => Err(StoreError::LeaseLost),
        }
    }

    /// Close a job whose task was cancelled while it ran, fenced by the
    /// lease token. The task itself is already cancelled.
    async fn job_finish_cancelled(
        &self,
        task_seq: i64,
        lease_token: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        let done = sqlx::query!(
            "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                    finished_at = ?1, changed_at = ?1, last_error = 'cancelled'
              WHERE task_seq = ?2 AND lease_token = ?3 AND state = 'running'",
            now,
            task_seq,
            lease_token
        )
        .execute(&mut *self.writer().await?)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::LeaseLost);
        }
        Ok(())
    }

    /// Undo a claim whose jobs never started (their pool stopped before it
    /// got them): queued again as before the claim, the attempt not
    /// counted. Fenced by the lease token; returns whether it was undone.
    async fn job_unclaim(
        &self,
        task_seq: i64,
        lease_token: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let undone = sqlx::query!(
            "UPDATE jobs SET state = 'queued', attempt = attempt - 1, lease_owner = NULL,
                    lease_token = NULL, lease_expires_at = NULL, changed_at = ?1,
                    last_error = 'claimed by a pool that stopped before starting it (not counted)'
              WHERE task_seq = ?2 AND lease_token = ?3 AND state = 'running' AND attempt > 0",
            now,
            task_seq,
            lease_token
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(undone.rows_affected() == 1)
    }

    /// Whether any job could be claimed now (a read: no write lock taken).
    async fn job_any_runnable(&self, now: i64) -> Result<bool, StoreError> {
        let found = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'queued' AND run_after <= ?) AS "found!: bool""#,
            now
        )
        .fetch_one(&self.read)
        .await?;
        Ok(found)
    }

    /// Give a running job back (graceful shutdown): queued again at once,
    /// so another worker takes it without waiting for the lease to expire,
    /// and the interrupted run is not counted as an attempt (a planned
    /// restart must not use up a task's attempts; only lost workers and the
    /// tool's own failures count). A job whose task was cancelled meanwhile
    /// is closed instead. Fenced by the lease token. Returns true when the
    /// job was queued again.
    async fn job_release(
        &self,
        task_seq: i64,
        lease_token: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let requeued = sqlx::query_scalar!(
            r#"UPDATE jobs SET state = CASE WHEN cancel_requested = 1 THEN 'done' ELSE 'queued' END,
                    attempt = CASE WHEN cancel_requested = 1 THEN attempt ELSE attempt - 1 END,
                    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                    run_after = ?1, changed_at = ?1,
                    finished_at = CASE WHEN cancel_requested = 1 THEN ?1 ELSE finished_at END,
                    last_error = CASE WHEN cancel_requested = 1 THEN 'cancelled'
                                      ELSE 'released by a stopping worker (attempt ' || attempt || ' not counted)' END
              WHERE task_seq = ?2 AND lease_token = ?3 AND state = 'running'
             RETURNING state = 'queued' AS "requeued!: bool""#,
            now,
            task_seq,
            lease_token
        )
        .fetch_optional(&mut *self.writer().await?)
        .await?;
        requeued.ok_or(StoreError::LeaseLost)
    }

    /// Take back every job whose lease expired (its worker died or hung):
    /// queue it again after `backoff_ms * attempt` (plus jitter) while
    /// attempts remain, else fail its task with a message that says why.
    /// One transaction.
    async fn job_rescue_expired(
        &self,
        backoff_ms: i64,
        now: i64,
    ) -> Result<RescueReport, StoreError> {
        let _turn = self.take_turn().await;
        let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
        let failed = sqlx::query_scalar!(
            r#"UPDATE tasks
                  SET status = 'failed',
                      status_message = 'worker lost ' || j.attempt || ' time(s): lease expired with no attempts left',
                      result = json_object('message', 'Task failed: worker lost ' || j.attempt || ' time(s) (lease expired)'),
                      result_kind = 'error',
                      updated_at = MAX(tasks.updated_at, ?)
                 FROM jobs j
                WHERE j.task_seq = tasks.seq AND j.state = 'running' AND j.lease_expires_at <= ?
                  AND j.attempt >= j.max_attempts AND j.cancel_requested = 0
                  AND tasks.status IN ('working', 'input_required')
            RETURNING tasks.tool"#,
            now,
            now
        )
        .fetch_all(&mut *tx)
        .await?;
        let closed = sqlx::query!(
            "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                    finished_at = ?1, changed_at = ?1,
                    last_error = CASE WHEN cancel_requested = 1 THEN 'cancelled; worker lost'
                                      ELSE 'lease expired on attempt ' || attempt || '; no attempts left' END
              WHERE state = 'running' AND lease_expires_at <= ?1
                AND (attempt >= max_attempts OR cancel_requested = 1)",
            now
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let requeued = sqlx::query!(
            "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                    run_after = ?1 + ?2 * attempt + abs(random() % 250), changed_at = ?1,
                    last_error = 'lease expired on attempt ' || attempt
              WHERE state = 'running' AND lease_expires_at <= ?1",
            now,
            backoff_ms
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(RescueReport {
            requeued,
            closed: closed.saturating_sub(failed.len() as u64),
            failed,
        })
    }

    /// Keep where a running job has got to, fenced by the lease token.
    async fn job_checkpoint(
        &self,
        task_seq: i64,
        lease_token: &str,
        checkpoint: &str,
        _now: i64,
    ) -> Result<(), StoreError> {
        let kept = sqlx::query!(
            "UPDATE jobs SET checkpoint = ?
              WHERE task_seq = ? AND lease_token = ? AND state = 'running'",
            checkpoint,
            task_seq,
            lease_token
        )
        .execute(&mut *self.writer().await?)
        .await?;
        if kept.rows_affected() == 0 {
            return Err(StoreError::LeaseLost);
        }
        Ok(())
    }
}
