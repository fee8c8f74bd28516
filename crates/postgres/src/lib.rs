//! taskbroker's PostgreSQL driver: every SQL statement for PostgreSQL, and
//! nothing else.
//!
//! One database for brokers and workers on many machines, with the same
//! results as the SQLite driver (the reference). Where SQLite has one
//! writer, PostgreSQL has many; these rules keep the SQLite behaviour and
//! spare round trips:
//!
//! - **Feed order at commit.** Feed ids (`task_events`, `task_progress`)
//!   are drawn under the advisory lock [`FEED_LOCK_KEY`], held until the
//!   drawing transaction has committed, so they become visible in id order
//!   (the schema's status-history functions take it, and progress's
//!   statement trigger `task_progress_feed_order`). Status history is
//!   written inside `COMMIT` (deferred triggers, migration V14): a
//!   transaction holds the lock only while it commits, never across the
//!   round trips of its statements, and no transaction of this driver
//!   takes it itself.
//! - **Rows in one order.** Without a lock around whole transactions, a
//!   transaction that reads and then writes locks what it reads, and every
//!   transaction takes its row locks in one order: a task's job, then its
//!   pending requests, then the task (a completion's order), so two never
//!   wait for each other in a cycle. A fenced write of a running task locks
//!   its job's row first (`FOR SHARE`): a requeue or rescue of that job
//!   then either comes before it (and the write finds its lease gone) or
//!   after it.
//! - **Claims skip, never wait.** The claim locks its candidate jobs with
//!   `FOR UPDATE SKIP LOCKED`: claimers on many machines take disjoint jobs
//!   without queueing behind one another.
//! - **One statement where one will do.** A batch of one claim, of
//!   creations only or of completions only is one statement committed on
//!   its own (`batch.rs`): one round trip, where `BEGIN`, the statements
//!   and `COMMIT` took three or four. So are the fenced writes of a
//!   running task (a status message, a question to its client) and the
//!   release of a job.
//! - **Global tool limits.** A claim that counts a tool's running jobs for
//!   its limit across processes first takes that tool's advisory lock
//!   (class [`TOOL_LOCK_CLASS`]), so two claimers never both see the same
//!   free room.
//!
//! Other processes learn of commits through `LISTEN` (`feed.rs`): the
//! schema's triggers notify at commit, one channel per kind of change.

mod batch;
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
mod workers;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use taskbroker_storage::{
    ChangeFeed, Driver, Durability, FeedInterest, Signal, Storage, StoreError, Write, Written,
};
use tokio_util::sync::CancellationToken;

/// The advisory lock (`pg_advisory_xact_lock(bigint)`) that orders the
/// change feed: 0x74626b5f66656564, `tbk_feed` in ASCII. The schema's
/// triggers take it (the functions `tasks_history_insert` and
/// `tasks_history_update` for status history, migration V18;
/// `taskbroker_feed_order` for progress, V1): an operator
/// who takes it in psql holds every commit that writes the feed.
pub const FEED_LOCK_KEY: i64 = 0x7462_6b5f_6665_6564;

/// The advisory lock (`pg_advisory_lock(bigint)`, held for the session)
/// that serialises migrations between processes: `tbk_migr` in ASCII.
pub const MIGRATE_LOCK_KEY: i64 = 0x7462_6b5f_6d69_6772;

/// The first key of a tool's advisory lock (`pg_advisory_xact_lock(int,
/// int)`, the second key a hash of the tool's name): `tbkt` in ASCII.
pub const TOOL_LOCK_CLASS: i32 = 0x7462_6b74;

/// Connections at most, per process.
const MAX_CONNECTIONS: u32 = 16;

/// How long a statement waits for a free connection of the pool.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// A pooled connection idle for at least this long is checked (one round
/// trip) before it is handed out. Under load connections come back within
/// milliseconds and a statement costs one round trip, not two; after any
/// pause (and a server restart or failover is one) every connection is
/// checked, and a dead one replaced, before a request meets it.
const CHECK_IDLE_AFTER: Duration = Duration::from_millis(100);

