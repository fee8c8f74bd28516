//! SQL for `/metrics` and `/readyz`: a few cheap reads on the read pool.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::SqliteStore;

#[async_trait]
impl MetricsStore for SqliteStore {
    async fn metrics_ping(&self) -> Result<(), StoreError> {
        sqlx::query_scalar!(r#"SELECT 1 AS "one!: i64""#)
            .fetch_one(&self.read)
            .await?;
        Ok(())
    }

    /// Walks the partial index `jobs_queued` (queued jobs only: finished
    /// ones cost nothing), then one task row per tool by its key.
    async fn metrics_queue_by_tool(&self, now: i64) -> Result<Vec<QueueDepth>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT q.tool AS "tool!: String", q.depth AS "depth!: i64",
                      coalesce(t.created_at, ?1) AS "oldest_created_at!: i64"
                 FROM (SELECT tool, count(*) AS depth,
                              min(task_seq) FILTER (WHERE run_after <= ?1) AS oldest
                         FROM jobs WHERE state = 'queued' GROUP BY tool) q
                 LEFT JOIN tasks t ON t.seq = q.oldest"#,
            now
        )
        .fetch_all(&self.read)
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
            r#"SELECT state AS "state!: String", count(*) AS "n!: i64"
                 FROM workers WHERE state IN ('live', 'stopping', 'dead') GROUP BY state"#
        )
        .fetch_all(&self.read)
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

    /// page_count × page_size: the main file (not the WAL beside it).
    async fn metrics_database_size(&self) -> Result<i64, StoreError> {
        let size = sqlx::query_scalar!(
            r#"SELECT c.page_count * s.page_size AS "size!: i64"
                 FROM pragma_page_count() c, pragma_page_size() s"#
        )
        .fetch_one(&self.read)
        .await?;
        Ok(size)
    }

    async fn metrics_schema_versions(&self) -> Result<SchemaVersions, StoreError> {
        // refinery makes its table at run time: no query! macro.
        let applied: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM refinery_schema_history")
                .fetch_one(&self.read)
                .await?;
        Ok(SchemaVersions {
            applied,
            known: crate::migrate::known_version(),
        })
    }
}
