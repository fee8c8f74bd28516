//! SQL for `/metrics` and `/readyz`: a few cheap reads.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::PostgresStore;

#[async_trait]
impl MetricsStore for PostgresStore {
    async fn metrics_ping(&self) -> Result<(), StoreError> {
        sqlx::query_scalar!(r#"SELECT 1::int4 AS "one!""#)
            .fetch_one(&self.pool)
            .await?;
        Ok(())
    }

    /// An index-only scan of the partial index `jobs_queued` (queued jobs
    /// only), then one task row per tool by its key.
    async fn metrics_queue_by_tool(&self, now: i64) -> Result<Vec<QueueDepth>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT q.tool AS "tool!", q.depth AS "depth!",
                      COALESCE(t.created_at, $1) AS "oldest_created_at!"
                 FROM (SELECT tool, count(*) AS depth,
                              min(task_seq) FILTER (WHERE run_after <= $1) AS oldest
                         FROM jobs WHERE state = 'queued' GROUP BY tool) AS q
                 LEFT JOIN tasks AS t ON t.seq = q.oldest"#,
            now
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| QueueDepth {
                tool: r.tool,
                depth: r.depth,
                oldest_created_at: r.oldest_created_at,
            })
            .collect())
    }

    /// The workers table has one row per pool ever started (not per task):
    /// small, read whole.
    async fn metrics_worker_counts(&self) -> Result<WorkerCounts, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT state AS "state!", count(*) AS "n!"
                 FROM workers WHERE state IN ('live', 'stopping', 'dead') GROUP BY state"#
        )
        .fetch_all(&self.pool)
        .await?;
        let mut counts = WorkerCounts::default();
        for r in rows {
            match r.state.as_str() {
                "live" => counts.live = r.n,
                "stopping" => counts.stopping = r.n,
                _ => counts.dead = r.n,
            }
        }
        Ok(counts)
    }

    async fn metrics_database_size(&self) -> Result<i64, StoreError> {
        let size = sqlx::query_scalar!(r#"SELECT pg_database_size(current_database()) AS "size!""#)
            .fetch_one(&self.pool)
            .await?;
        Ok(size)
    }

    async fn metrics_schema_versions(&self) -> Result<SchemaVersions, StoreError> {
        // refinery makes its table at run time: no query! macro.
        let applied: Option<i32> =
            sqlx::query_scalar("SELECT MAX(version) FROM refinery_schema_history")
                .fetch_one(&self.pool)
                .await?;
        Ok(SchemaVersions {
            applied: applied.map(i64::from),
            known: crate::migrate::known_version(),
        })
    }
}
