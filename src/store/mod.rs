//! Every SQL statement of the broker, and nothing else.
//!
//! The store speaks in rows and plain values; the task rules live in
//! `broker/`. Method names are entity then verb (`task_get`,
//! `job_claim_available`), `now` is always a parameter so callers (and tests)
//! own the clock, and every write is one autocommit statement or a
//! `BEGIN IMMEDIATE` transaction: SQLite fails a DEFERRED transaction that
//! reads then writes at once, without honouring the busy timeout.

mod batch;
mod jobs;
mod messages;
mod migrate;
mod sessions;
mod tasks;
mod tokens;
mod workers;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

pub use batch::WriteOp;
pub use jobs::{ClaimedJob, HeartbeatOutcome, RescueReport, ToolQuota};
pub use messages::{AnswerOutcome, TaskMessage};
pub use sessions::{NewSession, SessionRow};
pub use tasks::{CancelOutcome, NewJob, NewTask, ProgressEvent, TaskEvent, TaskOutcome, TaskRow};
pub use tokens::TokenRow;
pub use workers::NewWorker;

/// Statement used to open every write transaction.
const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// Errors of the store. Callers map them to protocol errors; the database
/// error text is logged, never sent to clients.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The lease token no longer matches: another worker (or the rescuer)
    /// owns the job now, so this worker must write nothing more.
    #[error("lease lost")]
    LeaseLost,
    /// SQLite or the connection failed.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// A schema migration failed.
    #[error("migration failed: {0}")]
    Migrate(String),
    /// A group commit failed as a whole: this write was not committed.
    #[error("the group commit failed: {0}")]
    Batch(String),
    /// The database's schema is not the one this build knows.
    #[error("{0}")]
    Schema(String),
    /// The database file cannot be used at all: the path names a
    /// directory, a file that is not SQLite, a missing folder...
    #[error("database {path}: {reason}")]
    Open {
        /// The path as given.
        path: String,
        /// What is wrong, and what to do.
        reason: String,
    },
}

impl StoreError {
    fn open(path: &Path, reason: impl Into<String>) -> Self {
        Self::Open {
            path: path.display().to_string(),
            reason: reason.into(),
        }
    }
}

/// Refuse, before SQLite sees it, a path that can never be a database
/// file, with the reason SQLite would only hint at ("unable to open").
fn check_path(path: &Path) -> Result<(), StoreError> {
    if path.is_dir() {
        return Err(StoreError::open(
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
        return Err(StoreError::open(
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
    StoreError::open(path, reason)
}

/// How hard every commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: a commit survives power loss. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: a commit survives a process crash; the last
    /// transactions may roll back on power loss. Faster.
    Normal,
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Ok(Self::Full),
            "normal" => Ok(Self::Normal),
            other => Err(format!(
                "unknown durability '{other}' (expected full or normal)"
            )),
        }
    }
}

/// Handle on one broker database: a single-connection write pool (SQLite has
/// one writer; queueing in-process is cheaper than busy-waiting) and a
/// read-only pool that WAL lets run beside it.
#[derive(Clone, Debug)]
pub struct Store {
    /// Every write goes through this one connection.
    write: SqlitePool,
    /// Reads (tasks/get, tasks/list, the change feed) never wait for writes.
    read: SqlitePool,
    /// The database file, for logs and error messages.
    path: PathBuf,
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

impl Store {
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
            return Err(StoreError::open(
                path,
                format!(
                    "does not exist (create it with 'taskbroker migrate --db {}', or start 'taskbroker serve --db {}' once)",
                    path.display(),
                    path.display()
                ),
            ));
        }
        let options = connect_options(path, durability).create_if_missing(false);
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .map_err(|e| open_failed(path, &e))?;
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
        Ok(Self {
            write,
            read,
            path: path.to_owned(),
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

    /// `PRAGMA data_version` on a dedicated read connection: it changes when
    /// any other connection (this process or another) commits.
    pub async fn data_version(&self, conn: &mut sqlx::SqliteConnection) -> Result<i64, StoreError> {
        // PRAGMA cannot go through the query! macros (no column description);
        // the text is a constant.
        let v: i64 = sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(conn)
            .await?;
        Ok(v)
    }

    /// A connection of its own for a long-lived reader (the change-feed
    /// tailer), so `data_version` compares against the same connection.
    pub async fn dedicated_reader(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>, StoreError> {
        Ok(self.read.acquire().await?)
    }

    /// Close both pools (checkpoints happen as connections close).
    pub async fn close(&self) {
        self.write.close().await;
        self.read.close().await;
    }
}
