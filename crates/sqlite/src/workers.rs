//! SQL for `workers`: registration and heartbeats of worker pools.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::SqliteStore;

#[async_trait]
impl WorkerStore for SqliteStore {
    /// Record a starting pool.
    async fn worker_register(&self, w: &NewWorker, now: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO workers (worker_id, pid, host, kind, concurrency, lease_ms, started_at, heartbeat_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            w.worker_id,
            w.pid,
            w.host,
            w.kind.as_str(),
            w.concurrency,
            w.lease_ms,
            now,
            now
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// The pool is alive, and its running jobs hold `jobs_running` slots.
    /// A pool that others
    /// marked dead (it stalled) comes back to life.
    async fn worker_heartbeat(
        &self,
        worker_id: &str,
        jobs_running: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE workers SET heartbeat_at = ?, jobs_running = ?,
                    state = CASE WHEN state = 'dead' THEN 'live' ELSE state END
              WHERE worker_id = ?",
            now,
            jobs_running,
            worker_id
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// The tools the pool claims (a JSON array).
    async fn worker_serves(&self, worker_id: &str, tools: &[String]) -> Result<(), StoreError> {
        let tools = serde_json::Value::from(tools.to_vec()).to_string();
        sqlx::query!(
            "UPDATE workers SET tools = ? WHERE worker_id = ?",
            tools,
            worker_id
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// `stopping` (after SIGTERM) or `stopped` (on exit).
    async fn worker_set_state(
        &self,
        worker_id: &str,
        state: WorkerState,
        now: i64,
    ) -> Result<(), StoreError> {
        let stopped_at = (state == WorkerState::Stopped).then_some(now);
        let running: i64 = if state == WorkerState::Stopped { 0 } else { -1 };
        let state = state.as_str();
        sqlx::query!(
            "UPDATE workers SET state = ?, heartbeat_at = ?, stopped_at = COALESCE(?, stopped_at),
                    jobs_running = CASE WHEN ? >= 0 THEN ? ELSE jobs_running END
              WHERE worker_id = ?",
            state,
            now,
            stopped_at,
            running,
            running,
            worker_id
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// Mark pools that missed two leases' worth of heartbeats as dead.
    async fn worker_mark_dead(&self, now: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "UPDATE workers SET state = 'dead'
              WHERE state IN ('live', 'stopping') AND heartbeat_at < ? - 2 * lease_ms",
            now
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(done.rows_affected())
    }

    /// Gone pools' rows, unless a running job still names them (its lease
    /// runs out first).
    async fn worker_purge_gone(&self, before: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "DELETE FROM workers
              WHERE state IN ('stopped', 'dead') AND COALESCE(stopped_at, heartbeat_at) < ?
                AND NOT EXISTS (SELECT 1 FROM jobs j
                                 WHERE j.lease_owner = workers.worker_id AND j.state = 'running')",
            before
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(done.rows_affected())
    }
}
