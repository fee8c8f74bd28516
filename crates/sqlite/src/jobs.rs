//! SQL for `jobs`: claims, leases, fenced completion, rescue of lost leases.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::{BEGIN_IMMEDIATE, SqliteStore};

#[async_trait]
impl JobStore for SqliteStore {
    /// Claim up to `limit` runnable jobs for `worker`, by priority then age,
    /// at most each tool's quota (jobs of tools without one are left), in
    /// one statement (its own transaction). All jobs of one claim share the
    /// fresh `lease_token`.
    async fn job_claim_available(
        &self,
        worker: &str,
        lease_token: &str,
        quotas: &[ToolQuota],
        limit: i64,
        lease_ms: i64,
        now: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let mut conn = self.write.acquire().await?;
        claim_in(&mut conn, worker, lease_token, quotas, limit, lease_ms, now).await
    }

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
        .fetch_optional(&self.write)
        .await?;
        match row {
            Some(flag) => Ok(HeartbeatOutcome {
                cancel_requested: flag != 0,
            }),
            None => Err(StoreError::LeaseLost),
        }
    }

    /// Finish a job and record the task's outcome in one transaction, fenced
    /// by the lease token. Returns whether the task took the outcome: false
    /// when it was already terminal (cancelled), which stays as it is (T-22).
    async fn job_complete(
        &self,
        task_seq: i64,
        lease_token: &str,
        outcome: &TaskOutcome,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
        let took = complete_in(&mut tx, task_seq, lease_token, outcome, now).await?;
        tx.commit().await?;
        Ok(took)
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
        .execute(&self.write)
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
        .execute(&self.write)
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
        .fetch_optional(&self.write)
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
}

/// The statements of `job_complete`, inside the caller's transaction.
/// `LeaseLost` (and nothing written) when the token no longer holds the job.
pub(super) async fn complete_in(
    conn: &mut sqlx::SqliteConnection,
    task_seq: i64,
    lease_token: &str,
    outcome: &TaskOutcome,
    now: i64,
) -> Result<bool, StoreError> {
    let fenced = sqlx::query!(
        "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                finished_at = ?1, changed_at = ?1, last_error = NULL
          WHERE task_seq = ?2 AND lease_token = ?3 AND state = 'running'",
        now,
        task_seq,
        lease_token
    )
    .execute(&mut *conn)
    .await?;
    if fenced.rows_affected() == 0 {
        return Err(StoreError::LeaseLost);
    }
    let updated = sqlx::query!(
        "UPDATE tasks SET status = ?, status_message = ?, result = ?, result_kind = ?,
                tool_error = ?, updated_at = MAX(updated_at, ?)
          WHERE seq = ? AND status IN ('working', 'input_required')",
        outcome.status.as_str(),
        outcome.status_message,
        outcome.result,
        outcome.result_kind.as_str(),
        outcome.tool_error,
        now,
        task_seq
    )
    .execute(&mut *conn)
    .await?;
    Ok(updated.rows_affected() == 1)
}

/// The statement of `job_claim_available`, on the caller's connection (its
/// own transaction, or the writer's group commit).
///
/// Each tool may take `min(free, global - running)` jobs (`cap`). The claim
/// walks the queue by priority then age over tools whose cap is above zero
/// only, reading at most `4 * limit` jobs (the `head`), and takes from it up
/// to each tool's cap: a tool at its limit is skipped in the index, so it
/// delays no other tool; each claim takes at least the head's first job, so
/// every tool with room is reached within a few claims. The running count
/// of a globally limited tool is read in the same write transaction as the
/// claim, so the global limit holds whatever the number of processes.
pub(super) async fn claim_in(
    conn: &mut sqlx::SqliteConnection,
    worker: &str,
    lease_token: &str,
    quotas: &[ToolQuota],
    limit: i64,
    lease_ms: i64,
    now: i64,
) -> Result<Vec<ClaimedJob>, StoreError> {
    if limit <= 0 || quotas.iter().all(|q| q.free <= 0) {
        return Ok(Vec::new());
    }
    let lease_expires_at = now + lease_ms;
    let quotas = serde_json::Value::Array(
        quotas
            .iter()
            .filter(|q| q.free > 0)
            .map(|q| serde_json::json!({ "tool": q.tool, "free": q.free, "global": q.global }))
            .collect(),
    )
    .to_string();
    let head = limit.saturating_mul(4);
    let mut jobs = sqlx::query_as!(
        ClaimedJob,
        r#"WITH quota AS (SELECT value ->> 'tool' AS tool, value ->> 'free' AS free,
                                value ->> 'global' AS global
                           FROM json_each(?6)),
                running AS (SELECT r.tool, count(*) AS n
                              FROM jobs r JOIN tasks t ON t.seq = r.task_seq
                             WHERE r.state = 'running' AND t.status = 'working'
                               AND r.tool IN (SELECT tool FROM quota WHERE global IS NOT NULL)
                             GROUP BY r.tool),
                cap AS (SELECT q.tool,
                               min(q.free, coalesce(q.global - coalesce(r.n, 0), q.free)) AS n
                          FROM quota q LEFT JOIN running r ON r.tool = q.tool),
                head AS (SELECT task_seq, priority, tool FROM jobs
                          WHERE state = 'queued' AND run_after <= ?4
                            AND tool IN (SELECT tool FROM cap WHERE n > 0)
                          ORDER BY priority, task_seq LIMIT ?7),
                ranked AS (SELECT task_seq, priority, tool,
                                  row_number() OVER (PARTITION BY tool ORDER BY priority, task_seq) AS rn
                             FROM head)
           UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = ?1,
                  lease_token = ?2, lease_expires_at = ?3, changed_at = ?4
            WHERE task_seq IN (SELECT k.task_seq FROM ranked k JOIN cap c ON c.tool = k.tool
                                WHERE k.rn <= c.n
                                ORDER BY k.priority, k.task_seq LIMIT ?5)
           RETURNING task_seq AS "task_seq!",
                     (SELECT task_id FROM tasks WHERE seq = task_seq) AS "task_id!: String",
                     tool AS "tool!: String",
                     (SELECT arguments FROM tasks WHERE seq = task_seq) AS "arguments!: String",
                     (SELECT progress_token FROM tasks WHERE seq = task_seq) AS "progress_token?: String",
                     attempt AS "attempt!", max_attempts AS "max_attempts!", priority AS "priority!",
                     lease_token AS "lease_token!: String""#,
        worker,
        lease_token,
        lease_expires_at,
        now,
        limit,
        quotas,
        head
    )
    .fetch_all(&mut *conn)
    .await?;
    jobs.sort_by_key(|j| (j.priority, j.task_seq));
    Ok(jobs)
}
