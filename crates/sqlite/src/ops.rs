//! SQL for operators: `taskbroker stats`, `workers`, `tasks list --db`
//! and `backup`. Reads only, on the read pool; each count is an index
//! search (see `migrations/sqlite/V11__ops_indexes.sql`).

use std::path::Path;

use async_trait::async_trait;
use sqlx::Row;
use taskbroker_storage::ops::*;
use taskbroker_storage::text;
use taskbroker_storage::*;

use crate::SqliteStore;

/// `stats!(run Row, SQL, args)` is `query_as!` of that SQL;
/// `stats!(explain Row, SQL, args)` is its `EXPLAIN QUERY PLAN`: the plan
/// checked is the plan of the very text that runs.
macro_rules! stats {
    (run $row:ident, $sql:literal $(, $arg:expr)*) => {
        sqlx::query_as!($row, $sql $(, $arg)*)
    };
    (explain $row:ident, $sql:literal $(, $arg:expr)*) => {
        sqlx::query(concat!("EXPLAIN QUERY PLAN ", $sql)) $(.bind($arg))*
    };
}

/// Queued jobs by tool: the `jobs_queued` index holds every column read.
macro_rules! queued_by_tool {
    ($mode:ident) => {
        stats!($mode ToolQueue,
            r#"SELECT tool AS "tool!", count(*) AS "jobs!: i64", min(run_after) AS "oldest_since!: i64"
                 FROM jobs WHERE state = 'queued' GROUP BY tool ORDER BY tool"#)
    };
}

/// Running jobs by tool: the `jobs_running_tool` index.
macro_rules! running_by_tool {
    ($mode:ident) => {
        stats!($mode ToolRunning,
            r#"SELECT tool AS "tool!", count(*) AS "jobs!: i64"
                 FROM jobs WHERE state = 'running' GROUP BY tool ORDER BY tool"#)
    };
}

/// Unfinished tasks by status: the `tasks_open_status` index.
macro_rules! open_by_status {
    ($mode:ident) => {
        stats!($mode StatusCountText,
            r#"SELECT status AS "status!", count(*) AS "tasks!: i64"
                 FROM tasks WHERE status IN ('working', 'input_required') GROUP BY status"#)
    };
}

/// Finished tasks by status since an hour and a minute: the
/// `tasks_finished` index.
macro_rules! finished_since {
    ($mode:ident, $minute:expr, $hour:expr) => {
        stats!($mode FinishedText,
            r#"SELECT status AS "status!",
                      sum(CASE WHEN updated_at >= ? THEN 1 ELSE 0 END) AS "last_minute!: i64",
                      count(*) AS "last_hour!: i64"
                 FROM tasks
                WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at >= ?
                GROUP BY status"#, $minute, $hour)
    };
}

/// Failed tasks by tool since an hour, with the latest one's message
/// (SQLite takes the bare column from the row of `max`): the
/// `tasks_finished` index, then the failed rows.
macro_rules! failures_since {
    ($mode:ident, $hour:expr) => {
        stats!($mode ToolFailures,
            r#"SELECT tool AS "tool!", count(*) AS "failed!: i64", max(updated_at) AS "last_at!: i64",
                      status_message AS last_message
                 FROM tasks
                WHERE status IN ('completed', 'failed', 'cancelled') AND status = 'failed'
                  AND updated_at >= ?
                GROUP BY tool ORDER BY tool"#, $hour)
    };
}

/// Finished tasks by tool since an hour and a minute (throughput): the
/// `tasks_finished` index holds every column read (V12).
macro_rules! finished_by_tool {
    ($mode:ident, $minute:expr, $hour:expr) => {
        stats!($mode ToolFinished,
            r#"SELECT tool AS "tool!",
                      sum(CASE WHEN updated_at >= ? THEN 1 ELSE 0 END) AS "last_minute!: i64",
                      count(*) AS "last_hour!: i64"
                 FROM tasks
                WHERE status IN ('completed', 'failed', 'cancelled') AND updated_at >= ?
                GROUP BY tool ORDER BY tool"#, $minute, $hour)
    };
}

#[async_trait]
impl OpsStore for SqliteStore {
    /// Every count in one read transaction: one snapshot.
    async fn ops_stats(&self, now: i64) -> Result<OpsStats, StoreError> {
        let (minute, hour) = (now - MINUTE_MS, now - HOUR_MS);
        let mut tx = self.read.begin().await?;
        let queued = queued_by_tool!(run).fetch_all(&mut *tx).await?;
        let running = running_by_tool!(run).fetch_all(&mut *tx).await?;
        let open = status_counts(open_by_status!(run).fetch_all(&mut *tx).await?)?;
        let finished = text::rows(
            finished_since!(run, minute, hour)
                .fetch_all(&mut *tx)
                .await?,
        )?;
        let failures = failures_since!(run, hour).fetch_all(&mut *tx).await?;
        let finished_by_tool = finished_by_tool!(run, minute, hour)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(OpsStats {
            now,
            queued,
            running,
            open,
            finished,
            failures,
            finished_by_tool,
        })
    }

    /// Newest first; running jobs counted from `jobs` (the row's own count
    /// lags by up to a heartbeat).
    async fn ops_workers(&self) -> Result<Vec<WorkerInfo>, StoreError> {
        let rows = sqlx::query_as!(
            WorkerText,
            r#"SELECT w.worker_id, w.kind, w.state, w.host, w.pid, w.concurrency, w.lease_ms,
                      w.started_at, w.heartbeat_at, w.stopped_at,
                      (SELECT count(*) FROM jobs j
                        WHERE j.lease_owner = w.worker_id AND j.state = 'running') AS "jobs_running!: i64"
                 FROM workers w
                ORDER BY w.started_at DESC, w.worker_id"#
        )
        .fetch_all(&self.read)
        .await?;
        text::rows(rows)
    }

    /// Keyset pages newest first: by `tasks_owner_seq` for one owner, by
    /// `tasks_open_status` for unfinished statuses only, else backwards
    /// along the row key.
    async fn ops_task_page(
        &self,
        filter: &TaskFilter,
        before_seq: Option<i64>,
        limit: i64,
    ) -> Result<Vec<TaskSummary>, StoreError> {
        let before = before_seq.unwrap_or(i64::MAX);
        let statuses = status_list(&filter.statuses);
        let tool = filter.tool.as_deref();
        let rows =
            match filter.owner.as_deref() {
                None if filter.only_open() => sqlx::query_as!(
                    TaskSummaryText,
                    r#"SELECT seq AS "seq!", task_id, status, tool, owner, created_at, updated_at,
                              status_message, priority AS "priority?: i64",
                              starts_at AS "starts_at?: i64"
                         FROM tasks_as_served
                        WHERE status IN ('working', 'input_required') AND seq < ?
                          AND instr(?, ',' || status || ',') > 0
                          AND (? IS NULL OR tool = ?)
                        ORDER BY seq DESC
                        LIMIT CAST(? AS INTEGER)"#,
                    before,
                    statuses,
                    tool,
                    tool,
                    limit
                )
                .fetch_all(&self.read)
                .await?,
                Some(owner) => sqlx::query_as!(
                    TaskSummaryText,
                    r#"SELECT seq AS "seq!", task_id, status, tool, owner, created_at, updated_at,
                              status_message, priority AS "priority?: i64",
                              starts_at AS "starts_at?: i64"
                         FROM tasks_as_served
                        WHERE owner = ? AND seq < ?
                          AND (? = '' OR instr(?, ',' || status || ',') > 0)
                          AND (? IS NULL OR tool = ?)
                        ORDER BY seq DESC
                        LIMIT CAST(? AS INTEGER)"#,
                    owner,
                    before,
                    statuses,
                    statuses,
                    tool,
                    tool,
                    limit
                )
                .fetch_all(&self.read)
                .await?,
                None => sqlx::query_as!(
                    TaskSummaryText,
                    r#"SELECT seq AS "seq!", task_id, status, tool, owner, created_at, updated_at,
                              status_message, priority AS "priority?: i64",
                              starts_at AS "starts_at?: i64"
                         FROM tasks_as_served
                        WHERE seq < ?
                          AND (? = '' OR instr(?, ',' || status || ',') > 0)
                          AND (? IS NULL OR tool = ?)
                        ORDER BY seq DESC
                        LIMIT CAST(? AS INTEGER)"#,
                    before,
                    statuses,
                    statuses,
                    tool,
                    tool,
                    limit
                )
                .fetch_all(&self.read)
                .await?,
            };
        text::rows(rows)
    }

    /// One read transaction: one snapshot of the task and its history,
    /// each part an index search by the task's row key.
    async fn ops_task_history(&self, task_id: &str) -> Result<Option<TaskHistory>, StoreError> {
        let mut tx = self.read.begin().await?;
        let task = crate::tasks::task_by_id(&mut tx, task_id).await?;
        let Some(task) = task else {
            return Ok(None);
        };
        let job = sqlx::query_as!(
            JobInfo,
            r#"SELECT state, attempt, max_attempts, priority, run_after, lease_owner,
                      lease_expires_at, cancel_requested AS "cancel_requested: bool",
                      last_error, finished_at
                 FROM jobs WHERE task_seq = ?"#,
            task.seq
        )
        .fetch_optional(&mut *tx)
        .await?;
        let mut events = sqlx::query_as!(
            StatusChangeText,
            r#"SELECT id AS "id!", from_status, to_status, message, at
                 FROM task_events WHERE task_seq = ? ORDER BY id DESC LIMIT CAST(? AS INTEGER)"#,
            task.seq,
            HISTORY_LIMIT
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut job_events = sqlx::query_as!(
            JobEventInfo,
            r#"SELECT id AS "id!", attempt, event, worker, reason, at
                 FROM job_events WHERE task_seq = ? ORDER BY id DESC LIMIT CAST(? AS INTEGER)"#,
            task.seq,
            HISTORY_LIMIT
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut progress = sqlx::query_as!(
            ProgressReport,
            r#"SELECT id AS "id!", progress, total, message, at
                 FROM task_progress WHERE task_seq = ? ORDER BY id DESC LIMIT CAST(? AS INTEGER)"#,
            task.seq,
            PROGRESS_LIMIT
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut messages = sqlx::query_as!(
            MessageInfo,
            r#"SELECT request_id, method, params, state, response, created_at, answered_at
                 FROM task_messages WHERE task_seq = ? ORDER BY id DESC LIMIT CAST(? AS INTEGER)"#,
            task.seq,
            HISTORY_LIMIT
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        // Read newest first (the limits keep the latest), shown oldest first.
        events.reverse();
        job_events.reverse();
        progress.reverse();
        messages.reverse();
        Ok(Some(TaskHistory {
            task,
            job,
            events: text::rows(events)?,
            job_events,
            progress,
            messages,
        }))
    }

    async fn ops_stats_plans(&self, now: i64) -> Result<Vec<QueryPlan>, StoreError> {
        let (minute, hour) = (now - MINUTE_MS, now - HOUR_MS);
        let mut conn = self.read.acquire().await?;
        let mut plans = Vec::new();
        for (name, query) in [
            ("queued_by_tool", queued_by_tool!(explain)),
            ("running_by_tool", running_by_tool!(explain)),
            ("open_by_status", open_by_status!(explain)),
            ("finished_since", finished_since!(explain, minute, hour)),
            ("failures_since", failures_since!(explain, hour)),
            ("finished_by_tool", finished_by_tool!(explain, minute, hour)),
        ] {
            let rows = query.fetch_all(&mut *conn).await?;
            let lines = rows
                .iter()
                .map(|r| r.try_get::<String, _>("detail"))
                .collect::<Result<Vec<_>, _>>()?;
            plans.push(QueryPlan {
                name,
                plan: lines.join("\n"),
            });
        }
        Ok(plans)
    }
}

impl SqliteStore {
    /// A consistent copy of the whole database in a new file `to` (it must
    /// not exist), taken while others read and write (`VACUUM INTO`: one
    /// read transaction, so writers go on in WAL mode), then pushed to
    /// disk.
    pub async fn backup_into(&self, to: &Path) -> Result<(), StoreError> {
        let target = to.to_str().ok_or_else(|| StoreError::Open {
            path: to.display().to_string(),
            reason: "is not valid UTF-8 (SQLite takes the backup's name as text)".into(),
        })?;
        sqlx::query!("VACUUM INTO ?", target)
            .execute(&self.read)
            .await?;
        let file = std::fs::File::open(to).map_err(StoreError::db)?;
        file.sync_all().map_err(StoreError::db)?;
        Ok(())
    }
}
