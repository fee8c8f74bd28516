//! The PostgreSQL change feed: a listener task (`LISTEN
//! taskbroker_changes` on a connection of its own) hears every commit that
//! changed tasks, jobs or messages, from any process, this one included;
//! the schema's triggers notify at commit. Each notification bumps the
//! feed's version and wakes `remote()`.
//!
//! Feed ids (`task_events`, `task_progress`) become visible in id order
//! (the feed lock: see the crate doc and the schema), so a position is a
//! plain id, as with SQLite.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use taskbroker_storage::{ChangeFeed, ProgressEvent, StoreError, TaskEvent, TaskStore};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::PostgresStore;

/// The channel the schema's triggers notify.
const CHANNEL: &str = "taskbroker_changes";

/// How long the listener waits before connecting again after an error.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// A change feed on one PostgreSQL database.
pub(crate) struct PgFeed {
    store: PostgresStore,
    remote: Arc<Notify>,
    /// Notifications heard (and reconnections, which may have missed some).
    version: Arc<AtomicI64>,
    last_progress: i64,
    last_event: i64,
}

impl PgFeed {
    /// A feed at the head; listens until `shutdown`.
    pub(crate) async fn open(
        store: &PostgresStore,
        shutdown: CancellationToken,
    ) -> Result<Self, StoreError> {
        // Its own connection, outside the store's pool (it is held for the
        // feed's life), reconnected by the listener when lost.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with((*store.pool.connect_options()).clone());
        // LISTEN before reading the head: whatever commits after the head
        // was read is heard.
        let listener = listen(&pool).await?;
        let remote = Arc::new(Notify::new());
        let version = Arc::new(AtomicI64::new(0));
        tokio::spawn(run_listener(
            pool,
            listener,
            remote.clone(),
            version.clone(),
            shutdown,
        ));
        let last_event = store.task_events_head().await?;
        let last_progress = store.task_progress_head().await?;
        Ok(Self {
            store: store.clone(),
            remote,
            version,
            last_progress,
            last_event,
        })
    }
}

/// A listener on [`CHANNEL`].
async fn listen(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Something may have committed: a new version, and wake the tailer.
fn bump(remote: &Notify, version: &AtomicI64) {
    version.fetch_add(1, Ordering::AcqRel);
    remote.notify_one();
}

/// Hear notifications until `shutdown`; reconnect after errors (and count
/// a reconnection as a change, since notifications sent meanwhile are
/// lost).
async fn run_listener(
    pool: PgPool,
    mut listener: PgListener,
    remote: Arc<Notify>,
    version: Arc<AtomicI64>,
    shutdown: CancellationToken,
) {
    loop {
        let heard = tokio::select! {
            _ = shutdown.cancelled() => break,
            heard = listener.try_recv() => heard,
        };
        match heard {
            Ok(Some(_)) => bump(&remote, &version),
            // The connection was lost and made again (LISTEN included).
            Ok(None) => {
                tracing::info!("change feed: listener reconnected");
                bump(&remote, &version);
            }
            Err(e) => {
                tracing::warn!(error = %e, "change feed: listener failed; connecting again");
                drop(listener);
                listener = loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => {
                            pool.close().await;
                            return;
                        }
                        _ = tokio::time::sleep(RECONNECT_DELAY) => {}
                    }
                    match listen(&pool).await {
                        Ok(listener) => break listener,
                        Err(e) => {
                            tracing::warn!(error = %e, "change feed: listener cannot connect; trying again");
                        }
                    }
                };
                tracing::info!("change feed: listener connected again");
                bump(&remote, &version);
            }
        }
    }
    drop(listener);
    pool.close().await;
}

#[async_trait]
impl ChangeFeed for PgFeed {
    fn remote(&self) -> Arc<Notify> {
        self.remote.clone()
    }

    async fn version(&mut self) -> Result<i64, StoreError> {
        Ok(self.version.load(Ordering::Acquire))
    }

    async fn next_progress(&mut self, limit: i64) -> Result<Vec<ProgressEvent>, StoreError> {
        let rows = self
            .store
            .task_progress_since(self.last_progress, limit)
            .await?;
        if let Some(last) = rows.last() {
            self.last_progress = last.id;
        }
        Ok(rows)
    }

    async fn next_events(&mut self, limit: i64) -> Result<Vec<TaskEvent>, StoreError> {
        let rows = self.store.task_events_since(self.last_event, limit).await?;
        if let Some(last) = rows.last() {
            self.last_event = last.id;
        }
        Ok(rows)
    }
}
