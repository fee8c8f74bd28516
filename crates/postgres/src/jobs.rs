//! SQL for `jobs`: claims, leases, fenced completion, rescue of lost leases.

use async_trait::async_trait;
use serde_json::{Value, json};
use sqlx::{Acquire, PgConnection};
use taskbroker_storage::*;

use crate::{PostgresStore, TOOL_LOCK_CLASS, begin_feed};

#[async_trait]
impl JobStore for PostgresStore {
    /// Claim up to `limit` runnable jobs for `worker`, by priority then age,
    /// at most each tool's quota (jobs of tools without one are left), in
    /// one statement. All jobs of one claim share the fresh `lease_token`.
    /// Jobs another claimer holds are skipped, never waited for.
    async fn job_claim_available(
        &self,
        worker: &str,
        lease_token: &str,
        quotas: &[ToolQuota],
        limit: i64,
        lease_ms: i64,
        now: i64,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        if quotas.iter().any(|q| q.free > 0 && q.global.is_some()) {
            // The tool locks last until the claim commits.
            let mut tx = conn.begin().await?;
            let jobs = claim_in(&mut tx, worker, lease_token, quotas, limit, lease_ms, now).await?;
            tx.commit().await?;
            Ok(jobs)
        } else {
            claim_in(&mut conn, worker, lease_token, quotas, limit, lease_ms, now).await
        }
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
            "UPDATE jobs SET lease_expires_at = $1
              WHERE task_seq = $2 AND lease_token = $3 AND state = 'running'
              RETURNING cancel_requested",
            expires,
            task_seq,
            lease_token
        )
        .fetch_optional(&self.pool)
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
        let mut tx = begin_feed(&self.pool).await?;
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
                    finished_at = $1, changed_at = $1, last_error = 'cancelled'
              WHERE task_seq = $2 AND lease_token = $3 AND state = 'running'",
            now,
            task_seq,
            lease_token
        )
        .execute(&self.pool)
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
        // A requeue may move the task (trigger jobs_requeued): feed lock.
        let mut tx = begin_feed(&self.pool).await?;
        let undone = sqlx::query!(
            "UPDATE jobs SET state = 'queued', attempt = attempt - 1, lease_owner = NULL,
                    lease_token = NULL, lease_expires_at = NULL, changed_at = $1,
                    last_error = 'claimed by a pool that stopped before starting it (not counted)'
              WHERE task_seq = $2 AND lease_token = $3 AND state = 'running' AND attempt > 0",
            now,
            task_seq,
            lease_token
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(undone.rows_affected() == 1)
    }

    /// Whether any job could be claimed now.
    async fn job_any_runnable(&self, now: i64) -> Result<bool, StoreError> {
        let found = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'queued' AND run_after <= $1) AS "found!""#,
            now
        )
        .fetch_one(&self.pool)
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
        let mut tx = begin_feed(&self.pool).await?;
        let requeued = sqlx::query_scalar!(
            r#"UPDATE jobs SET state = CASE WHEN cancel_requested = 1 THEN 'done' ELSE 'queued' END,
                    attempt = CASE WHEN cancel_requested = 1 THEN attempt ELSE attempt - 1 END,
                    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                    run_after = $1, changed_at = $1,
                    finished_at = CASE WHEN cancel_requested = 1 THEN $1 ELSE finished_at END,
                    last_error = CASE WHEN cancel_requested = 1 THEN 'cancelled'
                                      ELSE 'released by a stopping worker (attempt ' || attempt || ' not counted)' END
              WHERE task_seq = $2 AND lease_token = $3 AND state = 'running'
             RETURNING state = 'queued' AS "requeued!""#,
            now,
            task_seq,
            lease_token
        )
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
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
        let mut tx = begin_feed(&self.pool).await?;
        // The expired jobs, locked: a heartbeat racing the rescue waits,
        // then finds its lease gone; the three statements below see the
        // same jobs.
        let expired: Vec<i64> = sqlx::query_scalar!(
            "SELECT task_seq FROM jobs WHERE state = 'running' AND lease_expires_at <= $1
              ORDER BY task_seq FOR UPDATE",
            now
        )
        .fetch_all(&mut *tx)
        .await?;
        if expired.is_empty() {
            tx.rollback().await?;
            return Ok(RescueReport::default());
        }
        // The error record reads as SQLite's json_object() gives it, and
        // has no code: the broker itself failed the task.
        let failed = sqlx::query_scalar!(
            r#"UPDATE tasks
                  SET status = 'failed',
                      status_message = 'worker lost ' || j.attempt || ' time(s): lease expired with no attempts left',
                      result = '{"message":'
                               || to_json('Task failed: worker lost ' || j.attempt || ' time(s) (lease expired)')::text
                               || '}',
                      result_kind = 'error',
                      updated_at = GREATEST(tasks.updated_at, $1)
                 FROM jobs j
                WHERE j.task_seq = tasks.seq AND j.task_seq = ANY($2)
                  AND j.state = 'running' AND j.lease_expires_at <= $1
                  AND j.attempt >= j.max_attempts AND j.cancel_requested = 0
                  AND tasks.status IN ('working', 'input_required')
            RETURNING tasks.tool"#,
            now,
            &expired
        )
        .fetch_all(&mut *tx)
        .await?;
        let closed = sqlx::query!(
            "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                    finished_at = $1, changed_at = $1,
                    last_error = CASE WHEN cancel_requested = 1 THEN 'cancelled; worker lost'
                                      ELSE 'lease expired on attempt ' || attempt || '; no attempts left' END
              WHERE task_seq = ANY($2) AND state = 'running' AND lease_expires_at <= $1
                AND (attempt >= max_attempts OR cancel_requested = 1)",
            now,
            &expired
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let requeued = sqlx::query!(
            "UPDATE jobs SET state = 'queued', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                    run_after = $1 + $2 * attempt + floor(random() * 250)::bigint, changed_at = $1,
                    last_error = 'lease expired on attempt ' || attempt
              WHERE task_seq = ANY($3) AND state = 'running' AND lease_expires_at <= $1",
            now,
            backoff_ms,
            &expired
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

/// The statements of `job_complete`, inside the caller's transaction (which
/// holds the feed lock). `LeaseLost` (and nothing written) when the token
/// no longer holds the job.
pub(super) async fn complete_in(
    conn: &mut PgConnection,
    task_seq: i64,
    lease_token: &str,
    outcome: &TaskOutcome,
    now: i64,
) -> Result<bool, StoreError> {
    let fenced = sqlx::query!(
        "UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                finished_at = $1, changed_at = $1, last_error = NULL
          WHERE task_seq = $2 AND lease_token = $3 AND state = 'running'",
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
        "UPDATE tasks SET status = $1, status_message = $2, result = $3, result_kind = $4,
                tool_error = $5, updated_at = GREATEST(updated_at, $6)
          WHERE seq = $7 AND status IN ('working', 'input_required')",
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

/// The second key of a tool's advisory lock: FNV-1a of its name (a
/// collision only makes two tools' claims take turns).
fn tool_lock_key(tool: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in tool.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    i32::from_ne_bytes(hash.to_ne_bytes())
}

/// The statement of `job_claim_available`, on the caller's connection (a
/// transaction when a quota has a global limit: the caller's own, or the
/// group commit's).
///
/// Each tool may take `min(free, global - running)` jobs (`cap`). The claim
/// walks the queue by priority then age over tools whose cap is above zero
/// only, reading at most `4 * limit` jobs (the `head`, locked with `FOR
/// UPDATE SKIP LOCKED`: jobs another claim holds are passed over, and the
/// head's rows stay locked until this transaction ends), and takes from it
/// up to each tool's cap: a tool at its limit is skipped in the index, so
/// it delays no other tool; each claim takes at least the head's first job,
/// so every tool with room is reached within a few claims. A globally
/// limited tool's running jobs are counted under that tool's advisory lock,
/// held until the claim commits, so the global limit holds whatever the
/// number of processes.
pub(super) async fn claim_in(
    conn: &mut PgConnection,
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
    // In one order (the keys sorted), so that two claims never wait for
    // each other's locks in a cycle.
    let mut keys: Vec<i32> = quotas
        .iter()
        .filter(|q| q.free > 0 && q.global.is_some())
        .map(|q| tool_lock_key(&q.tool))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        sqlx::query!("SELECT pg_advisory_xact_lock($1, $2)", TOOL_LOCK_CLASS, key)
            .execute(&mut *conn)
            .await?;
    }
    // Candidates are locked (SKIP LOCKED) until this transaction commits, so
    // other claimers skip them: lock no more than this claim can take. Only
    // when a tool's quota may bind does the claim need a wider window (4x)
    // to find jobs of other tools behind the capped one's.
    let binding = quotas
        .iter()
        .any(|q| q.free > 0 && (q.free < limit || q.global.is_some()));
    let head = if binding {
        limit.saturating_mul(4)
    } else {
        limit
    };
    let lease_expires_at = now + lease_ms;
    let quotas = Value::Array(
        quotas
            .iter()
            .filter(|q| q.free > 0)
            .map(|q| json!({ "tool": q.tool, "free": q.free, "global_limit": q.global }))
            .collect(),
    );
    let mut jobs = sqlx::query_as!(
        ClaimedJob,
        r#"WITH quota AS (SELECT tool, free, global_limit
                            FROM jsonb_to_recordset($6::jsonb)
                                 AS q(tool text, free bigint, global_limit bigint)),
                running AS (SELECT r.tool, count(*) AS n
                              FROM jobs r JOIN tasks t ON t.seq = r.task_seq
                             WHERE r.state = 'running' AND t.status = 'working'
                               AND r.tool IN (SELECT tool FROM quota WHERE global_limit IS NOT NULL)
                             GROUP BY r.tool),
                cap AS (SELECT q.tool,
                               LEAST(q.free, COALESCE(q.global_limit - COALESCE(r.n, 0), q.free)) AS n
                          FROM quota q LEFT JOIN running r ON r.tool = q.tool),
                head AS (SELECT task_seq, priority, tool FROM jobs
                          WHERE state = 'queued' AND run_after <= $4
                            AND tool IN (SELECT tool FROM cap WHERE n > 0)
                          ORDER BY priority, task_seq LIMIT $7
                          FOR UPDATE SKIP LOCKED),
                ranked AS (SELECT task_seq, priority, tool,
                                  row_number() OVER (PARTITION BY tool ORDER BY priority, task_seq) AS rn
                             FROM head),
                picked AS (SELECT k.task_seq FROM ranked k JOIN cap c ON c.tool = k.tool
                            WHERE k.rn <= c.n
                            ORDER BY k.priority, k.task_seq LIMIT $5)
           UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = $1,
                  lease_token = $2, lease_expires_at = $3, changed_at = $4
             FROM tasks t
            WHERE jobs.task_seq IN (SELECT task_seq FROM picked) AND jobs.state = 'queued'
              AND t.seq = jobs.task_seq
           RETURNING jobs.task_seq AS "task_seq!", t.task_id AS "task_id!", jobs.tool AS "tool!",
                     t.arguments AS "arguments!", t.progress_token AS "progress_token?",
                     jobs.attempt AS "attempt!", jobs.max_attempts AS "max_attempts!",
                     jobs.priority AS "priority!", jobs.lease_token AS "lease_token!""#,
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
