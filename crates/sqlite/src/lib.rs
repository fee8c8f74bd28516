//! taskbroker's SQLite driver: every SQL statement for SQLite, and nothing
//! else.
//!
//! One file (WAL) per broker; a single-connection write pool (SQLite has
//! one writer: queueing in-process is cheaper than busy-waiting) and a
//! read-only pool beside it. Every write is one autocommit statement or a
//! `BEGIN IMMEDIATE` transaction: SQLite fails a DEFERRED transaction that
//! reads then writes at once, without honouring the busy timeout. Each
//! write runs in this process's turn at the write lock among processes
//! (`write_lock.rs`), so writers wait in the kernel, not in SQLite's busy
//! sleeps. Other processes learn of commits through `PRAGMA data_version`
//! and the wake file (`wake.rs`).
//!
//! A `LIMIT` takes its bound value as `CAST(? AS INTEGER)`, never a bare
//! `?`: SQLite plans with the value bound to a bare `LIMIT ?`, so every
//! new binding expires the prepared statement, and each execution is
//! parsed and planned again (the claim and the feed reads, on every
//! commit).

mod batch;
mod claimers;
mod feed;
mod jobs;
mod keys;
mod messages;
mod metrics;
mod migrate;
mod ops;
mod sessions;
mod tasks;
mod tokens;
mod upstreams;
mod wake;
mod workers;
mod write_lock;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Connection, Sqlite, SqliteConnection};
use taskbroker_storage::{
    ChangeFeed, Driver, Durability, FeedInterest, QueuedJobs, Signal, Storage, StoreError, Write,
    Written,
};
use tokio_util::sync::CancellationToken;

use wake::Wakes;
use write_lock::{WriteLock, WriteTurn};

/// Statement used to open every write transaction.
const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

fn open_error(path: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::Open {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// Refuse, before SQLite sees it, a path that can never be a database
/// file, with the reason SQLite would only hint at ("unable to open").
fn check_path(path: &Path) -> Result<(), StoreError> {
    if path.is_dir() {
        return Err(open_error(
            path,
            format!(
                "is a directory (name a file in it, e.g. --db {})",
                path.join("taskbroker.db").display()
            ),
        ));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(open_error(
            path,
            format!(
                "folder {} does not exist (create it first)",
                parent.display()
            ),
        ));
    }
    Ok(())
}

/// An error from opening or first reading the database file, said plainly.
fn open_failed(path: &Path, error: &dyn std::fmt::Display) -> StoreError {
    let text = error.to_string();
    let reason = if text.contains("file is not a database") {
        "is not a SQLite database (file is not a database): is --db the right file?".to_owned()
    } else if text.contains("unable to open database file") {
        "cannot be opened (unable to open database file): check the path and its permissions"
            .to_owned()
    } else if text.contains("readonly database") || text.contains("read-only") {
        "is read-only: the broker needs to write it (check its permissions and its folder's)"
            .to_owned()
    } else {
        text
    };
    open_error(path, reason)
}

/// The file `<db><suffix>` beside the database (wake files, the write
/// lock).
pub(crate) fn side_file_path(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Open (or create) a file beside the database for writing: never through
/// a symlink (one planted at its name could point at the database itself),
/// and only a regular file.
pub(crate) fn open_side_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

/// Handle on one broker database: a single-connection write pool (SQLite has
/// one writer; queueing in-process is cheaper than busy-waiting) and a
/// read-only pool that WAL lets run beside it.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Every write goes through this one connection, in this process's
    /// turn at the write lock (`take_turn`, `writer`).
    write: SqlitePool,
    /// Turns at SQLite's write lock among processes (`write_lock.rs`).
    write_lock: Arc<WriteLock>,
    /// Reads (tasks/get, tasks/list, the change feed) never wait for writes.
    read: SqlitePool,
    /// The database file, for logs and error messages.
    path: PathBuf,
    /// The wake files, poked after commits of this process (once a change
    /// feed opened them).
    wakes: Arc<OnceLock<Wakes>>,
    /// The worker processes a queued job's poke names.
    claimers: Arc<claimers::Claimers>,
}

/// How long a connection waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

fn connect_options(path: &Path, durability: Durability) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(match durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Normal => SqliteSynchronous::Normal,
        })
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true)
}

impl SqliteStore {
    /// Open (creating if needed) and migrate the database at `path`.
    pub async fn open(path: &Path, durability: Durability) -> Result<Self, StoreError> {
        check_path(path)?;
        let options = connect_options(path, durability);
        migrate::run(path, &options).await?;
        Self::connect(path, options).await
    }

