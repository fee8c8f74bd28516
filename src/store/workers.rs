//! SQL for `workers`: registration and heartbeats of worker pools.

use super::{Store, StoreError};

/// A pool announcing itself.
#[derive(Debug, Clone)]
pub struct NewWorker {
    /// `host:pid:random`.
    pub worker_id: String,
    /// OS process id.
    pub pid: i64,
    /// Host name.
    pub host: String,
    /// `embedded` or `process`.
    pub kind: &'static str,
    /// Jobs at once.
    pub concurrency: i64,
    /// Its lease length.
    pub lease_ms: i64,
}

impl Store {
    /// Record a starting pool.
    pub async fn worker_register(&self, w: &NewWorker, now: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO workers (worker_id, pid, host, kind, concurrency, lease_ms, started_at, heartbeat_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            w.worker_id,
            w.pid,
            w.host,
            w.kind,
            w.concurrency,
            w.lease_ms,
            now,
            now
        )
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// The pool is alive and runs `jobs_running` jobs. A pool that others
    /// marked dead (it stalled) comes back to life.
    pub async fn worker_heartbeat(
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
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// `stopping` (after SIGTERM) or `stopped` (on exit).
    pub async fn worker_set_state(
        &self,
        worker_id: &str,
        state: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        let stopped_at = (state == "stopped").then_some(now);
        let running: i64 = if state == "stopped" { 0 } else { -1 };
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
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// Mark pools that missed two leases' worth of heartbeats as dead.
    pub async fn worker_mark_dead(&self, now: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "UPDATE workers SET state = 'dead'
              WHERE state IN ('live', 'stopping') AND heartbeat_at < ? - 2 * lease_ms",
            now
        )
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected())
    }
}
