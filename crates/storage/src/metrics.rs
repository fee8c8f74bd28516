//! What `/metrics` and `/readyz` read from the database: a few cheap
//! queries, run at most once per scrape.

use async_trait::async_trait;

use crate::StoreError;

/// The queued jobs of one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDepth {
    /// The tool.
    pub tool: String,
    /// Jobs in state `queued` (waiting for a worker, for their retry
    /// backoff, or for the start their call asked for).
    pub depth: i64,
    /// Creation time (ms) of the task of the oldest job that is due (`now`
    /// when none is: a job waiting for its start is no backlog).
    pub oldest_created_at: i64,
}

/// Worker pools by state, as the `workers` table says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    /// Claiming and heartbeating.
    pub live: i64,
    /// Finishing their jobs after SIGTERM.
    pub stopping: i64,
    /// Stopped heartbeating (killed, hung).
    pub dead: i64,
}

/// The schema as applied, and as this build knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaVersions {
    /// The newest migration applied to the database (None: none).
    pub applied: Option<i64>,
    /// The newest migration embedded in this build.
    pub known: i64,
}

/// Reads for metrics and readiness. None of them scans a table whose size
/// grows with the number of tasks.
#[async_trait]
pub trait MetricsStore {
    /// A trivial query: the database answers.
    async fn metrics_ping(&self) -> Result<(), StoreError>;
    /// Queued jobs by tool at `now`, through the partial index of queued
    /// jobs.
    async fn metrics_queue_by_tool(&self, now: i64) -> Result<Vec<QueueDepth>, StoreError>;
    /// Worker pools by state.
    async fn metrics_worker_counts(&self) -> Result<WorkerCounts, StoreError>;
    /// The database's size in bytes.
    async fn metrics_database_size(&self) -> Result<i64, StoreError>;
    /// The applied and the embedded schema versions.
    async fn metrics_schema_versions(&self) -> Result<SchemaVersions, StoreError>;
}