    /// Open an existing database without migrating it (worker processes):
    /// refused unless its schema is exactly the one this build knows.
    pub async fn open_existing(path: &Path, durability: Durability) -> Result<Self, StoreError> {
        check_path(path)?;
        if !path.exists() {
            return Err(StoreError::NotMigrated(format!(
                "database {}: does not exist (create it with 'taskbroker migrate --db {}', or start 'taskbroker serve --db {}' once)",
                path.display(),
                path.display(),
                path.display()
            )));
        }
        let options = connect_options(path, durability).create_if_missing(false);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .map_err(|e| {
                // A file another process is creating right now (switching it
                // to WAL) is locked for longer than a busy wait covers.
                if e.to_string().contains("database is locked") {
                    StoreError::NotMigrated(format!(
                        "database {}: locked by another process (one creating or migrating it)",
                        path.display()
                    ))
                } else {
                    open_failed(path, &e)
                }
            })?;
        migrate::check(path, &mut conn).await?;
        conn.close().await?;
        Self::connect(path, options).await
    }

    async fn connect(path: &Path, options: SqliteConnectOptions) -> Result<Self, StoreError> {
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(60))
            // A local file needs no ping (a round trip to SQLite's thread)
            // before each use; both pools skip it.
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await
            .map_err(|e| open_failed(path, &e))?;
        let read = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(60))
            .test_before_acquire(false)
            .connect_with(options.read_only(true))
            .await?;
        let write_lock = WriteLock::open(path, BUSY_TIMEOUT);
        Ok(Self {
            write,
            write_lock: Arc::new(write_lock),
            read,
            path: path.to_owned(),
            wakes: Arc::new(OnceLock::new()),
            claimers: Arc::default(),
        })
    }

    /// Apply pending migrations to the database at `path` and report how
    /// many were applied.
    pub async fn migrate(path: &Path) -> Result<usize, StoreError> {
        check_path(path)?;
        migrate::run(path, &connect_options(path, Durability::Full)).await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This process's turn to write; hold it until the write's transaction
    /// has ended.
    pub(crate) async fn take_turn(&self) -> WriteTurn {
        self.write_lock.turn().await
    }

    /// The write connection in this process's turn, for one autocommit
    /// statement (`.execute(&mut *self.writer().await?)`).
    pub(crate) async fn writer(&self) -> Result<Writer, StoreError> {
        let turn = self.take_turn().await;
        Ok(Writer {
            conn: self.write.acquire().await?,
            _turn: turn,
        })
    }
}

/// The write connection with this process's turn at the write lock; the
/// turn ends when it is dropped.
pub(crate) struct Writer {
    conn: PoolConnection<Sqlite>,
    _turn: WriteTurn,
}

impl std::ops::Deref for Writer {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Writer {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.conn
    }
}

#[async_trait]
impl Storage for SqliteStore {
    fn driver(&self) -> Driver {
        Driver::Sqlite
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    async fn write_turn(&self) -> taskbroker_storage::WriteTurn {
        taskbroker_storage::WriteTurn::new(self.take_turn().await)
    }

    async fn write_batch_in(
        &self,
        turn: taskbroker_storage::WriteTurn,
        writes: &[Write],
        now: i64,
    ) -> Result<Vec<Result<Written, StoreError>>, StoreError> {
        let _turn = match turn.into_inner::<WriteTurn>() {
            Some(turn) => turn,
            None => self.take_turn().await,
        };
        taskbroker_storage::batch::write_batch(self, writes, now).await
    }

    async fn change_feed(
        &self,
        interest: FeedInterest,
        shutdown: CancellationToken,
    ) -> Result<Box<dyn ChangeFeed>, StoreError> {
        Ok(Box::new(
            feed::SqliteFeed::open(self, interest, shutdown).await?,
        ))
    }

    fn announce(&self, signal: Signal) {
        if let Some(wakes) = self.wakes.get() {
            wakes.file(signal).poke();
        }
    }

    /// The queue's poke names as many live worker processes serving the
    /// jobs' tools as it takes to run them (see `claimers.rs`).
    fn announce_queued(&self, jobs: &QueuedJobs) {
        if let Some(wakes) = self.wakes.get() {
            let payload = self.claimers.payload(jobs, &self.read);
            wakes.file(Signal::Queued).poke_with(&payload);
        }
    }

    async fn close(&self) {
        // Checkpoints happen as connections close.
        self.write.close().await;
        self.read.close().await;
    }
}