/// Handle on one broker database: a pool of connections.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The URL without its password, for logs and error messages.
    url: String,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the pool: its options hold the password.
        f.debug_struct("PostgresStore")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// `postgres://user:secret@host/db?password=x` as `postgres://user@host/db`.
pub fn without_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_password(None);
            if parsed.query_pairs().any(|(k, _)| k == "password") {
                let kept: Vec<(String, String)> = parsed
                    .query_pairs()
                    .filter(|(k, _)| k != "password")
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect();
                if kept.is_empty() {
                    parsed.set_query(None);
                } else {
                    parsed.query_pairs_mut().clear().extend_pairs(kept);
                }
            }
            parsed.to_string()
        }
        // Not a URL: say nothing of what follows the user name.
        Err(_) => match url.split_once("://") {
            Some((scheme, rest)) => match rest.rsplit_once('@') {
                Some((auth, host)) => {
                    let user = auth.split_once(':').map_or(auth, |(user, _)| user);
                    format!("{scheme}://{user}@{host}")
                }
                None => url.to_owned(),
            },
            None => "(not a URL)".to_owned(),
        },
    }
}

fn open_error(url: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Open {
        path: without_password(url),
        reason: reason.into(),
    }
}

/// The connection options of `url` (libpq's environment variables fill
/// what it leaves out).
fn connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    let options = PgConnectOptions::from_str(url).map_err(|e| {
        open_error(
            url,
            format!(
                "is not a PostgreSQL URL ({e}); expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
            ),
        )
    })?;
    Ok(if options.get_application_name().is_none() {
        options.application_name("taskbroker")
    } else {
        options
    })
}

/// A failure to connect (or to first read), said plainly.
fn open_failed(url: &str, options: &PgConnectOptions, error: &sqlx::Error) -> StoreError {
    let server = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    let user = options.get_username();
    let database = options.get_database().unwrap_or(user);
    let reason = match error {
        sqlx::Error::Io(e) => {
            format!("server unreachable at {server} ({e}): is PostgreSQL running there?")
        }
        sqlx::Error::PoolTimedOut => {
            format!("server unreachable at {server} (no connection within {ACQUIRE_TIMEOUT:?})")
        }
        sqlx::Error::Tls(e) => format!("TLS with the server at {server} failed: {e}"),
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("3D000") => format!(
                "database \"{database}\" does not exist on {server} (create it with 'createdb -h {} -p {} -U {user} {database}')",
                options.get_host(),
                options.get_port()
            ),
            Some("28P01") | Some("28000") => format!(
                "authentication failed for user \"{user}\" on {server} ({}): check the user and password in the URL (or PGPASSWORD)",
                db.message()
            ),
            Some("57P03") => format!(
                "the server at {server} is starting up or shutting down ({})",
                db.message()
            ),
            _ => db.message().to_owned(),
        },
        other => other.to_string(),
    };
    open_error(url, reason)
}

impl PostgresStore {
    /// Connect to the database at `url` and migrate it.
    pub async fn open(url: &str, durability: Durability) -> Result<Self, StoreError> {
        let options = connect_options(url)?;
        migrate::run(url, &options).await?;
        Self::connect(url, options, durability).await
    }

    /// Connect without migrating (worker processes): refused unless the
    /// schema is exactly the one this build knows.
    pub async fn open_existing(url: &str, durability: Durability) -> Result<Self, StoreError> {
        let options = connect_options(url)?;
        let mut conn = PgConnection::connect_with(&options)
            .await
            .map_err(|e| open_failed(url, &options, &e))?;
        migrate::check(url, &mut conn).await?;
        conn.close().await?;
        Self::connect(url, options, durability).await
    }

    /// Apply pending migrations to the database at `url` and report how
    /// many were applied.
    pub async fn migrate(url: &str) -> Result<usize, StoreError> {
        migrate::run(url, &connect_options(url)?).await
    }

