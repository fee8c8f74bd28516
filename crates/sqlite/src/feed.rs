//! The SQLite change feed: `PRAGMA data_version` on a dedicated read
//! connection says whether anything committed; the wake files (`wake.rs`)
//! say so at once when another process commits a change of the feed's
//! interest, or queues a job. SQLite has one writer, so feed ids are
//! assigned and committed in order: a position is a plain id.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::pool::PoolConnection;
use taskbroker_storage::{ChangeFeed, FeedInterest, ProgressEvent, Signal, StoreError, TaskEvent};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::SqliteStore;
use crate::wake::Wakes;

/// A change feed on one SQLite database.
pub(crate) struct SqliteFeed {
    store: SqliteStore,
    /// Its own connection: `data_version` compares commits against it.
    conn: PoolConnection<Sqlite>,
    remote: Arc<Notify>,
    queued: Arc<Notify>,
    last_progress: i64,
    last_event: i64,
}

impl SqliteFeed {
    /// A feed at the head; watches the wake files of `interest` (and the
    /// queue's) until `shutdown`.
    pub(crate) async fn open(
        store: &SqliteStore,
        interest: FeedInterest,
        shutdown: CancellationToken,
    ) -> Result<Self, StoreError> {
        let conn = store.read.acquire().await?;
        // Other processes' commits: at once through the wake files where
        // they can be watched, else at the feed's next tick.
        let remote = Arc::new(Notify::new());
        let queued = Arc::new(Notify::new());
        match Wakes::open(store.path()) {
            Ok(wakes) => {
                let followed = match interest {
                    FeedInterest::Everything => Signal::Changed,
                    FeedInterest::Control => Signal::Control,
                };
                for (signal, notify) in [(followed, &remote), (Signal::Queued, &queued)] {
                    if let Err(e) = wakes.file(signal).watch(notify.clone(), shutdown.clone()) {
                        tracing::info!(error = %e, ?signal, "no wake file watch: other processes' commits are seen at the next tick");
                    }
                }
                let _ = store.wakes.set(wakes);
            }
            Err(e) => {
                tracing::warn!(error = %e, "no wake files: other processes' commits are seen at the next tick");
            }
        }
        let last_event = taskbroker_storage::TaskStore::task_events_head(store).await?;
        let last_progress = store.task_progress_head().await?;
        Ok(Self {
            store: store.clone(),
            conn,
            remote,
            queued,
            last_progress,
            last_event,
        })
    }
}

#[async_trait]
impl ChangeFeed for SqliteFeed {
    fn remote(&self) -> Arc<Notify> {
        self.remote.clone()
    }

    fn queued(&self) -> Arc<Notify> {
        self.queued.clone()
    }

    async fn version(&mut self) -> Result<i64, StoreError> {
        // PRAGMA cannot go through the query! macros (no column
        // description); the text is a constant.
        let v: i64 = sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(&mut *self.conn)
            .await?;
        Ok(v)
    }

    async fn next_progress(&mut self, limit: i64) -> Result<Vec<ProgressEvent>, StoreError> {
        let rows = self
            .store
            .task_progress_since(&mut self.conn, self.last_progress, limit)
            .await?;
        if let Some(last) = rows.last() {
            self.last_progress = last.id;
        }
        Ok(rows)
    }

    async fn next_control_events(&mut self, limit: i64) -> Result<Vec<TaskEvent>, StoreError> {
        let head = self.store.task_events_head_on(&mut self.conn).await?;
        let rows = self
            .store
            .task_control_events_since(&mut self.conn, self.last_event, head, limit)
            .await?;
        self.last_event = match rows.last() {
            Some(last) if rows.len() as i64 == limit => last.id,
            _ => head.max(self.last_event),
        };
        Ok(rows)
    }

    async fn next_events(&mut self, limit: i64) -> Result<Vec<TaskEvent>, StoreError> {
        let rows = self
            .store
            .task_events_since(&mut self.conn, self.last_event, limit)
            .await?;
        if let Some(last) = rows.last() {
            self.last_event = last.id;
        }
        Ok(rows)
    }
}
