//! The SQLite statements of the group commit: a creation, a fenced
//! completion and a claim one at a time, and creations and completions
//! grouped (the two passes, the savepoints and the fan-out are shared:
//! `taskbroker_storage::batch`).
//! A batch opens with `BEGIN IMMEDIATE`, so it takes the write lock first
//! and never has to upgrade; the grouped statements read their rows from
//! one JSON array with `json_each`. A grouped update joins its table to
//! that array by primary key; a filter on an indexed column of the table
//! is written `+column` so the planner cannot start from that index
//! instead (`tasks.status` of every open task, `jobs.state` of every
//! running job) and visit the whole backlog once per array element on
//! every commit: it walks the array and looks each row up by key.

use async_trait::async_trait;
use serde_json::{Value, json};
use sqlx::{Sqlite, SqliteConnection};
use taskbroker_storage::batch::{GroupCommit, GroupedJob};
use taskbroker_storage::text::{self, TaskText};
use taskbroker_storage::{
    ClaimedJob, NewJob, NewTask, StoreError, TaskOutcome, TaskRow, ToolQuota,
};

use crate::tasks::task_by_seq;
use crate::{BEGIN_IMMEDIATE, SqliteStore};

#[async_trait]
impl GroupCommit for SqliteStore {
    type Database = Sqlite;

    /// Inside this process's turn at the write lock, which the caller
    /// (`Storage::write_batch_in`) holds.
    async fn begin_batch(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        Ok(self.write.begin_with(BEGIN_IMMEDIATE).await?)
    }