    async fn connect(
        url: &str,
        options: PgConnectOptions,
        durability: Durability,
    ) -> Result<Self, StoreError> {
        let relaxed = durability == Durability::Normal;
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= CHECK_IDLE_AFTER {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if relaxed {
                        // A commit returns before its WAL reaches disk:
                        // a crash of the server may lose the last
                        // transactions, never corrupt.
                        sqlx::query_scalar!(
                            r#"SELECT set_config('synchronous_commit', 'off', false) AS "v!""#
                        )
                        .fetch_one(&mut *conn)
                        .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options.clone())
            .await
            .map_err(|e| open_failed(url, &options, &e))?;
        Ok(Self {
            pool,
            url: without_password(url),
        })
    }

    /// Every finished job and task leaves dead rows behind; without
    /// autovacuum nothing reclaims them and claims slow down as they pile
    /// up (measured here: from 1,200 to 300 tasks/s over 200,000 tasks).
    /// A broker says so when it opens the database (a one-off command such
    /// as `token create` does not: its output is its answer).
    pub async fn warn_without_autovacuum(&self) -> Result<(), StoreError> {
        let on = sqlx::query_scalar!(r#"SELECT current_setting('autovacuum') = 'on' AS "on!""#)
            .fetch_one(&self.pool)
            .await?;
        if !on {
            tracing::warn!(
                db = %self.url,
                "autovacuum is off on this PostgreSQL server: dead rows of finished jobs and tasks \
                 pile up and throughput falls as they do; turn it on (autovacuum = on), or run \
                 VACUUM ANALYZE jobs, tasks regularly"
            );
        }
        Ok(())
    }
}

#[async_trait]
impl Storage for PostgresStore {
    fn driver(&self) -> Driver {
        Driver::Postgres
    }

    fn describe(&self) -> String {
        self.url.clone()
    }

    /// A claim alone is one statement committed on its own (see
    /// `batch::claim_alone`; a claim of a globally limited tool keeps its
    /// transaction, which is rare).
    fn empty_claim_is_cheap(&self) -> bool {
        true
    }

    /// No turn: PostgreSQL locks rows as they are written.
    async fn write_batch_in(
        &self,
        _turn: taskbroker_storage::WriteTurn,
        writes: &[Write],
        now: i64,
    ) -> Result<Vec<Result<Written, StoreError>>, StoreError> {
        if let Some(claimed) = self.claim_alone(writes, now).await {
            return Ok(vec![Ok(Written::Claimed(claimed?))]);
        }
        // Creations, completions and a claim: one statement, then the
        // claim. Should the statement fail, nothing was written, and the
        // general way tells each write's own error.
        match self.write_alone(writes, now).await {
            Some(Ok(done)) => return Ok(done),
            Some(Err(e)) => {
                tracing::debug!(error = %e, writes = writes.len(), "one-statement batch failed; the general way");
            }
            None => {}
        }
        taskbroker_storage::batch::write_batch(self, writes, now).await
    }

    async fn change_feed(
        &self,
        interest: FeedInterest,
        shutdown: CancellationToken,
    ) -> Result<Box<dyn ChangeFeed>, StoreError> {
        Ok(Box::new(
            feed::PgFeed::open(self, interest, shutdown).await?,
        ))
    }

    fn announce(&self, signal: Signal) {
        // The schema's triggers notify the listeners of each kind at commit;
        // a freed slot, or a start that came, is in no row, so it is told
        // here.
        if matches!(signal, Signal::SlotFreed | Signal::Due) {
            let pool = self.pool.clone();
            tokio::spawn(async move {
                if let Err(e) =
                    sqlx::query!("SELECT pg_notify('taskbroker_queued', '') AS slot_freed")
                        .execute(&pool)
                        .await
                {
                    tracing::debug!(error = %e, "freed slot not announced; claimers look within a second");
                }
            });
        }
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
