//! The SQLite change feed: `PRAGMA data_version` on a dedicated read
//! connection says whether anything committed; the wake files (`wake.rs`)
//! say so at once when another process commits a change of the feed's
//! interest, or queues a job (a poke that names other worker processes to
//! claim it wakes `queued_for_others`, see `claimers.rs`). SQLite has one
//! writer, so feed ids are assigned and committed in order: a position is
//! a plain id.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::pool::PoolConnection;
use taskbroker_storage::{
    ChangeFeed, ClaimerId, FeedInterest, ProgressEvent, Signal, StoreError, TaskEvent,
    asks_to_claim,
};
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
    queued_for_others: Arc<Notify>,
    claimer: ClaimerId,
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
        let queued_for_others = Arc::new(Notify::new());
        let claimer = ClaimerId::default();
        match Wakes::open(store.path()) {
            Ok(wakes) => {
                let followed = match interest {
                    FeedInterest::Everything => Signal::Changed,
                    FeedInterest::Control => Signal::Control,
                };
                let wake = remote.clone();
                if let Err(e) = wakes
                    .file(followed)
                    .watch(move || wake.notify_one(), shutdown.clone())
                {
                    tracing::info!(error = %e, signal = ?followed, "no wake file watch: other processes' commits are seen at the next tick");
                }
                let queue = wakes.file(Signal::Queued);
                let (me, others, named) =
                    (queued.clone(), queued_for_others.clone(), claimer.clone());
                let watched = queue.reader().and_then(|reader| {
                    queue.watch(
                        move || {
                            if asks_to_claim(&reader.payload(), named.get().map(String::as_str)) {
                                me.notify_one();
                            } else {
                                others.notify_one();
                            }
                        },
                        shutdown.clone(),
                    )
                });
                if let Err(e) = watched {
                    tracing::info!(error = %e, "no watch of the queue's wake file: jobs queued elsewhere are seen at the next tick");
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
            queued_for_others,
            claimer,
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

    fn queued_for_others(&self) -> Option<Arc<Notify>> {
        Some(self.queued_for_others.clone())
    }

    fn claimer(&self) -> Option<ClaimerId> {
        Some(self.claimer.clone())
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