    /// The statements of one creation (`Write::Create`), inside the caller's
    /// transaction; the row as `tasks_as_served` reads it there.
    async fn create_one(
        conn: &mut sqlx::SqliteConnection,
        new: &NewTask,
        job: Option<NewJob>,
        outcome: Option<&TaskOutcome>,
        now: i64,
    ) -> Result<TaskRow, StoreError> {
        let expires_at = new.ttl_ms.map(|ttl| now.saturating_add(ttl));
        let seq = sqlx::query_scalar!(
            r#"INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at,
                              ttl_ms, expires_at, poll_interval_ms, progress_token, session_id,
                              client_capabilities, idempotency_key, retain_completed_ms,
                              retain_failed_ms, retain_cancelled_ms, archive, traceparent,
                              tracestate)
           VALUES (?, ?, ?, ?, 'working', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
           RETURNING seq"#,
            new.task_id,
            new.owner,
            new.tool,
            new.arguments,
            now,
            now,
            new.ttl_ms,
            expires_at,
            new.poll_interval_ms,
            new.progress_token,
            new.session_id,
            new.client_capabilities,
            new.idempotency_key,
            new.retention.completed_ms,
            new.retention.failed_ms,
            new.retention.cancelled_ms,
            new.retention.archive,
            new.traceparent,
            new.tracestate,
        )
        .fetch_one(&mut *conn)
        .await?;
        if let Some(job) = job {
            let run_after = job.run_after.map_or(now, |at| at.max(now));
            sqlx::query!(
                "INSERT INTO jobs (task_seq, tool, owner, max_attempts, priority, run_after, turn)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6,
                         max(coalesce((SELECT max(turn) + 1 FROM jobs
                                        WHERE priority = ?5 AND owner = ?3
                                          AND state = 'queued' AND run_after <= ?7), 0),
                             coalesce((SELECT max(turn) FROM jobs
                                        WHERE tool = ?2 AND priority = ?5 AND state = 'running'),
                                      (SELECT min(turn) FROM jobs
                                        WHERE tool = ?2 AND priority = ?5 AND state = 'queued'
                                          AND run_after <= ?7), 0)))",
                seq,
                new.tool,
                new.owner,
                job.max_attempts,
                job.priority,
                run_after,
                now
            )
            .execute(&mut *conn)
            .await?;
        }
        if let Some(outcome) = outcome {
            sqlx::query!(
                "UPDATE tasks SET status = ?, status_message = ?, result = ?, result_kind = ?,
                              tool_error = ?, updated_at = ?
              WHERE seq = ?",
                outcome.status.as_str(),
                outcome.status_message,
                outcome.result,
                outcome.result_kind.as_str(),
                outcome.tool_error,
                now,
                seq
            )
            .execute(&mut *conn)
            .await?;
        }
        task_by_seq(conn, seq).await
    }

    /// The statements of one completion (`Write::Complete`), inside the
    /// caller's transaction. `LeaseLost` (and nothing written) when the token
    /// no longer holds the job.
    async fn complete_one(
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

    /// The statement of one claim (`Write::Claim`), inside the group commit's
    /// transaction.
    ///
    /// Each tool may take `min(free, global - running)` jobs (`cap`). The claim
    /// walks the due jobs, highest priority first then oldest, over tools whose cap is above zero
    /// only, reading at most `4 * limit` jobs (the `head`), and takes from it up
    /// to each tool's cap: a tool at its limit is skipped in the index, so it
    /// delays no other tool; each claim takes at least the head's first job, so
    /// every tool with room is reached within a few claims. The running count
    /// of a globally limited tool is read in the same write transaction as the
    /// claim, so the global limit holds whatever the number of processes.
    async fn claim(
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
                head AS (SELECT task_seq, priority, turn, tool FROM jobs
                          WHERE state = 'queued' AND run_after <= ?4
                            AND tool IN (SELECT tool FROM cap WHERE n > 0)
                          ORDER BY priority DESC, turn, task_seq LIMIT CAST(?7 AS INTEGER)),
                ranked AS (SELECT task_seq, priority, turn, tool,
                                  row_number() OVER (PARTITION BY tool ORDER BY priority DESC, turn, task_seq) AS rn
                             FROM head)
           UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_owner = ?1,
                  lease_token = ?2, lease_expires_at = ?3, changed_at = ?4
            WHERE task_seq IN (SELECT k.task_seq FROM ranked k JOIN cap c ON c.tool = k.tool
                                WHERE k.rn <= c.n
                                ORDER BY k.priority DESC, k.turn, k.task_seq LIMIT CAST(?5 AS INTEGER))
           RETURNING task_seq AS "task_seq!",
                     (SELECT task_id FROM tasks WHERE seq = task_seq) AS "task_id!: String",
                     tool AS "tool!: String",
                     (SELECT arguments FROM tasks WHERE seq = task_seq) AS "arguments!: String",
                     (SELECT progress_token FROM tasks WHERE seq = task_seq) AS "progress_token?: String",
                     attempt AS "attempt!", max_attempts AS "max_attempts!", priority AS "priority!",
                     lease_token AS "lease_token!: String",
                     checkpoint AS "checkpoint?: String",
                     (SELECT traceparent FROM tasks WHERE seq = task_seq) AS "traceparent?: String",
                     (SELECT tracestate FROM tasks WHERE seq = task_seq) AS "tracestate?: String",
                     run_after AS "runnable_since!""#,
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
        jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.task_seq));
        Ok(jobs)
    }

    async fn insert_tasks(
        conn: &mut SqliteConnection,
        tasks: Value,
        now: i64,
    ) -> Result<Vec<TaskRow>, StoreError> {
        let tasks = tasks.to_string();
        let rows = sqlx::query_as!(
            TaskText,
            r#"INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at,
                              ttl_ms, expires_at, poll_interval_ms, progress_token, session_id,
                              client_capabilities, idempotency_key, retain_completed_ms,
                              retain_failed_ms, retain_cancelled_ms, archive, traceparent,
                              tracestate)
           SELECT value ->> 'task_id', value ->> 'owner', value ->> 'tool', value ->> 'arguments',
                  'working', ?1, ?1, value ->> 'ttl_ms', value ->> 'expires_at',
                  value ->> 'poll_interval_ms', value ->> 'progress_token', value ->> 'session_id',
                  value ->> 'client_capabilities', value ->> 'idempotency_key',
                  value ->> 'retain_completed_ms', value ->> 'retain_failed_ms',
                  value ->> 'retain_cancelled_ms', value ->> 'archive',
                  value ->> 'traceparent', value ->> 'tracestate'
             FROM json_each(?2) ORDER BY key
           RETURNING seq AS "seq!", task_id AS "task_id!", owner AS "owner!", tool AS "tool!",
                     arguments AS "arguments!", status AS "status!",
                     status_message AS "status_message?", created_at AS "created_at!",
                     updated_at AS "updated_at!", ttl_ms AS "ttl_ms?", expires_at AS "expires_at?",
                     poll_interval_ms AS "poll_interval_ms?", progress_token AS "progress_token?",
                     result AS "result?", result_kind AS "result_kind?",
                     tool_error AS "tool_error!: bool""#,
            now,
            tasks
        )
        .fetch_all(conn)
        .await?;
        text::rows(rows)
    }

    async fn insert_jobs(
        conn: &mut SqliteConnection,
        jobs: &[GroupedJob<'_>],
        now: i64,
    ) -> Result<u64, StoreError> {
        let jobs: Value = jobs
            .iter()
            .map(|j| {
                json!({
                    "seq": j.task_seq,
                    "tool": j.tool,
                    "owner": j.owner,
                    "max_attempts": j.job.max_attempts,
                    "priority": j.job.priority,
                    "run_after": j.job.run_after.map_or(now, |at| at.max(now)),
                })
            })
            .collect();
        let jobs = jobs.to_string();
        let inserted = sqlx::query!(
            "INSERT INTO jobs (task_seq, tool, owner, max_attempts, priority, run_after, turn)
         SELECT c.seq, c.tool, c.owner, c.max_attempts, c.priority, c.run_after,
                max(coalesce((SELECT max(turn) + 1 FROM jobs j
                               WHERE j.priority = c.priority AND j.owner = c.owner
                                 AND j.state = 'queued' AND j.run_after <= ?2), 0),
                    coalesce((SELECT max(turn) FROM jobs j
                               WHERE j.tool = c.tool AND j.priority = c.priority AND j.state = 'running'),
                             (SELECT min(turn) FROM jobs j
                               WHERE j.tool = c.tool AND j.priority = c.priority AND j.state = 'queued'
                                 AND j.run_after <= ?2), 0))
                + c.nth
           FROM (SELECT value ->> 'seq' AS seq, value ->> 'tool' AS tool, value ->> 'owner' AS owner,
                        value ->> 'max_attempts' AS max_attempts, value ->> 'priority' AS priority,
                        value ->> 'run_after' AS run_after,
                        row_number() OVER (PARTITION BY value ->> 'owner', value ->> 'priority'
                                           ORDER BY value ->> 'seq') - 1 AS nth
                   FROM json_each(?1)) AS c",
            jobs,
            now
        )
        .execute(conn)
        .await?;
        Ok(inserted.rows_affected())
    }

    async fn finish_jobs(
        conn: &mut SqliteConnection,
        leases: &[(i64, &str)],
        now: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let leases: Value = leases
            .iter()
            .map(|(seq, token)| json!({ "seq": seq, "token": token }))
            .collect();
        let leases = leases.to_string();
        Ok(sqlx::query_scalar!(
        r#"UPDATE jobs SET state = 'done', lease_token = NULL, lease_expires_at = NULL,
                  finished_at = ?1, changed_at = ?1, last_error = NULL
             FROM (SELECT value ->> 'seq' AS seq, value ->> 'token' AS token FROM json_each(?2)) AS c
            WHERE jobs.task_seq = c.seq AND jobs.lease_token = c.token AND +jobs.state = 'running'
           RETURNING task_seq AS "task_seq!""#,
            now,
            leases
        )
        .fetch_all(conn)
        .await?)
    }

    async fn record_outcomes(
        conn: &mut SqliteConnection,
        outcomes: Value,
        now: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let outcomes = outcomes.to_string();
        Ok(sqlx::query_scalar!(
            r#"UPDATE tasks SET status = c.status, status_message = c.message, result = c.result,
                  result_kind = c.kind, tool_error = c.tool_error,
                  updated_at = MAX(updated_at, ?1)
             FROM (SELECT value ->> 'seq' AS seq, value ->> 'status' AS status,
                          value ->> 'message' AS message, value ->> 'result' AS result,
                          value ->> 'kind' AS kind, value ->> 'tool_error' AS tool_error
                     FROM json_each(?2)) AS c
            WHERE tasks.seq = c.seq AND +tasks.status IN ('working', 'input_required')
           RETURNING seq AS "seq!""#,
            now,
            outcomes
        )
        .fetch_all(conn)
        .await?)
    }
}
