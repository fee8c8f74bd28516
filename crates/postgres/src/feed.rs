//! The PostgreSQL change feed: a listener task (`LISTEN` on a connection of
//! its own) hears the commits of the feed's interest from any process, this
//! one included; the schema's triggers notify at commit, on one channel per
//! kind (migration V8): `taskbroker_changes` (statuses, progress, input
//! requests), `taskbroker_queued` (a job is queued), `taskbroker_control`
//! (a cancel or an answer). Each notification of the followed kind bumps
//! the feed's version and wakes `remote()`; a queued one wakes `queued()`,
//! or `queued_for_others()` when its payload names worker processes to
//! claim at once and not this one (migration V15: `claim:` and their ids).
//! A status change notifies with its task and owner (`task:<id> <owner>`,
//! migration V16), progress likewise (`progress:<id> <owner>`, V17; plain
//! `progress` when too long to name them), which also bumps the progress
//! version: without one, no progress read. Once the process said which
//! tasks it acts on ([`ChangeFeed::wake_only_for`]), the others' status
//! changes are passed over, counted, and read together at most once per
//! [`CATCH_UP`] (or with the next read that is woken), so the feed's
//! position keeps up without a read per commit of every other broker's
//! tasks; the others' progress is not read for itself at all (it goes to
//! no one here), only with the next progress read that is.
//!
//! Feed ids (`task_events`, `task_progress`) become visible in id order
//! (the feed lock: see the crate doc and the schema), so a position is a
//! plain id, as with SQLite.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use taskbroker_storage::{
    ChangeFeed, ClaimerId, Concerned, FeedInterest, ProgressEvent, StoreError, TaskEvent,
    TaskStore, asks_to_claim,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::PostgresStore;

/// Statuses, progress, input requests.
const CHANGES: &str = "taskbroker_changes";
/// A job became claimable.
const QUEUED: &str = "taskbroker_queued";
/// A task was cancelled or answered.
const CONTROL: &str = "taskbroker_control";

/// How long the listener waits before connecting again after an error.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// How often at most the feed reads for the changes it passed over (of
/// tasks no one here waits for), when nothing else makes it read.
const CATCH_UP: Duration = Duration::from_secs(1);

/// A change feed on one PostgreSQL database.
pub(crate) struct PgFeed {
    store: PostgresStore,
    remote: Arc<Notify>,
    queued: Arc<Notify>,
    queued_for_others: Arc<Notify>,
    claimer: ClaimerId,
    /// Notifications heard that concern this process (and reconnections,
    /// which may have missed some).
    version: Arc<AtomicI64>,
    /// Which changes concern this process (all until told).
    concerned: Arc<OnceLock<Concerned>>,
    /// Notifications heard of changes that concern no one here.
    passed_over: Arc<AtomicI64>,
    /// `version` when it was last asked for.
    version_read: i64,
    /// `passed_over` as counted in the version, and since when.
    passed_over_read: (i64, Instant),
    /// Progress notifications heard (and reconnections).
    progress_version: Arc<AtomicI64>,
    /// `progress_version` when progress was last read.
    progress_read_at: i64,
    last_progress: i64,
    last_event: i64,
}

/// Where the listener sends what it hears.
struct Signals {
    /// The channel of the feed's interest.
    followed: &'static str,
    remote: Arc<Notify>,
    queued: Arc<Notify>,
    queued_for_others: Arc<Notify>,
    /// This process's worker id, once its pool started.
    claimer: ClaimerId,
    version: Arc<AtomicI64>,
    progress_version: Arc<AtomicI64>,
    concerned: Arc<OnceLock<Concerned>>,
    passed_over: Arc<AtomicI64>,
}

/// The payload of a progress notification that names no task (migration
/// V13; since V17 only when the task's id and owner would not fit).
const PROGRESS: &str = "progress";
/// How the payload of a progress notification starts (migration V17): then
/// the task id, a space and the owner.
const PROGRESS_OF: &str = "progress:";
/// How the payload of a status change starts (migration V16): then the
/// task id, a space and the owner.
const TASK_CHANGED: &str = "task:";

