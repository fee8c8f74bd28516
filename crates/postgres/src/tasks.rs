//! SQL for `tasks` and `task_events` (creations are writes of the group
//! commit: `batch.rs`).

use async_trait::async_trait;
use sqlx::PgConnection;
use taskbroker_storage::retention::PurgePlan;
use taskbroker_storage::text::{self, TaskEventText, TaskText};
use taskbroker_storage::*;

use crate::PostgresStore;

#[async_trait]
impl TaskStore for PostgresStore {
    /// One task by id, whoever owns it (the caller checks ownership).
    async fn task_get(&self, task_id: &str) -> Result<Option<TaskRow>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        task_by_id(&mut conn, task_id).await
    }

    /// The task of an idempotency key (the unique index finds it).
    async fn task_by_idempotency_key(
        &self,
        owner: &str,
        tool: &str,
        key: &str,
    ) -> Result<Option<TaskRow>, StoreError> {
        let row = sqlx::query_as!(
            TaskText,
            r#"SELECT s.seq AS "seq!", s.task_id AS "task_id!", s.owner AS "owner!",
                      s.tool AS "tool!", s.arguments AS "arguments!", s.status AS "status!",
                      s.status_message, s.created_at AS "created_at!",
                      s.updated_at AS "updated_at!", s.ttl_ms, s.expires_at, s.poll_interval_ms,
                      s.progress_token, s.result, s.result_kind, s.tool_error AS "tool_error!"
                 FROM tasks t JOIN tasks_as_served s ON s.seq = t.seq
                WHERE t.owner = $1 AND t.tool = $2 AND t.idempotency_key = $3"#,
            owner,
            tool,
            key
        )
        .fetch_optional(&self.pool)
        .await?;
        row.map(TaskRow::try_from).transpose()
    }

    /// A page of `owner`'s unexpired tasks, newest first, strictly older than
    /// `before_seq` when given. Keyset pagination: cost does not grow with
    /// the page number.
    async fn task_list_page(
        &self,
        owner: &str,
        before_seq: Option<i64>,
        limit: i64,
        now: i64,
    ) -> Result<Vec<TaskRow>, StoreError> {
        let before = before_seq.unwrap_or(i64::MAX);
        let rows = sqlx::query_as!(
            TaskText,
            r#"SELECT seq AS "seq!", task_id AS "task_id!", owner AS "owner!", tool AS "tool!",
                      arguments AS "arguments!", status AS "status!", status_message,
                      created_at AS "created_at!", updated_at AS "updated_at!", ttl_ms, expires_at,
                      poll_interval_ms, progress_token, result, result_kind,
                      tool_error AS "tool_error!"
                 FROM tasks_as_served
                WHERE owner = $1 AND seq < $2 AND (expires_at IS NULL OR expires_at > $3)
                ORDER BY seq DESC
                LIMIT $4"#,
            owner,
            before,
            now,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        text::rows(rows)
    }

    /// Cancel a non-terminal task of `owner` and ask its job to stop, in one
    /// transaction (T-21: cancelled before the response is sent).
    async fn task_cancel(
        &self,
        task_id: &str,
        owner: &str,
        message: &str,
        now: i64,
    ) -> Result<CancelOutcome, StoreError> {
        let mut tx = self.pool.begin().await?;
        // The job's row before the task's, as a completion locks them (the
        // crate doc's row order); then the task as it is now.
        sqlx::query!(
            "SELECT task_seq FROM jobs
              WHERE task_seq = (SELECT seq FROM tasks WHERE task_id = $1 AND owner = $2)
                FOR UPDATE",
            task_id,
            owner
        )
        .fetch_optional(&mut *tx)
        .await?;
        let current = sqlx::query!(
            "SELECT seq, status, updated_at FROM tasks WHERE task_id = $1 AND owner = $2 FOR UPDATE",
            task_id,
            owner
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some(current) = current else {
            return Ok(CancelOutcome::NotFound);
        };
        let status = text::status("tasks.status", &current.status)?;
        if status.is_terminal() {
            return Ok(CancelOutcome::Terminal(status));
        }
        let at = now.max(current.updated_at);
        sqlx::query!(
            "UPDATE tasks SET status = 'cancelled', status_message = $1, updated_at = $2 WHERE seq = $3",
            message,
            at,
            current.seq
        )
        .execute(&mut *tx)
        .await?;
        // A queued job is finished here; a running one is told to stop and
        // its worker finishes it.
        sqlx::query!(
            "UPDATE jobs SET cancel_requested = 1,
                    last_error = CASE WHEN state = 'queued' THEN 'cancelled while queued' ELSE last_error END,
                    changed_at = CASE WHEN state = 'queued' THEN $1 ELSE changed_at END,
                    finished_at = CASE WHEN state = 'queued' THEN $1 ELSE finished_at END,
                    state = CASE WHEN state = 'queued' THEN 'done' ELSE state END
              WHERE task_seq = $2 AND state <> 'done'",
            at,
            current.seq
        )
        .execute(&mut *tx)
        .await?;
        let row = task_by_seq(&mut tx, current.seq).await?;
        tx.commit().await?;
        Ok(CancelOutcome::Cancelled(Box::new(row)))
    }

    /// Set the status message of a task that is still running, if the
    /// caller still holds the job's lease.
    async fn task_set_status_message(
        &self,
        task_seq: i64,
        lease_token: &str,
        message: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        // One statement: the job's row is locked first (FOR SHARE), so a
        // requeue of the job either committed before (its lease is gone
        // here) or waits for this one.
        let done = sqlx::query!(
            "WITH lease AS (SELECT 1 FROM jobs WHERE task_seq = $3 AND lease_token = $4 FOR SHARE)
             UPDATE tasks SET status_message = $1, updated_at = GREATEST(updated_at, $2)
              WHERE seq = $3 AND status IN ('working', 'input_required')
                AND EXISTS (SELECT 1 FROM lease)",
            message,
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

    /// Record progress of a running task (its statusMessage shows it, and
    /// the progress feed carries it to waiting clients), if the caller still
    /// holds the job's lease and the task is not terminal.
    async fn task_record_progress(
        &self,
        task_seq: i64,
        lease_token: &str,
        progress: f64,
        total: Option<f64>,
        message: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        // The job's row, then the task's, then the progress row, whose
        // insert takes the feed lock (held to the commit): it comes last,
        // so no transaction holds the lock while it waits for a row.
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query!(
            "WITH lease AS (SELECT 1 FROM jobs WHERE task_seq = $3 AND lease_token = $4 FOR SHARE)
             UPDATE tasks SET status_message = $1, updated_at = GREATEST(updated_at, $2)
              WHERE seq = $3 AND status IN ('working', 'input_required')
                AND EXISTS (SELECT 1 FROM lease)",
            message,
            now,
            task_seq,
            lease_token
        )
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            tx.rollback().await?;
            return Err(StoreError::LeaseLost);
        }
        sqlx::query!(
            "INSERT INTO task_progress (task_seq, task_id, progress, total, message, at)
             SELECT seq, task_id, $1, $2, $3, $4 FROM tasks WHERE seq = $5",
            progress,
            total,
            message,
            now,
            task_seq
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Delete progress rows older than `before` (they were delivered or
    /// nobody waited).
    async fn task_progress_prune(&self, before: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!("DELETE FROM task_progress WHERE at < $1", before)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Keep, archive or delete up to `limit` tasks past their ttl and up
    /// to `limit` kept ones now due, in one transaction (their jobs and
    /// history go with them, by trigger).
    async fn task_purge(&self, now: i64, limit: i64) -> Result<PurgeReport, StoreError> {
        // Deleting a task deletes its job and its requests (by trigger):
        // their rows are locked first, in the crate doc's row order, then
        // the tasks, read again under their locks (a purge beside this one
        // has taken some of them, a completion has moved others).
        let mut tx = self.pool.begin().await?;
        let seqs = sqlx::query_scalar!(
            r#"(SELECT seq AS "seq!" FROM tasks
                 WHERE expires_at IS NOT NULL AND expires_at <= $1 AND keep_until IS NULL
                 LIMIT $2)
               UNION ALL
               (SELECT seq FROM tasks WHERE keep_until IS NOT NULL AND keep_until <= $1
                 LIMIT $2)"#,
            now,
            limit
        )
        .fetch_all(&mut *tx)
        .await?;
        if seqs.is_empty() {
            tx.rollback().await?;
            return Ok(PurgeReport::default());
        }
        sqlx::query!(
            "SELECT task_seq FROM jobs WHERE task_seq = ANY($1) ORDER BY task_seq FOR UPDATE",
            &seqs
        )
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query!(
            "SELECT id FROM task_messages WHERE task_seq = ANY($1) AND state = 'pending'
              ORDER BY id FOR UPDATE",
            &seqs
        )
        .fetch_all(&mut *tx)
        .await?;
        let rows = sqlx::query_as!(
            RetentionCandidate,
            r#"SELECT seq, tool, status, updated_at, keep_until, retain_completed_ms,
                      retain_failed_ms, retain_cancelled_ms, archive
                 FROM tasks
                WHERE seq = ANY($2)
                  AND ((expires_at IS NOT NULL AND expires_at <= $1 AND keep_until IS NULL)
                       OR (keep_until IS NOT NULL AND keep_until <= $1))
                ORDER BY seq FOR UPDATE"#,
            now,
            &seqs
        )
        .fetch_all(&mut *tx)
        .await?;
        let plan = PurgePlan::of(rows, now);
        if !plan.keep.is_empty() {
            let (seqs, until): (Vec<i64>, Vec<i64>) = plan.keep.iter().copied().unzip();
            sqlx::query!(
                "UPDATE tasks SET keep_until = k.until
                   FROM unnest($1::bigint[], $2::bigint[]) AS k(seq, until)
                  WHERE tasks.seq = k.seq",
                &seqs,
                &until
            )
            .execute(&mut *tx)
            .await?;
        }
        if !plan.archive.is_empty() {
            sqlx::query!(
                "INSERT INTO tasks_archive (seq, task_id, owner, tool, arguments, status,
                                            status_message, created_at, updated_at, ttl_ms,
                                            result, result_kind, tool_error, history, archived_at,
                                            traceparent)
                 SELECT t.seq, t.task_id, t.owner, t.tool, t.arguments, t.status,
                        t.status_message, t.created_at, t.updated_at, t.ttl_ms,
                        t.result, t.result_kind, t.tool_error,
                        COALESCE((SELECT jsonb_agg(jsonb_build_object('from', e.from_status,
                                                                      'to', e.to_status,
                                                                      'message', e.message,
                                                                      'at', e.at) ORDER BY e.id)
                                    FROM task_events e WHERE e.task_seq = t.seq), '[]'::jsonb),
                        $2, t.traceparent
                   FROM tasks t WHERE t.seq = ANY($1)",
                &plan.archive,
                now
            )
            .execute(&mut *tx)
            .await?;
        }
        let gone = plan.gone();
        if !gone.is_empty() {
            sqlx::query!("DELETE FROM tasks WHERE seq = ANY($1)", &gone)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(plan.report())
    }

    /// Read only: the tasks a purge at `now` would look at, in row order.
    async fn task_purge_candidates(
        &self,
        now: i64,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<RetentionCandidate>, StoreError> {
        let rows = sqlx::query_as!(
            RetentionCandidate,
            r#"SELECT seq, tool, status, updated_at, keep_until, retain_completed_ms,
                      retain_failed_ms, retain_cancelled_ms, archive
                 FROM tasks
                WHERE seq > $3
                  AND ((expires_at IS NOT NULL AND expires_at <= $1 AND keep_until IS NULL)
                       OR (keep_until IS NOT NULL AND keep_until <= $1))
                ORDER BY seq LIMIT $2"#,
            now,
            limit,
            after_seq
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// The changes of `owner`'s tasks after feed position `after_id`, oldest
    /// first: what a session's GET stream missed (resumption).
    async fn task_events_for_owner_since(
        &self,
        owner: &str,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<TaskEvent>, StoreError> {
        let rows = sqlx::query_as!(
            TaskEventText,
            r#"SELECT e.id, e.task_id, e.from_status, e.to_status, t.owner, e.message, e.at,
                      t.created_at, t.ttl_ms, t.poll_interval_ms, t.tool_error,
                      NULL::text AS result, NULL::text AS result_kind
                 FROM task_events e JOIN tasks t ON t.seq = e.task_seq
                WHERE t.owner = $1 AND e.id > $2 ORDER BY e.id LIMIT $3"#,
            owner,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        text::rows(rows)
    }

    /// The newest change-feed position (0 when empty).
    async fn task_events_head(&self) -> Result<i64, StoreError> {
        let head =
            sqlx::query_scalar!(r#"SELECT COALESCE(MAX(id), 0) AS "head!" FROM task_events"#)
                .fetch_one(&self.pool)
                .await?;
        Ok(head)
    }

    /// How many non-terminal tasks `owner` has.
    async fn task_count_open(&self, owner: &str) -> Result<i64, StoreError> {
        let n = sqlx::query_scalar!(
            r#"SELECT count(*) AS "n!" FROM tasks WHERE owner = $1 AND status IN ('working', 'input_required')"#,
            owner
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
}

/// Reads of the change feed (see `feed.rs`).
impl PostgresStore {
    /// Progress-feed rows after `after_id`, oldest first.
    pub(crate) async fn task_progress_since(
        &self,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<ProgressEvent>, StoreError> {
        let rows = sqlx::query_as!(
            ProgressEvent,
            "SELECT id, task_id, progress, total, message FROM task_progress
              WHERE id > $1 ORDER BY id LIMIT $2",
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    /// The newest progress-feed position (0 when empty).
    pub(crate) async fn task_progress_head(&self) -> Result<i64, StoreError> {
        let head =
            sqlx::query_scalar!(r#"SELECT COALESCE(MAX(id), 0) AS "head!" FROM task_progress"#)
                .fetch_one(&self.pool)
                .await?;
        Ok(head)
    }

    /// Change-feed rows after `after_id`, oldest first.
    pub(crate) async fn task_events_since(
        &self,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<TaskEvent>, StoreError> {
        let rows = sqlx::query_as!(
            TaskEventText,
            r#"SELECT e.id, e.task_id, e.from_status, e.to_status, t.owner, e.message, e.at,
                      t.created_at, t.ttl_ms, t.poll_interval_ms, t.tool_error,
                      CASE WHEN e.to_status IN ('completed', 'failed')
                            AND octet_length(t.result) <= 4096 THEN t.result END AS result,
                      CASE WHEN e.to_status IN ('completed', 'failed')
                            AND octet_length(t.result) <= 4096 THEN t.result_kind END AS result_kind
                 FROM task_events e JOIN tasks t ON t.seq = e.task_seq
                WHERE e.id > $1 ORDER BY e.id LIMIT $2"#,
            after_id,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        text::rows(rows)
    }

    /// The cancellations and answers (a change to `cancelled`, or from
    /// `input_required` back to `working`) among the change-feed rows after
    /// `after_id` up to `upto`, oldest first.
    pub(crate) async fn task_control_events_since(
        &self,
        after_id: i64,
        upto: i64,
        limit: i64,
    ) -> Result<Vec<TaskEvent>, StoreError> {
        let rows = sqlx::query_as!(
            TaskEventText,
            r#"SELECT e.id, e.task_id, e.from_status, e.to_status, t.owner, e.message, e.at,
                      t.created_at, t.ttl_ms, t.poll_interval_ms, t.tool_error,
                      NULL::text AS result, NULL::text AS result_kind
                 FROM task_events e JOIN tasks t ON t.seq = e.task_seq
                WHERE e.id > $1 AND e.id <= $2
                  AND (e.to_status = 'cancelled'
                       OR (e.to_status = 'working' AND e.from_status = 'input_required'))
                ORDER BY e.id LIMIT $3"#,
            after_id,
            upto,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        text::rows(rows)
    }
}

/// A task as served (`tasks_as_served`).
pub(super) async fn task_by_seq(conn: &mut PgConnection, seq: i64) -> Result<TaskRow, StoreError> {
    let row = sqlx::query_as!(
        TaskText,
        r#"SELECT seq AS "seq!", task_id AS "task_id!", owner AS "owner!", tool AS "tool!",
                  arguments AS "arguments!", status AS "status!", status_message,
                  created_at AS "created_at!", updated_at AS "updated_at!", ttl_ms, expires_at,
                  poll_interval_ms, progress_token, result, result_kind,
                      tool_error AS "tool_error!"
             FROM tasks_as_served WHERE seq = $1"#,
        seq
    )
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// One task by id as served, on `conn` (a pooled connection, or a
/// transaction that reads more beside it).
pub(crate) async fn task_by_id(
    conn: &mut PgConnection,
    task_id: &str,
) -> Result<Option<TaskRow>, StoreError> {
    let row = sqlx::query_as!(
        TaskText,
        r#"SELECT seq AS "seq!", task_id AS "task_id!", owner AS "owner!", tool AS "tool!",
                      arguments AS "arguments!", status AS "status!", status_message,
                      created_at AS "created_at!", updated_at AS "updated_at!", ttl_ms, expires_at,
                      poll_interval_ms, progress_token, result, result_kind,
                      tool_error AS "tool_error!"
                 FROM tasks_as_served WHERE task_id = $1"#,
        task_id
    )
    .fetch_optional(&mut *conn)
    .await?;
    row.map(TaskRow::try_from).transpose()
}
