//! SQL for `tasks` and `task_events` (creations are writes of the group
//! commit: `batch.rs`).

use async_trait::async_trait;
use sqlx::SqliteConnection;
use taskbroker_storage::retention::{PurgePlan, json_ids, json_pairs};
use taskbroker_storage::text::{self, TaskEventText, TaskText};
use taskbroker_storage::*;

use crate::{BEGIN_IMMEDIATE, SqliteStore};

#[async_trait]
impl TaskStore for SqliteStore {
    /// One task by id, whoever owns it (the caller checks ownership).
    async fn task_get(&self, task_id: &str) -> Result<Option<TaskRow>, StoreError> {
        let mut conn = self.read.acquire().await?;
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
            r#"SELECT s.seq AS "seq!", s.task_id, s.owner, s.tool, s.arguments, s.status,
                      s.status_message, s.created_at, s.updated_at, s.ttl_ms, s.expires_at,
                      s.poll_interval_ms, s.progress_token, s.result, s.result_kind,
                      s.tool_error AS "tool_error!: bool"
                 FROM tasks t JOIN tasks_as_served s ON s.seq = t.seq
                WHERE t.owner = ? AND t.tool = ? AND t.idempotency_key = ?"#,
            owner,
            tool,
            key
        )
        .fetch_optional(&self.read)
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
            r#"SELECT seq AS "seq!", task_id, owner, tool, arguments, status, status_message,
                      created_at, updated_at, ttl_ms, expires_at, poll_interval_ms,
                      progress_token, result, result_kind, tool_error AS "tool_error!: bool"
                 FROM tasks_as_served
                WHERE owner = ? AND seq < ? AND (expires_at IS NULL OR expires_at > ?)
                ORDER BY seq DESC
                LIMIT CAST(? AS INTEGER)"#,
            owner,
            before,
            now,
            limit
        )
        .fetch_all(&self.read)
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
        let _turn = self.take_turn().await;
        let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
        let current = sqlx::query!(
            r#"SELECT seq AS "seq!", status, updated_at FROM tasks WHERE task_id = ? AND owner = ?"#,
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
            "UPDATE tasks SET status = 'cancelled', status_message = ?, updated_at = ? WHERE seq = ?",
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
                    changed_at = CASE WHEN state = 'queued' THEN ?1 ELSE changed_at END,
                    finished_at = CASE WHEN state = 'queued' THEN ?1 ELSE finished_at END,
                    state = CASE WHEN state = 'queued' THEN 'done' ELSE state END
              WHERE task_seq = ?2 AND state <> 'done'",
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
        let done = sqlx::query!(
            "UPDATE tasks SET status_message = ?, updated_at = MAX(updated_at, ?)
              WHERE seq = ? AND status IN ('working', 'input_required')
                AND EXISTS (SELECT 1 FROM jobs WHERE task_seq = ? AND lease_token = ?)",
            message,
            now,
            task_seq,
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
        let _turn = self.take_turn().await;
        let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
        let done = sqlx::query!(
            "UPDATE tasks SET status_message = ?, updated_at = MAX(updated_at, ?)
              WHERE seq = ? AND status IN ('working', 'input_required')
                AND EXISTS (SELECT 1 FROM jobs WHERE task_seq = ? AND lease_token = ?)",
            message,
            now,
            task_seq,
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
             SELECT seq, task_id, ?, ?, ?, ? FROM tasks WHERE seq = ?",
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
        let done = sqlx::query!("DELETE FROM task_progress WHERE at < ?", before)
            .execute(&mut *self.writer().await?)
            .await?;
        Ok(done.rows_affected())
    }

    /// Keep, archive or delete up to `limit` tasks past their ttl and up
    /// to `limit` kept ones now due, in one transaction (their jobs and
    /// history go with them, by trigger).
    async fn task_purge(&self, now: i64, limit: i64) -> Result<PurgeReport, StoreError> {
        let _turn = self.take_turn().await;
        let mut tx = self.write.begin_with(BEGIN_IMMEDIATE).await?;
        let rows = sqlx::query_as!(
            RetentionCandidate,
            r#"SELECT seq AS "seq!", tool AS "tool!", status AS "status!",
                      updated_at AS "updated_at!", keep_until AS "keep_until?",
                      retain_completed_ms AS "retain_completed_ms?",
                      retain_failed_ms AS "retain_failed_ms?",
                      retain_cancelled_ms AS "retain_cancelled_ms?",
                      archive AS "archive!: bool"
                 FROM (SELECT * FROM tasks
                        WHERE expires_at IS NOT NULL AND expires_at <= ?1 AND keep_until IS NULL
                        LIMIT CAST(?2 AS INTEGER))
               UNION ALL
               SELECT seq, tool, status, updated_at, keep_until, retain_completed_ms,
                      retain_failed_ms, retain_cancelled_ms, archive
                 FROM (SELECT * FROM tasks WHERE keep_until IS NOT NULL AND keep_until <= ?1
                        LIMIT CAST(?2 AS INTEGER))"#,
            now,
            limit
        )
        .fetch_all(&mut *tx)
        .await?;
        let plan = PurgePlan::of(rows, now);
        if !plan.keep.is_empty() {
            let keep = json_pairs(&plan.keep);
            sqlx::query!(
                "UPDATE tasks SET keep_until = k.value ->> 1
                   FROM json_each(?1) k WHERE tasks.seq = k.value ->> 0",
                keep
            )
            .execute(&mut *tx)
            .await?;
        }
        if !plan.archive.is_empty() {
            let archive = json_ids(&plan.archive);
            sqlx::query!(
                "INSERT INTO tasks_archive (seq, task_id, owner, tool, arguments, status,
                                            status_message, created_at, updated_at, ttl_ms,
                                            result, result_kind, tool_error, history, archived_at,
                                            traceparent)
                 SELECT t.seq, t.task_id, t.owner, t.tool, t.arguments, t.status,
                        t.status_message, t.created_at, t.updated_at, t.ttl_ms,
                        t.result, t.result_kind, t.tool_error,
                        (SELECT json_group_array(json_object('from', e.from_status,
                                                             'to', e.to_status,
                                                             'message', e.message,
                                                             'at', e.at) ORDER BY e.id)
                           FROM task_events e WHERE e.task_seq = t.seq),
                        ?2, t.traceparent
                   FROM tasks t WHERE t.seq IN (SELECT value FROM json_each(?1))",
                archive,
                now
            )
            .execute(&mut *tx)
            .await?;
        }
        let gone = plan.gone();
        if !gone.is_empty() {
            let gone = json_ids(&gone);
            sqlx::query!(
                "DELETE FROM tasks WHERE seq IN (SELECT value FROM json_each(?))",
                gone
            )
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
            r#"SELECT seq AS "seq!", tool, status, updated_at, keep_until, retain_completed_ms,
                      retain_failed_ms, retain_cancelled_ms, archive AS "archive!: bool"
                 FROM tasks
                WHERE seq > ?3
                  AND ((expires_at IS NOT NULL AND expires_at <= ?1 AND keep_until IS NULL)
                       OR (keep_until IS NOT NULL AND keep_until <= ?1))
                ORDER BY seq LIMIT CAST(?2 AS INTEGER)"#,
            now,
            limit,
            after_seq
        )
        .fetch_all(&self.read)
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
            r#"SELECT e.id AS "id!", e.task_id, e.from_status, e.to_status, t.owner, e.message, e.at,
                      t.created_at, t.ttl_ms, t.poll_interval_ms, t.tool_error AS "tool_error!: bool",
                      NULL AS "result?: String", NULL AS "result_kind?: String"
                 FROM task_events e JOIN tasks t ON t.seq = e.task_seq
                WHERE t.owner = ? AND e.id > ? ORDER BY e.id LIMIT CAST(? AS INTEGER)"#,
            owner,
            after_id,
            limit
        )
        .fetch_all(&self.read)
        .await?;
        text::rows(rows)
    }

    /// The newest change-feed position (0 when empty).
    async fn task_events_head(&self) -> Result<i64, StoreError> {
        let head =
            sqlx::query_scalar!(r#"SELECT COALESCE(MAX(id), 0) AS "head!: i64" FROM task_events"#)
                .fetch_one(&self.read)
                .await?;
        Ok(head)
    }

    /// How many non-terminal tasks `owner` has.
    async fn task_count_open(&self, owner: &str) -> Result<i64, StoreError> {
        let n = sqlx::query_scalar!(
            r#"SELECT count(*) AS "n!: i64" FROM tasks WHERE owner = ? AND status IN ('working', 'input_required')"#,
            owner
        )
        .fetch_one(&self.read)
        .await?;
        Ok(n)
    }
}

