//! SQL for `workers`: registration and heartbeats of worker pools.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::PostgresStore;

#[async_trait]
impl WorkerStore for PostgresStore {
    /// Record a starting pool.
    async fn worker_register(&self, w: &NewWorker, now: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO workers (worker_id, pid, host, kind, concurrency, lease_ms, started_at, heartbeat_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            w.worker_id,
            w.pid,
            w.host,
            w.kind.as_str(),
            w.concurrency,
            w.lease_ms,
            now,
            now
        )
        .execute(&self.pool)
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
            "UPDATE workers SET heartbeat_at = $1, jobs_running = $2,
                    state = CASE WHEN state = 'dead' THEN 'live' ELSE state END
              WHERE worker_id = $3",
            now,
            jobs_running,
            worker_id
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The tools the pool claims.
    async fn worker_serves(&self, worker_id: &str, tools: &[String]) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE workers SET tools = $1 WHERE worker_id = $2",
            tools,
            worker_id
        )
        .execute(&self.pool)
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
            "UPDATE workers SET state = $1, heartbeat_at = $2, stopped_at = COALESCE($3, stopped_at),
                    jobs_running = CASE WHEN $4::bigint >= 0 THEN $4 ELSE jobs_running END
              WHERE worker_id = $5",
            state,
            now,
            stopped_at,
            running,
            worker_id
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Mark pools that missed two leases' worth of heartbeats as dead.
    async fn worker_mark_dead(&self, now: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "UPDATE workers SET state = 'dead'
              WHERE state IN ('live', 'stopping') AND heartbeat_at < $1 - 2 * lease_ms",
            now
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Gone pools' rows, unless a running job still names them (its lease
    /// runs out first).
    async fn worker_purge_gone(&self, before: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "DELETE FROM workers
              WHERE state IN ('stopped', 'dead') AND COALESCE(stopped_at, heartbeat_at) < $1
                AND NOT EXISTS (SELECT 1 FROM jobs j
                                 WHERE j.lease_owner = workers.worker_id AND j.state = 'running')",
            before
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