/// What a `taskbroker_changes` notification says changed.
#[derive(Debug, PartialEq, Eq)]
enum Changed<'a> {
    /// A status change of the task `(id, owner)`.
    Status(&'a str, &'a str),
    /// Progress of the task `(id, owner)`.
    Progress(&'a str, &'a str),
    /// Progress of some task.
    SomeProgress,
    /// Anything (the empty payload of input requests, or too long to say).
    Anything,
}

/// Parse a `taskbroker_changes` payload; the owner is the rest after the
/// first space (task ids have none, owners may).
fn changed(payload: &str) -> Changed<'_> {
    let named = |prefix| payload.strip_prefix(prefix)?.split_once(' ');
    if payload == PROGRESS {
        Changed::SomeProgress
    } else if let Some((task_id, owner)) = named(PROGRESS_OF) {
        Changed::Progress(task_id, owner)
    } else if let Some((task_id, owner)) = named(TASK_CHANGED) {
        Changed::Status(task_id, owner)
    } else {
        Changed::Anything
    }
}

impl PgFeed {
    /// A feed at the head, following `interest`; listens until `shutdown`.
    pub(crate) async fn open(
        store: &PostgresStore,
        interest: FeedInterest,
        shutdown: CancellationToken,
    ) -> Result<Self, StoreError> {
        // Its own connection, outside the store's pool (it is held for the
        // feed's life), reconnected by the listener when lost.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with((*store.pool.connect_options()).clone());
        let signals = Signals {
            followed: match interest {
                FeedInterest::Everything => CHANGES,
                FeedInterest::Control => CONTROL,
            },
            remote: Arc::new(Notify::new()),
            queued: Arc::new(Notify::new()),
            queued_for_others: Arc::new(Notify::new()),
            claimer: Arc::new(OnceLock::new()),
            version: Arc::new(AtomicI64::new(0)),
            progress_version: Arc::new(AtomicI64::new(0)),
            concerned: Arc::new(OnceLock::new()),
            passed_over: Arc::new(AtomicI64::new(0)),
        };
        // LISTEN before reading the head: whatever commits after the head
        // was read is heard.
        let listener = listen(&pool, signals.followed).await?;
        let (remote, queued, queued_for_others, claimer) = (
            signals.remote.clone(),
            signals.queued.clone(),
            signals.queued_for_others.clone(),
            signals.claimer.clone(),
        );
        let (version, progress_version, concerned, passed_over) = (
            signals.version.clone(),
            signals.progress_version.clone(),
            signals.concerned.clone(),
            signals.passed_over.clone(),
        );
        tokio::spawn(run_listener(pool, listener, signals, shutdown));
        let last_event = store.task_events_head().await?;
        let last_progress = store.task_progress_head().await?;
        Ok(Self {
            store: store.clone(),
            remote,
            queued,
            queued_for_others,
            claimer,
            version,
            concerned,
            passed_over,
            version_read: 0,
            passed_over_read: (0, Instant::now()),
            progress_version,
            progress_read_at: 0,
            last_progress,
            last_event,
        })
    }
}

/// A listener on `followed` and [`QUEUED`].
async fn listen(pool: &PgPool, followed: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all([followed, QUEUED]).await?;
    Ok(listener)
}

impl Signals {
    /// Something of the followed kind may have committed: a new version,
    /// and wake the tailer.
    fn bump(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.remote.notify_one();
    }

    /// Notifications may have been missed: wake everyone.
    fn all(&self) {
        self.progress_version.fetch_add(1, Ordering::AcqRel);
        self.bump();
        self.queued.notify_one();
    }
}