/// Reads of the change feed (see `feed.rs`), on the feed's own connection.
impl SqliteStore {
    /// Progress-feed rows after `after_id`, oldest first.
    pub(crate) async fn task_progress_since(
        &self,
        conn: &mut sqlx::SqliteConnection,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<ProgressEvent>, StoreError> {
        let rows = sqlx::query_as!(
            ProgressEvent,
            r#"SELECT id AS "id!", task_id, progress, total, message FROM task_progress
                WHERE id > ? ORDER BY id LIMIT CAST(? AS INTEGER)"#,
            after_id,
            limit
        )
        .fetch_all(conn)
        .await?;
        Ok(rows)
    }

    /// The newest progress-feed position (0 when empty).
    pub(crate) async fn task_progress_head(&self) -> Result<i64, StoreError> {
        let head = sqlx::query_scalar!(
            r#"SELECT COALESCE(MAX(id), 0) AS "head!: i64" FROM task_progress"#
        )
        .fetch_one(&self.read)
        .await?;
        Ok(head)
    }

    /// Change-feed rows after `after_id`, oldest first.
    pub(crate) async fn task_events_since(
        &self,
        conn: &mut sqlx::SqliteConnection,
        after_id: i64,
        limit: i64,
    ) -> Result<Vec<TaskEvent>, StoreError> {
        let rows = sqlx::query_as!(
            TaskEventText,
            r#"SELECT e.id AS "id!", e.task_id, e.from_status, e.to_status, t.owner, e.message, e.at,
                      t.created_at, t.ttl_ms, t.poll_interval_ms, t.tool_error AS "tool_error!: bool",
                      CASE WHEN e.to_status IN ('completed', 'failed')
                            AND length(CAST(t.result AS BLOB)) <= 4096 THEN t.result END
                        AS "result?: String",
                      CASE WHEN e.to_status IN ('completed', 'failed')
                            AND length(CAST(t.result AS BLOB)) <= 4096 THEN t.result_kind END
                        AS "result_kind?: String"
                 FROM task_events e JOIN tasks t ON t.seq = e.task_seq
                WHERE e.id > ? ORDER BY e.id LIMIT CAST(? AS INTEGER)"#,
            after_id,
            limit
        )
        .fetch_all(conn)
        .await?;
        text::rows(rows)
    }

    /// The cancellations and answers (a change to `cancelled`, or from
    /// `input_required` back to `working`) among the change-feed rows after
    /// `after_id` up to `upto`, oldest first.
    pub(crate) async fn task_control_events_since(
        &self,
        conn: &mut sqlx::SqliteConnection,
        after_id: i64,
        upto: i64,
        limit: i64,
    ) -> Result<Vec<TaskEvent>, StoreError> {
        let rows = sqlx::query_as!(
            TaskEventText,
            r#"SELECT e.id AS "id!", e.task_id, e.from_status, e.to_status, t.owner, e.message, e.at,
                      t.created_at, t.ttl_ms, t.poll_interval_ms, t.tool_error AS "tool_error!: bool",
                      NULL AS "result?: String", NULL AS "result_kind?: String"
                 FROM task_events e JOIN tasks t ON t.seq = e.task_seq
                WHERE e.id > ? AND e.id <= ?
                  AND (e.to_status = 'cancelled'
                       OR (e.to_status = 'working' AND e.from_status = 'input_required'))
                ORDER BY e.id LIMIT CAST(? AS INTEGER)"#,
            after_id,
            upto,
            limit
        )
        .fetch_all(conn)
        .await?;
        text::rows(rows)
    }

    /// The newest change-feed position, read on `conn`.
    pub(crate) async fn task_events_head_on(
        &self,
        conn: &mut sqlx::SqliteConnection,
    ) -> Result<i64, StoreError> {
        let head = sqlx::query_scalar!(
            r#"SELECT COALESCE(MAX(id), 0) AS "head!: i64" FROM task_events AS feed_head"#
        )
        .fetch_one(conn)
        .await?;
        Ok(head)
    }
}

pub(super) async fn task_by_seq(
    conn: &mut sqlx::SqliteConnection,
    seq: i64,
) -> Result<TaskRow, StoreError> {
    let row = sqlx::query_as!(
        TaskText,
        r#"SELECT seq AS "seq!", task_id, owner, tool, arguments, status, status_message,
                  created_at, updated_at, ttl_ms, expires_at, poll_interval_ms,
                  progress_token, result, result_kind, tool_error AS "tool_error!: bool"
             FROM tasks_as_served WHERE seq = ?"#,
        seq
    )
    .fetch_one(conn)
    .await?;
    row.try_into()
}

/// One task by id as served, on `conn` (a pooled connection, or a
/// transaction that reads more beside it).
pub(crate) async fn task_by_id(
    conn: &mut SqliteConnection,
    task_id: &str,
) -> Result<Option<TaskRow>, StoreError> {
    let row = sqlx::query_as!(
        TaskText,
        r#"SELECT seq AS "seq!", task_id, owner, tool, arguments, status, status_message,
                      created_at, updated_at, ttl_ms, expires_at, poll_interval_ms,
                      progress_token, result, result_kind, tool_error AS "tool_error!: bool"
                 FROM tasks_as_served WHERE task_id = ?"#,
        task_id
    )
    .fetch_optional(&mut *conn)
    .await?;
    row.map(TaskRow::try_from).transpose()
}