/// Hear notifications until `shutdown`; reconnect after errors (and count
/// a reconnection as a change of every kind, since notifications sent
/// meanwhile are lost).
async fn run_listener(
    pool: PgPool,
    mut listener: PgListener,
    signals: Signals,
    shutdown: CancellationToken,
) {
    loop {
        let heard = tokio::select! {
            _ = shutdown.cancelled() => break,
            heard = listener.try_recv() => heard,
        };
        match heard {
            Ok(Some(n)) if n.channel() == QUEUED => {
                if asks_to_claim(n.payload(), signals.claimer.get().map(String::as_str)) {
                    signals.queued.notify_one();
                } else {
                    signals.queued_for_others.notify_one();
                }
            }
            Ok(Some(n)) => {
                let concerned = |task_id: &str, owner: &str| {
                    signals.concerned.get().is_none_or(|c| c(task_id, owner))
                };
                match changed(n.payload()) {
                    // Its rows go to no one here.
                    Changed::Progress(task_id, owner) if !concerned(task_id, owner) => continue,
                    // Before the bump: the tailer it wakes sees the progress.
                    Changed::Progress(..) | Changed::SomeProgress => {
                        signals.progress_version.fetch_add(1, Ordering::AcqRel);
                    }
                    Changed::Status(task_id, owner) if !concerned(task_id, owner) => {
                        signals.passed_over.fetch_add(1, Ordering::AcqRel);
                        continue;
                    }
                    Changed::Status(..) | Changed::Anything => {}
                }
                signals.bump();
            }
            // The connection was lost and made again (LISTEN included).
            Ok(None) => {
                tracing::info!("change feed: listener reconnected");
                signals.all();
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
                    match listen(&pool, signals.followed).await {
                        Ok(listener) => break listener,
                        Err(e) => {
                            tracing::warn!(error = %e, "change feed: listener cannot connect; trying again");
                        }
                    }
                };
                tracing::info!("change feed: listener connected again");
                signals.all();
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

    fn queued(&self) -> Arc<Notify> {
        self.queued.clone()
    }

    fn queued_for_others(&self) -> Option<Arc<Notify>> {
        Some(self.queued_for_others.clone())
    }

    fn claimer(&self) -> Option<ClaimerId> {
        Some(self.claimer.clone())
    }

    /// The notifications that concern this process, plus those passed
    /// over as of the last time they were counted in: at a read woken by
    /// the others (which reads them too), else once per [`CATCH_UP`].
    async fn version(&mut self) -> Result<i64, StoreError> {
        let heard = self.version.load(Ordering::Acquire);
        let passed = self.passed_over.load(Ordering::Acquire);
        let (counted, since) = self.passed_over_read;
        if passed != counted && (heard != self.version_read || since.elapsed() >= CATCH_UP) {
            self.passed_over_read = (passed, Instant::now());
        }
        self.version_read = heard;
        Ok(heard + self.passed_over_read.0)
    }

    fn wake_only_for(&mut self, concerned: Concerned) {
        let _ = self.concerned.set(concerned);
    }

    fn hears_own_commits(&self) -> bool {
        true
    }

    fn progress_may_have_changed(&mut self) -> bool {
        let heard = self.progress_version.load(Ordering::Acquire);
        let changed = heard != self.progress_read_at;
        self.progress_read_at = heard;
        changed
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

    async fn next_control_events(&mut self, limit: i64) -> Result<Vec<TaskEvent>, StoreError> {
        let head = self.store.task_events_head().await?;
        let rows = self
            .store
            .task_control_events_since(self.last_event, head, limit)
            .await?;
        self.last_event = match rows.last() {
            Some(last) if rows.len() as i64 == limit => last.id,
            _ => head.max(self.last_event),
        };
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

#[cfg(test)]
mod tests {
    use super::{Changed, changed};

    #[test]
    fn a_payload_names_its_task_and_owner() {
        assert_eq!(
            changed("task:0b3e principal:ops team"),
            Changed::Status("0b3e", "principal:ops team"),
            "the owner is the rest, spaces included"
        );
        assert_eq!(
            changed("progress:0b3e session:7 f"),
            Changed::Progress("0b3e", "session:7 f")
        );
        assert_eq!(
            changed("progress"),
            Changed::SomeProgress,
            "too long to name"
        );
        assert_eq!(
            changed(""),
            Changed::Anything,
            "too long, or an input request"
        );
        assert_eq!(changed("task:no-owner"), Changed::Anything);
        assert_eq!(changed("progress:no-owner"), Changed::Anything);
    }
}
