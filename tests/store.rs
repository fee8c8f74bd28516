//! Store tests, one suite for both drivers: every test that is not about a
//! SQLite file as such runs twice, as `<test>::sqlite` on a fresh SQLite
//! file in a temporary directory, and as `<test>::postgres` on a fresh
//! PostgreSQL database of its own (`common/pg.rs`; where no server answers
//! the PostgreSQL case is skipped with one line on stderr, unless
//! `TASKBROKER_REQUIRE_POSTGRES=1` makes it fail). A test is an
//! `async fn <test>(db: TestDb)` (or `(fresh: FreshDb)` for a database not
//! opened yet) followed by `store_test!(<test>)`, which makes the two.
//! Run alone: `sqlite_open_creates_the_file_in_wal_mode` (about the SQLite
//! file itself) and `durability_parses_case_insensitively` (no database).
//!
//! `store::open`, `store::open_existing`, `store::migrate` and every method
//! of a `Store` (the `Storage` trait and the traits it gathers, and the
//! `ChangeFeed` it opens) are exercised here, on both drivers; the operator
//! reads (`OpsStore`: `ops_stats`, `ops_workers`, `ops_task_page`,
//! `ops_task_history`, `ops_stats_plans`) and the metrics reads
//! (`MetricsStore`) against one known state written through the store's
//! own methods (`ops_world`), with exact values. Time is never
//! read from the clock: `now` is a parameter of every store call, so the
//! tests drive it explicitly (`T0`, `T0 + LEASE_MS + 1`, ...).
//!
//! Spec ids named below: T-9 (a task starts working), T-11 (allowed
//! transitions, terminal immutability), T-13 (lastUpdatedAt moves, never
//! backwards), T-17/T-18 (tasks/list pagination), T-22 (cancelled stays
//! cancelled), T-27 (a new attempt abandons old requests), T-33/T-34 (ttl
//! and purge).
//!
//! The `raw_sql_*` tests, and helpers such as `history` and `job`, bypass
//! the store and talk to the migrated database with a plain pool of its
//! driver ([`Raw`]), as an operator's sqlite3 or psql shell would: the
//! database itself must refuse what the lifecycle rules forbid. Raw SQL
//! uses `$1`-style placeholders, which SQLite accepts too. Trigger refusals
//! carry the same text on both databases; CHECK refusals are worded by
//! each database ([`check_refusal`]).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::pg::PgDb;
use sqlx::FromRow;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteRow};
use taskbroker::store::ops::{
    Finished, HOUR_MS, JobInfo, MINUTE_MS, MessageInfo, OpsStats, PROGRESS_LIMIT, TaskFilter,
    TaskHistory, TaskSummary, ToolFailures, ToolFinished, ToolQueue, ToolRunning, WorkerInfo,
    WorkerLife,
};
use taskbroker::store::{
    self, AnswerOutcome, CancelOutcome, ClaimedJob, Driver, Durability, NewJob, NewSession,
    NewTask, NewToken, NewWorker, OneWrite, QueueDepth, RescueReport, ResultKind, SchemaVersions,
    Store, StoreError, TaskMessage, TaskOutcome, TaskRow, TaskStatus, ToolQuota, WorkerCounts,
    WorkerKind, WorkerState, Write, Written,
};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

/// A start time far from 0, so "earlier" times are still positive.
const T0: i64 = 1_000_000;
/// Lease length used by the claim tests.
const LEASE_MS: i64 = 30_000;
/// Rescue backoff per attempt.
const BACKOFF_MS: i64 = 1_000;
/// Upper bound of the rescue jitter (`abs(random() % 250)`).
const JITTER_MAX_MS: i64 = 249;
/// Job with three attempts, default priority.
const JOB: NewJob = NewJob {
    max_attempts: 3,
    priority: 0,
};

// Both drivers ----------------------------------------------------------------

/// `store_test!(name)` after `async fn name(db: TestDb)` (or
/// `(fresh: FreshDb)`): the tests `name::sqlite` and `name::postgres`, each
/// giving the body a database of its own. `store_test!(#[multi_thread]
/// name)`: the same on a two-thread runtime.
macro_rules! store_test {
    (#[multi_thread] $name:ident) => {
        store_test!(@tests $name, #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
    };
    ($name:ident) => {
        store_test!(@tests $name, #[tokio::test]);
    };
    (@tests $name:ident, #[$test:meta]) => {
        mod $name {
            #[$test]
            async fn sqlite() {
                super::run(super::Driver::Sqlite, super::$name).await;
            }

            #[$test]
            async fn postgres() {
                super::run(super::Driver::Postgres, super::$name).await;
            }
        }
    };
}

/// Run `body` on a database of `driver` made for it. Where the driver is
/// PostgreSQL and no server answers, return at once: `common::pg` said so
/// on stderr, once (or panicked, under `TASKBROKER_REQUIRE_POSTGRES`).
async fn run<D: Setup, F: Future<Output = ()>>(driver: Driver, body: impl FnOnce(D) -> F) {
    if let Some(db) = D::setup(driver).await {
        body(db).await;
    }
}

/// What a test body starts from.
trait Setup: Sized {
    /// A new one, or `None` when `driver` cannot be reached here.
    async fn setup(driver: Driver) -> Option<Self>;
}

impl Setup for FreshDb {
    async fn setup(driver: Driver) -> Option<Self> {
        Self::create(driver)
    }
}

impl Setup for TestDb {
    async fn setup(driver: Driver) -> Option<Self> {
        Some(Self::open(FreshDb::create(driver)?).await)
    }
}

/// An empty database of one driver, not opened yet: a file name in a
/// temporary directory (SQLite), or an empty database of its own on the
/// test server (PostgreSQL). Removed when this is dropped.
struct FreshDb {
    driver: Driver,
    /// What `--db` says: the file's path, or the database's URL.
    location: PathBuf,
    _keep: Keep,
}

/// What a test database lives in.
enum Keep {
    Dir(TempDir),
    Server(PgDb),
}

impl FreshDb {
    /// `None` when `driver` is PostgreSQL and no server answers.
    fn create(driver: Driver) -> Option<Self> {
        match driver {
            Driver::Sqlite => {
                let dir = tempfile::tempdir().expect("create temp dir");
                Some(Self {
                    driver,
                    location: dir.path().join("broker.db"),
                    _keep: Keep::Dir(dir),
                })
            }
            Driver::Postgres => {
                let pg = PgDb::create()?;
                Some(Self {
                    driver,
                    location: PathBuf::from(&pg.url),
                    _keep: Keep::Server(pg),
                })
            }
        }
    }

    /// A database of the same driver that does not exist: a file never
    /// made beside this one, or a database the server does not have.
    fn missing(&self) -> PathBuf {
        match &self._keep {
            Keep::Dir(dir) => dir.path().join("missing.db"),
            Keep::Server(pg) => PathBuf::from(format!("{}_missing", pg.url)),
        }
    }
}

/// A fresh, migrated database and a store on it, removed when this is
/// dropped. (Fields drop in order: the store before its database.)
struct TestDb {
    store: Store,
    fresh: FreshDb,
}

impl TestDb {
    async fn open(fresh: FreshDb) -> Self {
        let store = store::open(&fresh.location, Durability::Full)
            .await
            .expect("open store");
        Self { store, fresh }
    }

    fn driver(&self) -> Driver {
        self.fresh.driver
    }

    /// What `--db` says for this database.
    fn location(&self) -> &Path {
        &self.fresh.location
    }

    /// A plain pool on the same database, outside the store.
    async fn raw(&self) -> Raw {
        Raw::open(self.driver(), self.location()).await
    }
}

// Raw SQL, beside the store ------------------------------------------------------

/// A plain pool on a test database, outside the store, as an operator's
/// sqlite3 or psql shell would use it. Its methods run the same SQL on
/// either database: write placeholders as `$1`, `$2`...
enum Raw {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A value bound to a `$n` placeholder of raw SQL.
#[derive(Debug, Clone)]
enum Arg {
    Int(i64),
    Text(Option<String>),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Self::Text(Some(v.to_owned()))
    }
}

impl From<String> for Arg {
    fn from(v: String) -> Self {
        Self::Text(Some(v))
    }
}

impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Self::Text(v.map(str::to_owned))
    }
}

/// `args![a, b]`: the values of `$1`, `$2` for a [`Raw`] statement.
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        &[$(Arg::from($arg)),*]
    };
}

/// `on_pool!(raw, |pool| body)`: `body` with `pool` the raw pool, compiled
/// once per driver (a `SqlitePool`, then a `PgPool`).
macro_rules! on_pool {
    ($raw:expr, |$pool:ident| $body:expr) => {
        match $raw {
            Raw::Sqlite($pool) => $body,
            Raw::Postgres($pool) => $body,
        }
    };
}

/// `bind_all!(query, args)`: the query with every argument bound in order.
macro_rules! bind_all {
    ($query:expr, $args:expr) => {{
        let mut query = $query;
        for arg in $args {
            query = match arg {
                Arg::Int(v) => query.bind(*v),
                Arg::Text(v) => query.bind(v.clone()),
            };
        }
        query
    }};
}

impl Raw {
    async fn open(driver: Driver, location: &Path) -> Self {
        match driver {
            Driver::Sqlite => Self::Sqlite(raw_sqlite(location).await),
            Driver::Postgres => Self::Postgres(
                PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&location.to_string_lossy())
                    .await
                    .expect("open raw pool"),
            ),
        }
    }

    /// Run one statement; how many rows it changed.
    async fn execute(&self, sql: &'static str, args: &[Arg]) -> Result<u64, sqlx::Error> {
        on_pool!(self, |pool| bind_all!(sqlx::query(sql), args)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))
    }

    /// The one value of a one-row, one-column query.
    async fn scalar<T>(&self, sql: &'static str, args: &[Arg]) -> Result<T, sqlx::Error>
    where
        T: Send + Unpin,
        (T,): for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow>,
    {
        on_pool!(self, |pool| bind_all!(sqlx::query_scalar(sql), args)
            .fetch_one(pool)
            .await)
    }

    /// Every row, as tuples.
    async fn rows<T>(&self, sql: &'static str, args: &[Arg]) -> Result<Vec<T>, sqlx::Error>
    where
        T: Send + Unpin + for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow>,
    {
        on_pool!(self, |pool| bind_all!(sqlx::query_as(sql), args)
            .fetch_all(pool)
            .await)
    }

    /// The row, if there is one.
    async fn row<T>(&self, sql: &'static str, args: &[Arg]) -> Result<Option<T>, sqlx::Error>
    where
        T: Send + Unpin + for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow>,
    {
        on_pool!(self, |pool| bind_all!(sqlx::query_as(sql), args)
            .fetch_optional(pool)
            .await)
    }

    async fn close(&self) {
        on_pool!(self, |pool| pool.close().await)
    }
}

/// A plain pool on a SQLite file (a sqlite3 shell).
async fn raw_sqlite(path: &Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(10));
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("open raw pool")
}

/// What a refusal by a CHECK constraint says: SQLite quotes the
/// constraint's expression, PostgreSQL names the constraint.
fn check_refusal(driver: Driver, sqlite_expression: &str, postgres_name: &str) -> String {
    match driver {
        Driver::Sqlite => format!("CHECK constraint failed: {sqlite_expression}"),
        Driver::Postgres => format!("violates check constraint \"{postgres_name}\""),
    }
}

/// How many migration files the repository has for `driver`.
fn migration_files(driver: Driver) -> usize {
    let dir = format!(
        "{}/migrations/{}",
        env!("CARGO_MANIFEST_DIR"),
        driver.as_str()
    );
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".sql")
        })
        .count()
}

// Helpers -------------------------------------------------------------------

fn new_task(task_id: &str, owner: &str) -> NewTask {
    NewTask {
        task_id: task_id.to_owned(),
        owner: owner.to_owned(),
        tool: "echo".to_owned(),
        arguments: r#"{"text":"hello"}"#.to_owned(),
        ttl_ms: None,
        poll_interval_ms: Some(500),
        progress_token: None,
        session_id: None,
        client_capabilities: None,
    }
}

fn new_task_ttl(task_id: &str, owner: &str, ttl_ms: i64) -> NewTask {
    NewTask {
        ttl_ms: Some(ttl_ms),
        ..new_task(task_id, owner)
    }
}

fn completed_outcome() -> TaskOutcome {
    TaskOutcome {
        status: TaskStatus::Completed,
        status_message: None,
        result: r#"{"content":[{"type":"text","text":"hello"}],"isError":false}"#.to_owned(),
        result_kind: ResultKind::Result,
    }
}

fn failed_outcome(message: &str) -> TaskOutcome {
    TaskOutcome {
        status: TaskStatus::Failed,
        status_message: Some(message.to_owned()),
        result: r#"{"code":-32602,"message":"Invalid params"}"#.to_owned(),
        result_kind: ResultKind::Error,
    }
}

fn new_session(session_id: &str) -> NewSession {
    NewSession {
        session_id: session_id.to_owned(),
        protocol_version: "2025-11-25".to_owned(),
        client_info: r#"{"name":"test-client","version":"1.0"}"#.to_owned(),
        client_capabilities: r#"{"tasks":{}}"#.to_owned(),
        principal: None,
    }
}

/// One history row: (from_status, to_status, message, at).
type HistoryRow = (Option<String>, String, Option<String>, i64);

/// The status history of a task, oldest first.
async fn history(raw: &Raw, task_id: &str) -> Vec<HistoryRow> {
    raw.rows(
        "SELECT from_status, to_status, message, at FROM task_events WHERE task_id = $1 ORDER BY id",
        args![task_id],
    )
    .await
    .expect("read history")
}

/// Just the (from, to) pairs of a task's history.
async fn transitions(raw: &Raw, task_id: &str) -> Vec<(Option<String>, String)> {
    history(raw, task_id)
        .await
        .into_iter()
        .map(|(from, to, _, _)| (from, to))
        .collect()
}

fn tr(from: Option<&str>, to: &str) -> (Option<String>, String) {
    (from.map(str::to_owned), to.to_owned())
}

/// A row of `jobs`, read around the store.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JobState {
    state: String,
    attempt: i64,
    max_attempts: i64,
    priority: i64,
    run_after: i64,
    lease_owner: Option<String>,
    lease_token: Option<String>,
    lease_expires_at: Option<i64>,
    cancel_requested: bool,
    last_error: Option<String>,
    finished_at: Option<i64>,
}

type JobTuple = (
    String,
    i64,
    i64,
    i64,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
    i64,
    Option<String>,
    Option<i64>,
);

async fn job(raw: &Raw, task_seq: i64) -> Option<JobState> {
    let row: Option<JobTuple> = raw
        .row(
            "SELECT state, attempt, max_attempts, priority, run_after, lease_owner, lease_token,
                    lease_expires_at, cancel_requested, last_error, finished_at
               FROM jobs WHERE task_seq = $1",
            args![task_seq],
        )
        .await
        .expect("read job");
    row.map(|r| JobState {
        state: r.0,
        attempt: r.1,
        max_attempts: r.2,
        priority: r.3,
        run_after: r.4,
        lease_owner: r.5,
        lease_token: r.6,
        lease_expires_at: r.7,
        cancel_requested: r.8 != 0,
        last_error: r.9,
        finished_at: r.10,
    })
}

/// `SELECT COUNT(*)`-style query with `$1` = `task_seq`.
async fn count_rows(raw: &Raw, sql: &'static str, task_seq: i64) -> i64 {
    raw.scalar(sql, args![task_seq]).await.expect("count rows")
}

/// How many rows `table` has (`sql` is `SELECT COUNT(*) FROM <table>`).
async fn count_all(raw: &Raw, sql: &'static str) -> i64 {
    raw.scalar(sql, args![]).await.expect("count rows")
}

async fn get(store: &Store, task_id: &str) -> TaskRow {
    store
        .task_get(task_id)
        .await
        .expect("task_get")
        .unwrap_or_else(|| panic!("task {task_id} not found"))
}

/// A claim's quota for the tool of [`new_task`]: `n` jobs of `echo`.
fn echo(n: i64) -> Vec<ToolQuota> {
    vec![ToolQuota {
        tool: "echo".into(),
        free: n,
        global: None,
    }]
}

/// Claim exactly one job and return it.
async fn claim_one(store: &Store, worker: &str, token: &str, now: i64) -> ClaimedJob {
    let mut jobs = store
        .job_claim_available(worker, token, &echo(1), 1, LEASE_MS, now)
        .await
        .expect("claim");
    assert_eq!(jobs.len(), 1, "expected exactly one claimable job");
    jobs.pop().expect("one job")
}

#[track_caller]
fn assert_lease_lost<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    match result {
        Err(StoreError::LeaseLost) => {}
        other => panic!("expected StoreError::LeaseLost, got {other:?}"),
    }
}

/// The statement must fail, with `expected` in the database's message.
#[track_caller]
fn assert_refused<T>(result: Result<T, sqlx::Error>, expected: &str) {
    match result {
        Ok(_) => panic!("statement succeeded; expected a refusal containing {expected:?}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(expected),
                "error {msg:?} does not contain {expected:?}"
            );
        }
    }
}

/// The store must refuse the write with a database error whose text holds
/// `expected`.
#[track_caller]
fn assert_db_refused<T: std::fmt::Debug>(result: Result<T, StoreError>, expected: &str) {
    match result {
        Err(StoreError::Db(e)) => {
            let msg = e.to_string();
            assert!(
                msg.contains(expected),
                "error {msg:?} does not contain {expected:?}"
            );
        }
        other => panic!("expected a StoreError::Db containing {expected:?}, got {other:?}"),
    }
}

/// The two trigger texts a status change of a terminal task can meet: both
/// rules apply, and which one the database reports first is its own
/// business.
const T11_TERMINAL: &str = "task is in a terminal status and cannot change (T-11)";
const T11_TRANSITION: &str = "illegal task status transition (T-11)";

/// The statement must fail with one of `expected` in the database's message.
#[track_caller]
fn assert_refused_any<T>(result: Result<T, sqlx::Error>, expected: &[&str]) {
    match result {
        Ok(_) => panic!("statement succeeded; expected a refusal containing one of {expected:?}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                expected.iter().any(|x| msg.contains(x)),
                "error {msg:?} contains none of {expected:?}"
            );
        }
    }
}

// open / open_existing / migrate / close ------------------------------------------

#[tokio::test]
async fn durability_parses_case_insensitively() {
    assert_eq!("full".parse::<Durability>().unwrap(), Durability::Full);
    assert_eq!("NORMAL".parse::<Durability>().unwrap(), Durability::Normal);
    assert_eq!(Durability::default(), Durability::Full);
    let err = "fast".parse::<Durability>().unwrap_err();
    assert!(err.contains("fast"), "{err}");
}

/// SQLite only: `open` makes the file, in WAL mode.
#[tokio::test]
async fn sqlite_open_creates_the_file_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    assert!(!path.exists());
    let store = store::open(&path, Durability::Full).await.unwrap();
    assert!(path.exists(), "open creates the file");
    store.close().await;

    let raw = raw_sqlite(&path).await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&raw)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    raw.close().await;
}

async fn open_then_reopen_keeps_the_data(fresh: FreshDb) {
    let store = store::open(&fresh.location, Durability::Full)
        .await
        .unwrap();
    assert_eq!(store.driver(), fresh.driver);
    let location = fresh.location.display().to_string();
    let described = match fresh.driver {
        Driver::Sqlite => location,
        Driver::Postgres => store::without_password(&location),
    };
    assert_eq!(store.describe(), described);
    store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    store.close().await;

    // Reopen (with the other durability): the task is still there.
    let store = store::open(&fresh.location, Durability::Normal)
        .await
        .unwrap();
    let row = get(&store, "t-1").await;
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(row.owner, "alice");
    store.close().await;
}
store_test!(open_then_reopen_keeps_the_data);

/// Two processes starting at once on a new database both migrate it: the
/// migrations are applied once (SQLite: the loser retries; PostgreSQL: a
/// lock makes them take turns).
async fn open_two_handles_concurrently_on_a_fresh_database(fresh: FreshDb) {
    let (a, b) = tokio::join!(
        store::open(&fresh.location, Durability::Full),
        store::open(&fresh.location, Durability::Full)
    );
    let a = a.expect("first open");
    let b = b.expect("second open");
    a.task_create(&new_task("t-a", "alice"), None, None, T0)
        .await
        .unwrap();
    assert_eq!(get(&b, "t-a").await.task_id, "t-a");
    let raw = Raw::open(fresh.driver, &fresh.location).await;
    let applied = count_all(&raw, "SELECT COUNT(*) FROM refinery_schema_history").await;
    assert_eq!(
        applied as usize,
        migration_files(fresh.driver),
        "each migration is recorded once"
    );
    raw.close().await;
    a.close().await;
    b.close().await;
}
store_test!(open_two_handles_concurrently_on_a_fresh_database);

async fn migrate_applies_once_then_nothing(fresh: FreshDb) {
    let db = &fresh.location;
    let files = migration_files(fresh.driver);
    assert_eq!(
        store::migrate(db).await.unwrap(),
        files,
        "fresh database: every migration"
    );
    assert_eq!(store::migrate(db).await.unwrap(), 0, "second run: none");

    // open migrates too, and finds nothing to do.
    let store = store::open(db, Durability::Full).await.unwrap();
    assert_eq!(store::migrate(db).await.unwrap(), 0);
    store
        .task_create(&new_task("t-1", "alice"), None, None, T0)
        .await
        .unwrap();
    store.close().await;

    let raw = Raw::open(fresh.driver, db).await;
    let versions: Vec<(i64,)> = raw
        .rows(
            "SELECT CAST(version AS BIGINT) FROM refinery_schema_history ORDER BY version",
            args![],
        )
        .await
        .unwrap();
    let versions: Vec<i64> = versions.into_iter().map(|(v,)| v).collect();
    assert_eq!(versions, (1..=files as i64).collect::<Vec<_>>());
    raw.close().await;
}
store_test!(migrate_applies_once_then_nothing);

/// `open_existing` (worker processes) never migrates: it refuses a
/// database without the schema, or with a newer one, and opens one whose
/// schema is exactly this build's.
async fn open_existing_opens_only_a_database_of_this_schema(fresh: FreshDb) {
    let db = &fresh.location;
    if fresh.driver == Driver::Sqlite {
        // An empty database, as the PostgreSQL one is: SQLite's is an
        // empty file.
        std::fs::write(db, b"").unwrap();
    }
    match store::open_existing(db, Durability::Full).await {
        Err(StoreError::NotMigrated(msg)) => {
            assert!(msg.contains("no taskbroker schema yet"), "{msg}");
            assert!(msg.contains("taskbroker migrate --db"), "{msg}");
        }
        other => panic!("expected a schema error, got {other:?}"),
    }

    store::migrate(db).await.unwrap();
    let store = store::open_existing(db, Durability::Normal).await.unwrap();
    assert_eq!(store.driver(), fresh.driver);
    store
        .task_create(&new_task("t-1", "alice"), None, None, T0)
        .await
        .unwrap();
    assert_eq!(get(&store, "t-1").await.owner, "alice");
    store.close().await;

    // A newer taskbroker migrated it further: this build stays off.
    let raw = Raw::open(fresh.driver, db).await;
    raw.execute(
        "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
         VALUES (999, 'from_a_newer_build', '2030-01-01T00:00:00Z', '0')",
        args![],
    )
    .await
    .unwrap();
    raw.close().await;
    match store::open_existing(db, Durability::Full).await {
        Err(StoreError::Schema(msg)) => {
            assert!(msg.contains("(version 999) is newer"), "{msg}");
        }
        other => panic!("expected a schema error, got {other:?}"),
    }
}
store_test!(open_existing_opens_only_a_database_of_this_schema);

/// `open_existing` creates nothing: a file or database that does not exist
/// is an error that says so. A SQLite file is one a starting broker may be
/// about to create (`NotMigrated`, which a worker waits for); a PostgreSQL
/// database is made by its operator (`Open`).
async fn open_existing_refuses_a_database_that_does_not_exist(fresh: FreshDb) {
    let missing = fresh.missing();
    match store::open_existing(&missing, Durability::Full).await {
        Err(StoreError::NotMigrated(reason)) if fresh.driver == Driver::Sqlite => {
            let location = missing.display().to_string();
            assert!(
                reason.starts_with(&format!("database {location}: does not exist")),
                "{reason}"
            );
            assert!(reason.contains("taskbroker migrate --db"), "{reason}");
        }
        Err(StoreError::Open { path, reason }) if fresh.driver == Driver::Postgres => {
            let location = missing.display().to_string();
            let expected = match fresh.driver {
                Driver::Sqlite => location,
                Driver::Postgres => store::without_password(&location),
            };
            assert_eq!(path, expected);
            assert!(reason.contains("does not exist"), "{reason}");
        }
        other => panic!("expected an open error, got {other:?}"),
    }
    if fresh.driver == Driver::Sqlite {
        assert!(!missing.exists(), "nothing was created");
    }
}
store_test!(open_existing_refuses_a_database_that_does_not_exist);

// task_create / task_get -----------------------------------------------------

async fn task_create_without_job_starts_working_t9(db: TestDb) {
    let raw = db.raw().await;
    let mut new = new_task_ttl("t-1", "alice", 60_000);
    new.progress_token = Some(r#""tok-7""#.to_owned());
    let row = db.store.task_create(&new, None, None, T0).await.unwrap();

    // T-9: a task starts working.
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(row.task_id, "t-1");
    assert_eq!(row.owner, "alice");
    assert_eq!(row.tool, "echo");
    assert_eq!(row.arguments, r#"{"text":"hello"}"#);
    assert_eq!(row.created_at, T0);
    assert_eq!(row.updated_at, T0);
    assert_eq!(row.ttl_ms, Some(60_000));
    assert_eq!(
        row.expires_at,
        Some(T0 + 60_000),
        "T-33: expires_at = created + ttl"
    );
    assert_eq!(row.poll_interval_ms, Some(500));
    assert_eq!(row.progress_token.as_deref(), Some(r#""tok-7""#));
    assert_eq!(row.result, None);
    assert_eq!(row.result_kind, None);
    assert_eq!(row.status_message, None);

    assert_eq!(get(&db.store, "t-1").await, row, "task_get returns the row");
    assert_eq!(db.store.task_get("nope").await.unwrap(), None);
    assert_eq!(job(&raw, row.seq).await, None, "no job without NewJob");
    assert_eq!(
        history(&raw, "t-1").await,
        vec![(None, "working".to_owned(), None, T0)],
        "the insert trigger writes one history row"
    );
    // Nothing to claim: the task has no job.
    let claimed = db
        .store
        .job_claim_available("w", "lease-1", &echo(10), 10, LEASE_MS, T0 + 1)
        .await
        .unwrap();
    assert!(claimed.is_empty());
}
store_test!(task_create_without_job_starts_working_t9);

async fn task_create_with_job_queues_it(db: TestDb) {
    let raw = db.raw().await;
    let job_spec = NewJob {
        max_attempts: 5,
        priority: 7,
    };
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(job_spec), None, T0)
        .await
        .unwrap();
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(row.ttl_ms, None);
    assert_eq!(row.expires_at, None);
    assert_eq!(
        job(&raw, row.seq).await,
        Some(JobState {
            state: "queued".to_owned(),
            attempt: 0,
            max_attempts: 5,
            priority: 7,
            run_after: T0,
            lease_owner: None,
            lease_token: None,
            lease_expires_at: None,
            cancel_requested: false,
            last_error: None,
            finished_at: None,
        })
    );
}
store_test!(task_create_with_job_queues_it);

async fn task_create_with_outcome_history_shows_working_then_failed_t9(db: TestDb) {
    let raw = db.raw().await;
    let outcome = failed_outcome("arguments do not match the tool's input schema");
    let row = db
        .store
        .task_create(&new_task("t-bad", "alice"), None, Some(&outcome), T0)
        .await
        .unwrap();
    assert_eq!(row.status, TaskStatus::Failed);
    assert_eq!(
        row.status_message.as_deref(),
        Some("arguments do not match the tool's input schema")
    );
    assert_eq!(row.result.as_deref(), Some(outcome.result.as_str()));
    assert_eq!(row.result_kind, Some(ResultKind::Error));
    assert_eq!(row.created_at, T0);
    assert_eq!(row.updated_at, T0);

    // T-9 even here: the task went through working first.
    let h = history(&raw, "t-bad").await;
    assert_eq!(
        h,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "failed".to_owned(),
                Some("arguments do not match the tool's input schema".to_owned()),
                T0
            ),
        ]
    );
    assert_eq!(get(&db.store, "t-bad").await, row);
}
store_test!(task_create_with_outcome_history_shows_working_then_failed_t9);

async fn task_create_duplicate_task_id_is_refused_and_writes_nothing(db: TestDb) {
    let raw = db.raw().await;
    db.store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let err = db
        .store
        .task_create(&new_task("t-1", "bob"), Some(JOB), None, T0 + 1)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Db(_)), "{err:?}");
    assert_eq!(get(&db.store, "t-1").await.owner, "alice");
    let tasks = count_all(&raw, "SELECT COUNT(*) FROM tasks").await;
    let jobs = count_all(&raw, "SELECT COUNT(*) FROM jobs").await;
    assert_eq!((tasks, jobs), (1, 1), "the failed transaction left nothing");
    assert_eq!(history(&raw, "t-1").await.len(), 1);
}
store_test!(task_create_duplicate_task_id_is_refused_and_writes_nothing);

// task_list_page ---------------------------------------------------------------

async fn task_list_page_newest_first_keyset_by_before_seq_t17_t18(db: TestDb) {
    // Seven tasks for alice, interleaved with bob's.
    let mut alice_seqs = Vec::new();
    for i in 0..7 {
        let row = db
            .store
            .task_create(&new_task(&format!("a-{i}"), "alice"), None, None, T0 + i)
            .await
            .unwrap();
        alice_seqs.push(row.seq);
        db.store
            .task_create(&new_task(&format!("b-{i}"), "bob"), None, None, T0 + i)
            .await
            .unwrap();
    }
    let now = T0 + 100;

    // T-17/T-18: walk the pages; each page starts strictly below the last
    // seq of the previous one.
    let mut seen = Vec::new();
    let mut before = None;
    let mut pages = 0;
    loop {
        let page = db
            .store
            .task_list_page("alice", before, 3, now)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        pages += 1;
        assert!(page.len() <= 3, "limit respected");
        for row in &page {
            assert_eq!(row.owner, "alice", "owner filter");
        }
        let seqs: Vec<i64> = page.iter().map(|r| r.seq).collect();
        let mut sorted = seqs.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(seqs, sorted, "newest first within a page");
        if let (Some(b), Some(first)) = (before, seqs.first()) {
            assert!(*first < b, "keyset: strictly older than before_seq");
        }
        before = seqs.last().copied();
        seen.extend(seqs);
    }
    assert_eq!(pages, 3, "7 rows in pages of 3: 3 + 3 + 1");
    let mut expected = alice_seqs.clone();
    expected.reverse();
    assert_eq!(seen, expected, "every task once, newest first");

    // The first page is exactly the newest three.
    let first = db
        .store
        .task_list_page("alice", None, 3, now)
        .await
        .unwrap();
    let ids: Vec<&str> = first.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids, vec!["a-6", "a-5", "a-4"]);

    // A task created after the first page was read does not shift the next
    // page (keyset, not offset).
    db.store
        .task_create(&new_task("a-new", "alice"), None, None, T0 + 50)
        .await
        .unwrap();
    let second = db
        .store
        .task_list_page("alice", Some(first[2].seq), 3, now)
        .await
        .unwrap();
    let ids: Vec<&str> = second.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids, vec!["a-3", "a-2", "a-1"]);

    assert!(
        db.store
            .task_list_page("carol", None, 10, now)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(task_list_page_newest_first_keyset_by_before_seq_t17_t18);

async fn task_list_page_excludes_expired_rows_t33(db: TestDb) {
    db.store
        .task_create(&new_task_ttl("short", "alice", 1_000), None, None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task_ttl("long", "alice", 100_000), None, None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("forever", "alice"), None, None, T0)
        .await
        .unwrap();

    let ids = |rows: Vec<TaskRow>| rows.into_iter().map(|r| r.task_id).collect::<Vec<_>>();

    let before_expiry = db
        .store
        .task_list_page("alice", None, 10, T0 + 999)
        .await
        .unwrap();
    assert_eq!(ids(before_expiry), vec!["forever", "long", "short"]);

    // At expires_at the task is gone from the list, even before any purge.
    let at_expiry = db
        .store
        .task_list_page("alice", None, 10, T0 + 1_000)
        .await
        .unwrap();
    assert_eq!(ids(at_expiry), vec!["forever", "long"]);

    let later = db
        .store
        .task_list_page("alice", None, 10, T0 + 200_000)
        .await
        .unwrap();
    assert_eq!(ids(later), vec!["forever"]);
}
store_test!(task_list_page_excludes_expired_rows_t33);

// task_cancel ------------------------------------------------------------------

async fn task_cancel_not_found_for_other_owner_or_unknown_id(db: TestDb) {
    db.store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let outcome = db
        .store
        .task_cancel("t-1", "mallory", "cancelled", T0 + 1)
        .await
        .unwrap();
    assert!(matches!(outcome, CancelOutcome::NotFound), "{outcome:?}");
    let outcome = db
        .store
        .task_cancel("t-unknown", "alice", "cancelled", T0 + 1)
        .await
        .unwrap();
    assert!(matches!(outcome, CancelOutcome::NotFound), "{outcome:?}");
    let row = get(&db.store, "t-1").await;
    assert_eq!(
        row.status,
        TaskStatus::Working,
        "another owner cannot cancel"
    );
    assert_eq!(row.updated_at, T0);
}
store_test!(task_cancel_not_found_for_other_owner_or_unknown_id);

async fn task_cancel_terminal_for_completed_task_t11(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let claimed = claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    assert_eq!(claimed.task_seq, row.seq);
    assert!(
        db.store
            .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 2)
            .await
            .unwrap()
    );

    let outcome = db
        .store
        .task_cancel("t-1", "alice", "cancelled", T0 + 3)
        .await
        .unwrap();
    match outcome {
        CancelOutcome::Terminal(status) => assert_eq!(status, TaskStatus::Completed),
        other => panic!("expected Terminal, got {other:?}"),
    }
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status, TaskStatus::Completed);
    assert_eq!(after.updated_at, T0 + 2);
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![tr(None, "working"), tr(Some("working"), "completed")]
    );
}
store_test!(task_cancel_terminal_for_completed_task_t11);

async fn task_cancel_finishes_a_queued_job(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let outcome = db
        .store
        .task_cancel(
            "t-1",
            "alice",
            "The task was cancelled by request.",
            T0 + 10,
        )
        .await
        .unwrap();
    let cancelled = match outcome {
        CancelOutcome::Cancelled(row) => *row,
        other => panic!("expected Cancelled, got {other:?}"),
    };
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert_eq!(
        cancelled.status_message.as_deref(),
        Some("The task was cancelled by request.")
    );
    assert_eq!(cancelled.updated_at, T0 + 10);
    assert_eq!(cancelled.result, None);
    assert_eq!(get(&db.store, "t-1").await, cancelled);

    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done", "a queued job is finished by the cancel");
    assert!(j.cancel_requested);
    assert_eq!(j.finished_at, Some(T0 + 10));
    assert_eq!(j.attempt, 0);

    // Nothing left to claim.
    let claimed = db
        .store
        .job_claim_available("w", "lease-1", &echo(10), 10, LEASE_MS, T0 + 20)
        .await
        .unwrap();
    assert!(claimed.is_empty());

    assert_eq!(
        history(&raw, "t-1").await,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "cancelled".to_owned(),
                Some("The task was cancelled by request.".to_owned()),
                T0 + 10
            ),
        ]
    );

    // A second cancel finds it terminal (T-22: stays cancelled).
    let again = db
        .store
        .task_cancel("t-1", "alice", "again", T0 + 20)
        .await
        .unwrap();
    match again {
        CancelOutcome::Terminal(status) => assert_eq!(status, TaskStatus::Cancelled),
        other => panic!("expected Terminal, got {other:?}"),
    }
    assert_eq!(history(&raw, "t-1").await.len(), 2);
}
store_test!(task_cancel_finishes_a_queued_job);

async fn task_cancel_running_job_requests_stop_and_keeps_it_running(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let outcome = db
        .store
        .task_cancel("t-1", "alice", "cancelled", T0 + 2)
        .await
        .unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Cancelled(_)),
        "{outcome:?}"
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "running", "the worker finishes a running job");
    assert!(j.cancel_requested);
    assert_eq!(j.lease_token.as_deref(), Some("lease-1"));
    assert_eq!(j.finished_at, None);
}
store_test!(task_cancel_running_job_requests_stop_and_keeps_it_running);

async fn task_cancel_without_job_and_never_moves_updated_at_backwards_t13(db: TestDb) {
    db.store
        .task_create(&new_task("t-1", "alice"), None, None, T0)
        .await
        .unwrap();
    // A clock that went backwards: updated_at keeps its value (T-13).
    let outcome = db
        .store
        .task_cancel("t-1", "alice", "cancelled", T0 - 500)
        .await
        .unwrap();
    let row = match outcome {
        CancelOutcome::Cancelled(row) => *row,
        other => panic!("expected Cancelled, got {other:?}"),
    };
    assert_eq!(row.status, TaskStatus::Cancelled);
    assert_eq!(row.updated_at, T0);
}
store_test!(task_cancel_without_job_and_never_moves_updated_at_backwards_t13);

// task_set_status_message ------------------------------------------------------

async fn task_set_status_message_with_lease_moves_updated_at_t13(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;

    db.store
        .task_set_status_message(row.seq, "lease-1", "step 1 of 3", T0 + 100)
        .await
        .unwrap();
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status_message.as_deref(), Some("step 1 of 3"));
    assert_eq!(after.updated_at, T0 + 100, "T-13: lastUpdatedAt moves");
    assert_eq!(after.status, TaskStatus::Working);

    // An earlier clock does not move it backwards.
    db.store
        .task_set_status_message(row.seq, "lease-1", "step 2 of 3", T0 + 50)
        .await
        .unwrap();
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status_message.as_deref(), Some("step 2 of 3"));
    assert_eq!(after.updated_at, T0 + 100);

    // A message is not a transition: no history row.
    assert_eq!(history(&raw, "t-1").await.len(), 1);
}
store_test!(task_set_status_message_with_lease_moves_updated_at_t13);

async fn task_set_status_message_lease_lost_with_wrong_token(db: TestDb) {
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();

    // Queued, not yet claimed: nobody holds a lease.
    assert_lease_lost(
        db.store
            .task_set_status_message(row.seq, "lease-1", "hi", T0 + 1)
            .await,
    );

    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    assert_lease_lost(
        db.store
            .task_set_status_message(row.seq, "lease-other", "hijack", T0 + 2)
            .await,
    );
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status_message, None, "nothing written");
    assert_eq!(after.updated_at, T0);

    // Once the job is complete, the old token writes nothing either.
    db.store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 3)
        .await
        .unwrap();
    assert_lease_lost(
        db.store
            .task_set_status_message(row.seq, "lease-1", "late", T0 + 4)
            .await,
    );
    assert_eq!(get(&db.store, "t-1").await.status_message, None);
}
store_test!(task_set_status_message_lease_lost_with_wrong_token);

// task_purge_expired -------------------------------------------------------------

async fn task_purge_expired_deletes_task_job_and_history_t33_t34(db: TestDb) {
    let raw = db.raw().await;
    let short = db
        .store
        .task_create(&new_task_ttl("short", "alice", 1_000), Some(JOB), None, T0)
        .await
        .unwrap();
    let short2 = db
        .store
        .task_create(&new_task_ttl("short2", "alice", 1_000), Some(JOB), None, T0)
        .await
        .unwrap();
    let long = db
        .store
        .task_create(&new_task_ttl("long", "alice", 100_000), Some(JOB), None, T0)
        .await
        .unwrap();
    let forever = db
        .store
        .task_create(&new_task("forever", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    // Give "short" more history: claim and complete it.
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(1), 1, LEASE_MS, T0)
        .await
        .unwrap();
    assert_eq!(claimed[0].task_seq, short.seq);
    db.store
        .job_complete(short.seq, "lease-1", &completed_outcome(), T0 + 10)
        .await
        .unwrap();
    assert_eq!(history(&raw, "short").await.len(), 2);

    // Before expiry: nothing.
    assert_eq!(db.store.task_purge_expired(T0 + 999, 100).await.unwrap(), 0);

    // At expiry, with a limit of 1: one of the two expired tasks goes.
    assert_eq!(db.store.task_purge_expired(T0 + 1_000, 1).await.unwrap(), 1);
    assert_eq!(db.store.task_purge_expired(T0 + 1_000, 1).await.unwrap(), 1);
    assert_eq!(db.store.task_purge_expired(T0 + 1_000, 1).await.unwrap(), 0);

    for (id, seq) in [("short", short.seq), ("short2", short2.seq)] {
        assert_eq!(db.store.task_get(id).await.unwrap(), None, "{id} purged");
        assert_eq!(
            job(&raw, seq).await,
            None,
            "{id}: job deleted with the task"
        );
        assert_eq!(
            count_rows(
                &raw,
                "SELECT COUNT(*) FROM task_events WHERE task_seq = $1",
                seq
            )
            .await,
            0,
            "{id}: history deleted with the task"
        );
    }
    for (id, seq) in [("long", long.seq), ("forever", forever.seq)] {
        assert!(db.store.task_get(id).await.unwrap().is_some());
        assert!(job(&raw, seq).await.is_some());
        assert_eq!(history(&raw, id).await.len(), 1);
    }

    // Much later: "long" goes, "forever" (no ttl) never does.
    assert_eq!(
        db.store
            .task_purge_expired(T0 + 10_000_000, 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.store.task_get("long").await.unwrap(), None);
    assert!(db.store.task_get("forever").await.unwrap().is_some());

    // A purged seq is never handed out again, not even the newest task's
    // (SQLite: AUTOINCREMENT; PostgreSQL: an identity).
    let newest = db
        .store
        .task_create(
            &new_task_ttl("newest", "alice", 1),
            None,
            None,
            T0 + 10_000_001,
        )
        .await
        .unwrap();
    assert!(newest.seq > forever.seq);
    assert_eq!(
        db.store
            .task_purge_expired(T0 + 10_000_002, 100)
            .await
            .unwrap(),
        1
    );
    let next = db
        .store
        .task_create(&new_task("next", "alice"), None, None, T0 + 10_000_003)
        .await
        .unwrap();
    assert!(next.seq > newest.seq, "{} reused", next.seq);
}
store_test!(task_purge_expired_deletes_task_job_and_history_t33_t34);

// change feed: change_feed (version, next_events, next_progress) / task_events_head

async fn change_feed_follows_every_transition_from_the_head(db: TestDb) {
    assert_eq!(db.store.task_events_head().await.unwrap(), 0, "empty feed");
    let mut feed = db
        .store
        .change_feed(CancellationToken::new())
        .await
        .unwrap();

    let a = db
        .store
        .task_create(&new_task("t-a", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("t-b", "alice"), None, None, T0 + 1)
        .await
        .unwrap();
    let head_after_create = db.store.task_events_head().await.unwrap();
    assert_eq!(head_after_create, 2);
    // A feed opened now starts at the head: it sees only what follows.
    let mut late = db
        .store
        .change_feed(CancellationToken::new())
        .await
        .unwrap();

    claim_one(&db.store, "w1", "lease-1", T0 + 2).await;
    db.store
        .job_complete(a.seq, "lease-1", &completed_outcome(), T0 + 3)
        .await
        .unwrap();
    db.store
        .task_cancel("t-b", "alice", "cancelled", T0 + 4)
        .await
        .unwrap();
    // A status message is not a transition.
    assert_eq!(db.store.task_events_head().await.unwrap(), 4);

    let first = feed.next_events(3).await.unwrap();
    let rest = feed.next_events(100).await.unwrap();
    let got: Vec<(i64, &str, TaskStatus)> = first
        .iter()
        .chain(&rest)
        .map(|e| (e.id, e.task_id.as_str(), e.to_status))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "t-a", TaskStatus::Working),
            (2, "t-b", TaskStatus::Working),
            (3, "t-a", TaskStatus::Completed),
            (4, "t-b", TaskStatus::Cancelled),
        ]
    );
    assert_eq!(first.len(), 3, "the limit holds");

    let tail = late.next_events(100).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.id).collect::<Vec<_>>(), vec![3, 4]);
    assert!(feed.next_events(100).await.unwrap().is_empty(), "read once");
}
store_test!(change_feed_follows_every_transition_from_the_head);

/// `ChangeFeed::version` stays while nothing is committed and moves after a
/// commit the feed reads (at once on SQLite; when the notification arrives
/// on PostgreSQL: a process kicks its own feed after its commits, so it
/// never waits for that).
async fn change_feed_version_moves_after_a_commit(db: TestDb) {
    let shutdown = CancellationToken::new();
    let mut feed = db.store.change_feed(shutdown.clone()).await.unwrap();
    let v1 = feed.version().await.unwrap();
    assert_eq!(feed.version().await.unwrap(), v1, "no commit, no change");

    db.store
        .task_create(&new_task("t-1", "alice"), None, None, T0)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while feed.version().await.unwrap() == v1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the version never moved after a commit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(feed.next_events(10).await.unwrap().len(), 1);
    shutdown.cancel();
}
store_test!(change_feed_version_moves_after_a_commit);

/// A commit from another handle on the database (another process),
/// announced as a process does after its commits: the feed's remote signal
/// fires, its version moves, and it reads what the other handle wrote.
async fn change_feed_wakes_when_another_handle_commits(db: TestDb) {
    let shutdown = CancellationToken::new();
    let mut feed = db.store.change_feed(shutdown.clone()).await.unwrap();
    let v1 = feed.version().await.unwrap();

    let other = store::open(db.location(), Durability::Full).await.unwrap();
    let other_feed = other.change_feed(shutdown.clone()).await.unwrap();
    let remote = feed.remote();
    let woken = remote.notified();
    other
        .task_create(&new_task("t-other", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    other.announce_commit();
    tokio::time::timeout(Duration::from_secs(10), woken)
        .await
        .expect("the other handle's commit wakes this feed");
    assert_ne!(feed.version().await.unwrap(), v1);

    let events = feed.next_events(10).await.unwrap();
    let got: Vec<(&str, TaskStatus)> = events
        .iter()
        .map(|e| (e.task_id.as_str(), e.to_status))
        .collect();
    assert_eq!(got, vec![("t-other", TaskStatus::Working)]);
    shutdown.cancel();
    // A feed holds a connection of its own: drop it before closing.
    drop(other_feed);
    other.close().await;
}
store_test!(change_feed_wakes_when_another_handle_commits);

async fn change_feed_reads_progress_reports_in_order(db: TestDb) {
    let mut feed = db
        .store
        .change_feed(CancellationToken::new())
        .await
        .unwrap();
    let row = db
        .store
        .task_create(&new_task("t-p", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-p", T0 + 1).await;
    for (i, msg) in ["one", "two", "three"].iter().enumerate() {
        db.store
            .task_record_progress(row.seq, "lease-p", i as f64 + 1.0, Some(3.0), msg, T0 + 2)
            .await
            .unwrap();
    }
    let got: Vec<(f64, Option<String>)> = feed
        .next_progress(10)
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.progress, p.message))
        .collect();
    assert_eq!(
        got,
        vec![
            (1.0, Some("one".to_owned())),
            (2.0, Some("two".to_owned())),
            (3.0, Some("three".to_owned())),
        ]
    );
    assert_lease_lost(
        db.store
            .task_record_progress(row.seq, "stranger", 4.0, None, "x", T0 + 3)
            .await,
    );
    assert!(feed.next_progress(10).await.unwrap().is_empty());
}
store_test!(change_feed_reads_progress_reports_in_order);

// sessions -----------------------------------------------------------------------

async fn session_create_get_touch_end(db: TestDb) {
    assert_eq!(db.store.session_get("s-1").await.unwrap(), None);

    let new = new_session("s-1");
    db.store.session_create(&new, T0).await.unwrap();
    let s = db.store.session_get("s-1").await.unwrap().unwrap();
    assert_eq!(s.session_id, "s-1");
    assert_eq!(s.protocol_version, "2025-11-25");
    assert_eq!(s.client_info, new.client_info);
    assert_eq!(s.client_capabilities, new.client_capabilities);
    assert_eq!(s.created_at, T0);
    assert_eq!(s.last_seen_at, T0);
    assert_eq!(s.ended_at, None);

    // touch moves last_seen_at forward only.
    db.store.session_touch("s-1", T0 + 60_000).await.unwrap();
    assert_eq!(
        db.store
            .session_get("s-1")
            .await
            .unwrap()
            .unwrap()
            .last_seen_at,
        T0 + 60_000
    );
    db.store.session_touch("s-1", T0 + 1).await.unwrap();
    assert_eq!(
        db.store
            .session_get("s-1")
            .await
            .unwrap()
            .unwrap()
            .last_seen_at,
        T0 + 60_000
    );
    // Touching an unknown session is harmless.
    db.store.session_touch("s-unknown", T0).await.unwrap();

    // end: true once, then false; unknown: false.
    assert!(db.store.session_end("s-1", T0 + 70_000).await.unwrap());
    assert!(!db.store.session_end("s-1", T0 + 80_000).await.unwrap());
    assert!(!db.store.session_end("s-unknown", T0).await.unwrap());
    let ended = db.store.session_get("s-1").await.unwrap().unwrap();
    assert_eq!(ended.ended_at, Some(T0 + 70_000), "first end wins");
    assert_eq!(ended.created_at, T0);

    // Duplicate ids are refused.
    assert!(db.store.session_create(&new, T0).await.is_err());
}
store_test!(session_create_get_touch_end);

async fn session_create_refuses_invalid_json(db: TestDb) {
    let mut bad = new_session("s-bad");
    bad.client_info = "{not json".to_owned();
    assert_db_refused(
        db.store.session_create(&bad, T0).await,
        &check_refusal(
            db.driver(),
            "json_valid(client_info)",
            "sessions_client_info_check",
        ),
    );
    assert_eq!(db.store.session_get("s-bad").await.unwrap(), None);
}
store_test!(session_create_refuses_invalid_json);

// job_claim_available -------------------------------------------------------------

async fn job_claim_available_priority_then_age(db: TestDb) {
    let raw = db.raw().await;
    // (task id, priority), created in this order.
    let specs = [
        ("p5-old", 5),
        ("p1-old", 1),
        ("p1-new", 1),
        ("p0", 0),
        ("p5-new", 5),
    ];
    for (i, (id, priority)) in specs.iter().enumerate() {
        let mut task = new_task(id, "alice");
        task.tool = format!("tool-{i}");
        task.progress_token = Some(format!("{i}"));
        db.store
            .task_create(
                &task,
                Some(NewJob {
                    max_attempts: 4,
                    priority: *priority,
                }),
                None,
                T0 + i64::try_from(i).unwrap(),
            )
            .await
            .unwrap();
    }
    let now = T0 + 100;
    let tools: Vec<ToolQuota> = (0..specs.len())
        .map(|i| ToolQuota {
            tool: format!("tool-{i}"),
            free: 10,
            global: None,
        })
        .collect();
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &tools, 10, LEASE_MS, now)
        .await
        .unwrap();
    let ids: Vec<&str> = claimed.iter().map(|j| j.task_id.as_str()).collect();
    assert_eq!(ids, vec!["p0", "p1-old", "p1-new", "p5-old", "p5-new"]);
    for j in &claimed {
        assert_eq!(j.attempt, 1);
        assert_eq!(j.max_attempts, 4);
        assert_eq!(j.lease_token, "lease-1", "one claim, one token");
        assert_eq!(j.arguments, r#"{"text":"hello"}"#);
        let row = get(&db.store, &j.task_id).await;
        assert_eq!(j.task_seq, row.seq);
        assert_eq!(j.tool, row.tool);
        assert_eq!(j.progress_token, row.progress_token);
        let state = job(&raw, j.task_seq).await.unwrap();
        assert_eq!(state.state, "running");
        assert_eq!(state.lease_owner.as_deref(), Some("w1"));
        assert_eq!(state.lease_token.as_deref(), Some("lease-1"));
        assert_eq!(state.lease_expires_at, Some(now + LEASE_MS));
    }
    // Running jobs are not claimed again.
    assert!(
        db.store
            .job_claim_available("w2", "lease-2", &echo(10), 10, LEASE_MS, now)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(job_claim_available_priority_then_age);

async fn job_claim_available_respects_limit(db: TestDb) {
    for i in 0..5 {
        db.store
            .task_create(
                &new_task(&format!("t-{i}"), "alice"),
                Some(JOB),
                None,
                T0 + i,
            )
            .await
            .unwrap();
    }
    let now = T0 + 100;
    let first = db
        .store
        .job_claim_available("w1", "lease-1", &echo(2), 2, LEASE_MS, now)
        .await
        .unwrap();
    let ids: Vec<&str> = first.iter().map(|j| j.task_id.as_str()).collect();
    assert_eq!(ids, vec!["t-0", "t-1"]);
    let second = db
        .store
        .job_claim_available("w2", "lease-2", &echo(2), 2, LEASE_MS, now)
        .await
        .unwrap();
    let ids: Vec<&str> = second.iter().map(|j| j.task_id.as_str()).collect();
    assert_eq!(ids, vec!["t-2", "t-3"]);
    assert!(second.iter().all(|j| j.lease_token == "lease-2"));
    let third = db
        .store
        .job_claim_available("w3", "lease-3", &echo(2), 2, LEASE_MS, now)
        .await
        .unwrap();
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].task_id, "t-4");
    assert!(
        db.store
            .job_claim_available("w4", "lease-4", &echo(2), 2, LEASE_MS, now)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(job_claim_available_respects_limit);

async fn job_claim_available_skips_run_after_in_the_future(db: TestDb) {
    // run_after = creation time.
    db.store
        .task_create(&new_task("early", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("late", "alice"), Some(JOB), None, T0 + 5_000)
        .await
        .unwrap();
    assert!(
        db.store
            .job_claim_available("w1", "lease-0", &echo(10), 10, LEASE_MS, T0 - 1)
            .await
            .unwrap()
            .is_empty(),
        "nothing is runnable before its run_after"
    );
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(10), 10, LEASE_MS, T0 + 4_999)
        .await
        .unwrap();
    assert_eq!(
        claimed
            .iter()
            .map(|j| j.task_id.as_str())
            .collect::<Vec<_>>(),
        vec!["early"]
    );
    // run_after <= now: runnable exactly at run_after.
    let claimed = db
        .store
        .job_claim_available("w1", "lease-2", &echo(10), 10, LEASE_MS, T0 + 5_000)
        .await
        .unwrap();
    assert_eq!(
        claimed
            .iter()
            .map(|j| j.task_id.as_str())
            .collect::<Vec<_>>(),
        vec!["late"]
    );
}
store_test!(job_claim_available_skips_run_after_in_the_future);

// job_heartbeat ----------------------------------------------------------------------

async fn job_heartbeat_extends_lease(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    assert_eq!(
        job(&raw, row.seq).await.unwrap().lease_expires_at,
        Some(T0 + LEASE_MS)
    );

    let beat_at = T0 + LEASE_MS / 2;
    let hb = db
        .store
        .job_heartbeat(row.seq, "lease-1", LEASE_MS, beat_at)
        .await
        .unwrap();
    assert!(!hb.cancel_requested);
    assert_eq!(
        job(&raw, row.seq).await.unwrap().lease_expires_at,
        Some(beat_at + LEASE_MS)
    );

    // The original lease would have expired here; the extended one has not.
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, T0 + LEASE_MS + 1)
        .await
        .unwrap();
    assert_eq!(report, RescueReport::default());
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "running");
    assert_eq!(j.lease_token.as_deref(), Some("lease-1"));
}
store_test!(job_heartbeat_extends_lease);

async fn job_heartbeat_reports_cancel_requested(db: TestDb) {
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    let hb = db
        .store
        .job_heartbeat(row.seq, "lease-1", LEASE_MS, T0 + 1)
        .await
        .unwrap();
    assert!(!hb.cancel_requested);
    db.store
        .task_cancel("t-1", "alice", "cancelled", T0 + 2)
        .await
        .unwrap();
    let hb = db
        .store
        .job_heartbeat(row.seq, "lease-1", LEASE_MS, T0 + 3)
        .await
        .unwrap();
    assert!(hb.cancel_requested, "the worker learns of the cancel");
}
store_test!(job_heartbeat_reports_cancel_requested);

async fn job_heartbeat_lease_lost_with_wrong_token(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    // Not claimed yet.
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq, "lease-1", LEASE_MS, T0)
            .await,
    );
    claim_one(&db.store, "w1", "lease-1", T0).await;
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq, "lease-wrong", LEASE_MS, T0 + 1)
            .await,
    );
    assert_eq!(
        job(&raw, row.seq).await.unwrap().lease_expires_at,
        Some(T0 + LEASE_MS),
        "a wrong token extends nothing"
    );
    // Unknown task.
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq + 100, "lease-1", LEASE_MS, T0 + 1)
            .await,
    );
    // After completion the token is spent.
    db.store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 2)
        .await
        .unwrap();
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq, "lease-1", LEASE_MS, T0 + 3)
            .await,
    );
}
store_test!(job_heartbeat_lease_lost_with_wrong_token);

// job_complete -------------------------------------------------------------------------

async fn job_complete_records_outcome_and_closes_job(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let outcome = completed_outcome();
    assert!(
        db.store
            .job_complete(row.seq, "lease-1", &outcome, T0 + 500)
            .await
            .unwrap()
    );
    let after = get(&db.store, "t-1").await;
    assert_eq!(after.status, TaskStatus::Completed);
    assert_eq!(after.result.as_deref(), Some(outcome.result.as_str()));
    assert_eq!(after.result_kind, Some(ResultKind::Result));
    assert_eq!(after.updated_at, T0 + 500, "T-13");
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.lease_token, None);
    assert_eq!(j.lease_expires_at, None);
    assert_eq!(j.finished_at, Some(T0 + 500));
    assert_eq!(
        history(&raw, "t-1").await,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "completed".to_owned(),
                None,
                T0 + 500
            ),
        ]
    );
    // A second completion with the same token is fenced out.
    assert_lease_lost(
        db.store
            .job_complete(row.seq, "lease-1", &failed_outcome("late"), T0 + 600)
            .await,
    );
    assert_eq!(get(&db.store, "t-1").await, after);
}
store_test!(job_complete_records_outcome_and_closes_job);

async fn job_complete_with_wrong_token_writes_nothing(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let task_before = get(&db.store, "t-1").await;
    let job_before = job(&raw, row.seq).await.unwrap();

    assert_lease_lost(
        db.store
            .job_complete(row.seq, "lease-wrong", &completed_outcome(), T0 + 2)
            .await,
    );
    assert_eq!(get(&db.store, "t-1").await, task_before, "task untouched");
    assert_eq!(
        job(&raw, row.seq).await.unwrap(),
        job_before,
        "job untouched"
    );
    assert_eq!(history(&raw, "t-1").await.len(), 1);

    // The rightful holder still completes.
    assert!(
        db.store
            .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 3)
            .await
            .unwrap()
    );
}
store_test!(job_complete_with_wrong_token_writes_nothing);

async fn job_complete_after_cancel_returns_false_and_task_stays_cancelled_t22(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    db.store
        .task_cancel("t-1", "alice", "cancelled by client", T0 + 2)
        .await
        .unwrap();
    let cancelled = get(&db.store, "t-1").await;

    // The tool finished anyway: its outcome is dropped (T-22).
    let took = db
        .store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 3)
        .await
        .unwrap();
    assert!(!took);
    let after = get(&db.store, "t-1").await;
    assert_eq!(after, cancelled, "cancelled stays cancelled, no result");
    assert_eq!(after.status, TaskStatus::Cancelled);
    assert_eq!(after.result, None);

    // The job itself is closed.
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.lease_token, None);
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![tr(None, "working"), tr(Some("working"), "cancelled")]
    );
}
store_test!(job_complete_after_cancel_returns_false_and_task_stays_cancelled_t22);

async fn job_complete_by_stale_worker_after_rescue_is_fenced(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    // w1 hangs; its lease expires and the job goes to w2.
    let rescue_at = T0 + LEASE_MS + 1;
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, rescue_at)
        .await
        .unwrap();
    assert_eq!(report.requeued, 1);
    let run_after = job(&raw, row.seq).await.unwrap().run_after;
    let second = claim_one(&db.store, "w2", "lease-2", run_after).await;
    assert_eq!(second.attempt, 2);

    // w1 wakes up and tries to write: fenced.
    assert_lease_lost(
        db.store
            .job_complete(row.seq, "lease-1", &failed_outcome("stale"), run_after + 1)
            .await,
    );
    assert_lease_lost(
        db.store
            .task_set_status_message(row.seq, "lease-1", "stale", run_after + 1)
            .await,
    );
    assert_lease_lost(
        db.store
            .job_heartbeat(row.seq, "lease-1", LEASE_MS, run_after + 1)
            .await,
    );
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Working);

    assert!(
        db.store
            .job_complete(row.seq, "lease-2", &completed_outcome(), run_after + 2)
            .await
            .unwrap()
    );
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Completed);
}
store_test!(job_complete_by_stale_worker_after_rescue_is_fenced);

// job_finish_cancelled --------------------------------------------------------------------

async fn job_finish_cancelled_closes_the_job_fenced(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    db.store
        .task_cancel("t-1", "alice", "cancelled", T0 + 1)
        .await
        .unwrap();
    let cancelled = get(&db.store, "t-1").await;

    assert_lease_lost(
        db.store
            .job_finish_cancelled(row.seq, "lease-wrong", T0 + 2)
            .await,
    );
    assert_eq!(job(&raw, row.seq).await.unwrap().state, "running");

    db.store
        .job_finish_cancelled(row.seq, "lease-1", T0 + 3)
        .await
        .unwrap();
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.lease_token, None);
    assert_eq!(j.lease_expires_at, None);
    assert_eq!(j.finished_at, Some(T0 + 3));
    assert_eq!(j.last_error.as_deref(), Some("cancelled"));
    assert_eq!(get(&db.store, "t-1").await, cancelled, "task untouched");

    // Only once.
    assert_lease_lost(
        db.store
            .job_finish_cancelled(row.seq, "lease-1", T0 + 4)
            .await,
    );
}
store_test!(job_finish_cancelled_closes_the_job_fenced);

// job_rescue_expired ------------------------------------------------------------------------

async fn job_rescue_expired_leaves_live_leases_alone(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    // Queued jobs are not the rescuer's business.
    assert_eq!(
        db.store
            .job_rescue_expired(BACKOFF_MS, T0 + 10 * LEASE_MS)
            .await
            .unwrap(),
        RescueReport::default()
    );
    claim_one(&db.store, "w1", "lease-1", T0).await;
    assert_eq!(
        db.store
            .job_rescue_expired(BACKOFF_MS, T0 + LEASE_MS - 1)
            .await
            .unwrap(),
        RescueReport::default()
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "running");
    assert_eq!(j.lease_token.as_deref(), Some("lease-1"));
}
store_test!(job_rescue_expired_leaves_live_leases_alone);

async fn job_rescue_expired_requeues_with_backoff_while_attempts_remain(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;

    let rescue_at = T0 + LEASE_MS + 1;
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, rescue_at)
        .await
        .unwrap();
    assert_eq!(
        report,
        RescueReport {
            requeued: 1,
            failed: vec![],
            closed: 0
        }
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "queued");
    assert_eq!(j.lease_token, None);
    assert_eq!(j.lease_expires_at, None);
    assert_eq!(j.attempt, 1);
    assert_eq!(j.last_error.as_deref(), Some("lease expired on attempt 1"));
    assert!(
        j.run_after > rescue_at,
        "run_after {} is in the future of {rescue_at}",
        j.run_after
    );
    assert!(
        j.run_after <= rescue_at + BACKOFF_MS + JITTER_MAX_MS,
        "backoff * attempt + jitter: {}",
        j.run_after - rescue_at
    );
    assert!(j.run_after >= rescue_at + BACKOFF_MS);
    // The task itself is still working, history unchanged.
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Working);
    assert_eq!(history(&raw, "t-1").await.len(), 1);

    // Not claimable before run_after; claimable at it, as attempt 2.
    assert!(
        db.store
            .job_claim_available("w2", "lease-2", &echo(10), 10, LEASE_MS, j.run_after - 1)
            .await
            .unwrap()
            .is_empty()
    );
    let again = claim_one(&db.store, "w2", "lease-2", j.run_after).await;
    assert_eq!(again.attempt, 2);
    assert_eq!(again.task_seq, row.seq);

    // Second loss: backoff grows with the attempt number.
    let rescue2 = j.run_after + LEASE_MS;
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, rescue2)
        .await
        .unwrap();
    assert_eq!(report.requeued, 1);
    let j2 = job(&raw, row.seq).await.unwrap();
    assert!(j2.run_after >= rescue2 + 2 * BACKOFF_MS);
    assert!(j2.run_after <= rescue2 + 2 * BACKOFF_MS + JITTER_MAX_MS);
    assert_eq!(j2.last_error.as_deref(), Some("lease expired on attempt 2"));
}
store_test!(job_rescue_expired_requeues_with_backoff_while_attempts_remain);

async fn job_rescue_expired_fails_task_when_attempts_are_exhausted(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(
            &new_task("t-1", "alice"),
            Some(NewJob {
                max_attempts: 2,
                priority: 0,
            }),
            None,
            T0,
        )
        .await
        .unwrap();

    // Attempt 1 lost: requeued.
    claim_one(&db.store, "w1", "lease-1", T0).await;
    let r1 = T0 + LEASE_MS;
    assert_eq!(
        db.store
            .job_rescue_expired(BACKOFF_MS, r1)
            .await
            .unwrap()
            .requeued,
        1
    );
    let run_after = job(&raw, row.seq).await.unwrap().run_after;

    // Attempt 2 lost: no attempts left, the task fails.
    let second = claim_one(&db.store, "w2", "lease-2", run_after).await;
    assert_eq!(second.attempt, 2);
    let r2 = run_after + LEASE_MS + 1;
    let report = db.store.job_rescue_expired(BACKOFF_MS, r2).await.unwrap();
    assert_eq!(
        report,
        RescueReport {
            requeued: 0,
            failed: vec!["echo".to_owned()],
            closed: 0
        }
    );

    let task = get(&db.store, "t-1").await;
    assert_eq!(task.status, TaskStatus::Failed);
    let message = task.status_message.clone().unwrap();
    assert!(message.contains("worker lost"), "{message}");
    assert!(message.contains('2'), "says how many times: {message}");
    assert_eq!(task.result_kind, Some(ResultKind::Error));
    let error: serde_json::Value = serde_json::from_str(task.result.as_deref().unwrap()).unwrap();
    assert_eq!(error["code"], serde_json::json!(-32603));
    assert!(
        error["message"].as_str().unwrap().contains("worker lost"),
        "{error}"
    );
    assert_eq!(task.updated_at, r2, "T-13");

    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.lease_token, None);
    assert_eq!(j.finished_at, Some(r2));
    assert_eq!(
        j.last_error.as_deref(),
        Some("lease expired on attempt 2; no attempts left")
    );
    assert_eq!(
        history(&raw, "t-1").await,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "failed".to_owned(),
                Some(message),
                r2
            ),
        ]
    );

    // The stale worker cannot overwrite the failure.
    assert_lease_lost(
        db.store
            .job_complete(row.seq, "lease-2", &completed_outcome(), r2 + 1)
            .await,
    );
    // And nothing is left to rescue or claim.
    assert_eq!(
        db.store
            .job_rescue_expired(BACKOFF_MS, r2 + 10 * LEASE_MS)
            .await
            .unwrap(),
        RescueReport::default()
    );
    assert!(
        db.store
            .job_claim_available("w3", "lease-3", &echo(10), 10, LEASE_MS, r2 + 10 * LEASE_MS)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(job_rescue_expired_fails_task_when_attempts_are_exhausted);

async fn job_rescue_expired_closes_jobs_of_cancelled_tasks_t22(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    db.store
        .task_cancel("t-1", "alice", "cancelled", T0 + 1)
        .await
        .unwrap();
    let cancelled = get(&db.store, "t-1").await;

    // The worker vanished without finishing the cancelled job.
    let at = T0 + LEASE_MS + 1;
    let report = db.store.job_rescue_expired(BACKOFF_MS, at).await.unwrap();
    assert_eq!(
        report,
        RescueReport {
            requeued: 0,
            failed: vec![],
            closed: 1
        }
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(
        j.state, "done",
        "not requeued: attempts remained but the task is cancelled"
    );
    assert_eq!(j.attempt, 1);
    assert_eq!(j.lease_token, None);
    assert_eq!(j.finished_at, Some(at));
    assert_eq!(j.last_error.as_deref(), Some("cancelled; worker lost"));
    assert_eq!(
        get(&db.store, "t-1").await,
        cancelled,
        "T-22: stays cancelled"
    );
    assert!(
        db.store
            .job_claim_available("w2", "lease-2", &echo(10), 10, LEASE_MS, at + 10 * LEASE_MS)
            .await
            .unwrap()
            .is_empty()
    );
}
store_test!(job_rescue_expired_closes_jobs_of_cancelled_tasks_t22);

async fn job_rescue_expired_mixed_batch_counts_each_kind(db: TestDb) {
    let single = NewJob {
        max_attempts: 1,
        priority: 0,
    };
    db.store
        .task_create(&new_task("retry", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("exhausted", "alice"), Some(single), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("cancelled", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(
            &new_task("cancelled-exhausted", "alice"),
            Some(single),
            None,
            T0,
        )
        .await
        .unwrap();
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(10), 10, LEASE_MS, T0)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4);
    for id in ["cancelled", "cancelled-exhausted"] {
        db.store
            .task_cancel(id, "alice", "cancelled", T0 + 1)
            .await
            .unwrap();
    }
    let report = db
        .store
        .job_rescue_expired(BACKOFF_MS, T0 + LEASE_MS)
        .await
        .unwrap();
    assert_eq!(
        report,
        RescueReport {
            requeued: 1,
            failed: vec!["echo".to_owned()],
            closed: 2
        }
    );
    assert_eq!(get(&db.store, "retry").await.status, TaskStatus::Working);
    assert_eq!(get(&db.store, "exhausted").await.status, TaskStatus::Failed);
    assert_eq!(
        get(&db.store, "cancelled").await.status,
        TaskStatus::Cancelled
    );
    assert_eq!(
        get(&db.store, "cancelled-exhausted").await.status,
        TaskStatus::Cancelled
    );
}
store_test!(job_rescue_expired_mixed_batch_counts_each_kind);

// Two claimers, two handles on one database ---------------------------------------------------

/// Two `Store` handles on one database, as two broker processes would have.
async fn two_handles(db: &TestDb) -> (Store, Store) {
    let a = store::open(db.location(), Durability::Full).await.unwrap();
    let b = store::open(db.location(), Durability::Full).await.unwrap();
    (a, b)
}

async fn two_claimers_racing_for_one_job_exactly_one_wins(db: TestDb) {
    let raw = db.raw().await;
    let (a, b) = two_handles(&db).await;
    let mut wins = (0u32, 0u32);

    for round in 0..50i64 {
        let now = T0 + round * 10;
        let task = a
            .task_create(
                &new_task(&format!("race-{round}"), "alice"),
                Some(JOB),
                None,
                now,
            )
            .await
            .unwrap();

        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let spawn_claim = |store: &Store, worker: &'static str| {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            let token = format!("{worker}-lease-{round}");
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .job_claim_available(worker, &token, &echo(5), 5, LEASE_MS, now)
                    .await
            })
        };
        let ha = spawn_claim(&a, "worker-a");
        let hb = spawn_claim(&b, "worker-b");
        let (ra, rb) = tokio::join!(ha, hb);
        let ra = ra
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: claimer a failed: {e}"));
        let rb = rb
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: claimer b failed: {e}"));

        assert_eq!(
            ra.len() + rb.len(),
            1,
            "round {round}: exactly one claimer gets the job (a: {ra:?}, b: {rb:?})"
        );
        let (winner, worker) = if ra.len() == 1 {
            wins.0 += 1;
            (&ra[0], "worker-a")
        } else {
            wins.1 += 1;
            (&rb[0], "worker-b")
        };
        assert_eq!(winner.task_seq, task.seq);
        assert_eq!(winner.attempt, 1);
        let j = job(&raw, task.seq).await.unwrap();
        assert_eq!(j.state, "running");
        assert_eq!(j.attempt, 1, "round {round}: claimed once, not twice");
        assert_eq!(j.lease_owner.as_deref(), Some(worker));
        assert_eq!(j.lease_token.as_deref(), Some(winner.lease_token.as_str()));
    }
    // Who wins is up to the scheduler; only the totals are fixed.
    eprintln!("wins: worker-a {}, worker-b {}", wins.0, wins.1);
    assert_eq!(wins.0 + wins.1, 50, "wins: {wins:?}");
    a.close().await;
    b.close().await;
}
store_test!(
    #[multi_thread]
    two_claimers_racing_for_one_job_exactly_one_wins
);

async fn two_claimers_draining_one_queue_never_share_a_job(db: TestDb) {
    let (a, b) = two_handles(&db).await;
    let mut all = HashSet::new();
    for i in 0..40 {
        let row = db
            .store
            .task_create(&new_task(&format!("t-{i}"), "alice"), Some(JOB), None, T0)
            .await
            .unwrap();
        all.insert(row.seq);
    }
    let drain = |store: Store, worker: &'static str| {
        tokio::spawn(async move {
            let mut got = Vec::new();
            for n in 0.. {
                let token = format!("{worker}-{n}");
                let jobs = store
                    .job_claim_available(worker, &token, &echo(3), 3, LEASE_MS, T0 + 1)
                    .await
                    .unwrap_or_else(|e| panic!("{worker}: claim failed: {e}"));
                if jobs.is_empty() {
                    break;
                }
                assert!(jobs.len() <= 3);
                got.extend(jobs.into_iter().map(|j| j.task_seq));
            }
            got
        })
    };
    let (ga, gb) = tokio::join!(drain(a.clone(), "worker-a"), drain(b.clone(), "worker-b"));
    let (ga, gb) = (ga.unwrap(), gb.unwrap());
    let sa: HashSet<i64> = ga.iter().copied().collect();
    let sb: HashSet<i64> = gb.iter().copied().collect();
    assert_eq!(sa.len(), ga.len(), "a never got a job twice");
    assert_eq!(sb.len(), gb.len(), "b never got a job twice");
    assert!(sa.is_disjoint(&sb), "no job went to both claimers");
    let union: HashSet<i64> = sa.union(&sb).copied().collect();
    assert_eq!(union, all, "every job claimed");
    a.close().await;
    b.close().await;
}
store_test!(
    #[multi_thread]
    two_claimers_draining_one_queue_never_share_a_job
);

// The database itself enforces the lifecycle (raw SQL) -------------------------------------------

/// Insert a working task directly; returns its seq.
async fn raw_insert_task(raw: &Raw, task_id: &'static str, at: i64) -> i64 {
    raw.scalar(
        "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
         VALUES ($1, 'alice', 'echo', '{}', 'working', $2, $2) RETURNING seq",
        args![task_id, at],
    )
    .await
    .expect("insert working task")
}

/// Move a task to a terminal status directly (an allowed transition).
async fn raw_finish(raw: &Raw, seq: i64, status: &'static str, at: i64) {
    let (result, kind) = match status {
        "completed" => (Some(r#"{"content":[]}"#), Some("result")),
        "failed" => (Some(r#"{"code":-32603,"message":"x"}"#), Some("error")),
        _ => (None, None),
    };
    raw.execute(
        "UPDATE tasks SET status = $1, result = $2, result_kind = $3, updated_at = $4 WHERE seq = $5",
        args![status, result, kind, at, seq],
    )
    .await
    .expect("allowed transition to a terminal status");
}

async fn raw_sql_insert_must_start_working_t9(db: TestDb) {
    let raw = db.raw().await;
    for status in ["completed", "failed", "cancelled", "input_required"] {
        let result = raw
            .execute(
                "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
                 VALUES ($1, 'alice', 'echo', '{}', $2, 0, 0)",
                args![format!("t-{status}"), status],
            )
            .await;
        assert_refused(result, "a task must start in status working (T-9)");
    }
    let tasks = count_all(&raw, "SELECT COUNT(*) FROM tasks").await;
    let events = count_all(&raw, "SELECT COUNT(*) FROM task_events").await;
    assert_eq!((tasks, events), (0, 0), "nothing inserted, no history");
}
store_test!(raw_sql_insert_must_start_working_t9);

async fn raw_sql_allowed_transitions_write_one_history_row_each_t11(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;

    // working -> working is not a transition: allowed, no history row.
    raw.execute(
        "UPDATE tasks SET status = 'working', status_message = 'still going', updated_at = $1
          WHERE seq = $2",
        args![T0 + 1, seq],
    )
    .await
    .unwrap();
    // working -> input_required -> working -> completed: all allowed.
    for (status, at) in [
        ("input_required", T0 + 2),
        ("working", T0 + 3),
        ("input_required", T0 + 4),
    ] {
        raw.execute(
            "UPDATE tasks SET status = $1, status_message = $2, updated_at = $3 WHERE seq = $4",
            args![status, format!("now {status}"), at, seq],
        )
        .await
        .unwrap_or_else(|e| panic!("transition to {status} refused: {e}"));
    }
    raw_finish(&raw, seq, "completed", T0 + 5).await;

    assert_eq!(
        history(&raw, "t-1").await,
        vec![
            (None, "working".to_owned(), None, T0),
            (
                Some("working".to_owned()),
                "input_required".to_owned(),
                Some("now input_required".to_owned()),
                T0 + 2
            ),
            (
                Some("input_required".to_owned()),
                "working".to_owned(),
                Some("now working".to_owned()),
                T0 + 3
            ),
            (
                Some("working".to_owned()),
                "input_required".to_owned(),
                Some("now input_required".to_owned()),
                T0 + 4
            ),
            (
                Some("input_required".to_owned()),
                "completed".to_owned(),
                Some("now input_required".to_owned()),
                T0 + 5
            ),
        ],
        "exactly one history row per transition, written by the triggers"
    );

    // input_required -> failed and -> cancelled, working -> failed/cancelled.
    for (id, via_input, terminal) in [
        ("t-2", true, "failed"),
        ("t-3", true, "cancelled"),
        ("t-4", false, "failed"),
        ("t-5", false, "cancelled"),
    ] {
        let seq = raw_insert_task(&raw, id, T0).await;
        if via_input {
            raw.execute(
                "UPDATE tasks SET status = 'input_required', updated_at = $1 WHERE seq = $2",
                args![T0 + 1, seq],
            )
            .await
            .unwrap();
        }
        raw_finish(&raw, seq, terminal, T0 + 2).await;
        let expected = if via_input {
            vec![
                tr(None, "working"),
                tr(Some("working"), "input_required"),
                tr(Some("input_required"), terminal),
            ]
        } else {
            vec![tr(None, "working"), tr(Some("working"), terminal)]
        };
        assert_eq!(transitions(&raw, id).await, expected, "{id}");
    }
}
store_test!(raw_sql_allowed_transitions_write_one_history_row_each_t11);

async fn raw_sql_terminal_tasks_never_change_t11(db: TestDb) {
    let raw = db.raw().await;
    let mut seqs = Vec::new();
    for (id, status) in [
        ("t-completed", "completed"),
        ("t-failed", "failed"),
        ("t-cancelled", "cancelled"),
    ] {
        let seq = raw_insert_task(&raw, id, T0).await;
        raw_finish(&raw, seq, status, T0 + 1).await;
        seqs.push((id, seq, status));
    }
    let terminal_msg = T11_TERMINAL;
    for (id, seq, status) in seqs {
        let before = get(&db.store, id).await;
        // Back to working (also an illegal transition): refused.
        let r = raw
            .execute(
                "UPDATE tasks SET status = 'working', updated_at = $1 WHERE seq = $2",
                args![T0 + 2, seq],
            )
            .await;
        assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
        // To another terminal status: refused.
        let other = if status == "cancelled" {
            "failed"
        } else {
            "cancelled"
        };
        let r = raw
            .execute(
                "UPDATE tasks SET status = $1, result = NULL, result_kind = NULL, updated_at = $2
                  WHERE seq = $3",
                args![other, T0 + 2, seq],
            )
            .await;
        assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
        // Any other column: refused by the terminal trigger.
        for sql in [
            "UPDATE tasks SET status_message = 'rewritten' WHERE seq = $1",
            "UPDATE tasks SET updated_at = updated_at + 1 WHERE seq = $1",
            "UPDATE tasks SET poll_interval_ms = 1 WHERE seq = $1",
            // Even a no-op update of a terminal row is refused.
            "UPDATE tasks SET status = status WHERE seq = $1",
        ] {
            let r = raw.execute(sql, args![seq]).await;
            assert_refused(r, terminal_msg);
        }
        if status != "cancelled" {
            let r = raw
                .execute("UPDATE tasks SET result = '{}' WHERE seq = $1", args![seq])
                .await;
            assert_refused(r, terminal_msg);
        }
        assert_eq!(get(&db.store, id).await, before, "{id} unchanged");
        assert_eq!(transitions(&raw, id).await.len(), 2, "{id}: no new history");
    }
}
store_test!(raw_sql_terminal_tasks_never_change_t11);

async fn raw_sql_completed_to_working_refused_t11(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw_finish(&raw, seq, "completed", T0 + 1).await;
    let r = raw
        .execute(
            "UPDATE tasks SET status = 'working', result = NULL, result_kind = NULL WHERE seq = $1",
            args![seq],
        )
        .await;
    assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Completed);
}
store_test!(raw_sql_completed_to_working_refused_t11);

async fn raw_sql_identity_columns_are_immutable(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    let before = get(&db.store, "t-1").await;
    let msg = "task identity columns are immutable";
    let statements: [&'static str; 7] = [
        "UPDATE tasks SET task_id = 't-other' WHERE seq = $1",
        "UPDATE tasks SET owner = 'mallory' WHERE seq = $1",
        "UPDATE tasks SET created_at = created_at - 1 WHERE seq = $1",
        "UPDATE tasks SET tool = 'rm' WHERE seq = $1",
        "UPDATE tasks SET arguments = '{\"x\":1}' WHERE seq = $1",
        "UPDATE tasks SET ttl_ms = 5, expires_at = created_at + 5 WHERE seq = $1",
        "UPDATE tasks SET seq = seq + 1000 WHERE seq = $1",
    ];
    for sql in statements {
        let r = raw.execute(sql, args![seq]).await;
        assert_refused(r, msg);
    }
    // Setting a column to its own value is not a change.
    raw.execute(
        "UPDATE tasks SET owner = owner, task_id = task_id WHERE seq = $1",
        args![seq],
    )
    .await
    .unwrap();
    assert_eq!(get(&db.store, "t-1").await, before);
}
store_test!(raw_sql_identity_columns_are_immutable);

async fn raw_sql_updated_at_never_moves_backwards_t13(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw.execute(
        "UPDATE tasks SET updated_at = $1 WHERE seq = $2",
        args![T0 + 100, seq],
    )
    .await
    .unwrap();
    let r = raw
        .execute(
            "UPDATE tasks SET status_message = 'x', updated_at = $1 WHERE seq = $2",
            args![T0 + 99, seq],
        )
        .await;
    assert_refused(r, "updated_at cannot move backwards");
    let row = get(&db.store, "t-1").await;
    assert_eq!(row.updated_at, T0 + 100);
    assert_eq!(row.status_message, None);
}
store_test!(raw_sql_updated_at_never_moves_backwards_t13);

async fn raw_sql_task_events_are_append_only(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw_finish(&raw, seq, "completed", T0 + 1).await;

    let r = raw
        .execute("DELETE FROM task_events WHERE task_seq = $1", args![seq])
        .await;
    assert_refused(r, "task_events of an existing task cannot be deleted");
    let r = raw
        .execute(
            "UPDATE task_events SET to_status = 'failed' WHERE task_seq = $1",
            args![seq],
        )
        .await;
    assert_refused(r, "task_events is append-only");
    let r = raw
        .execute(
            "UPDATE task_events SET message = 'edited' WHERE task_seq = $1",
            args![seq],
        )
        .await;
    assert_refused(r, "task_events is append-only");
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![tr(None, "working"), tr(Some("working"), "completed")]
    );

    // Deleting the task (what the ttl purge does) takes its history along.
    raw.execute("DELETE FROM tasks WHERE seq = $1", args![seq])
        .await
        .unwrap();
    assert!(history(&raw, "t-1").await.is_empty());
}
store_test!(raw_sql_task_events_are_append_only);

async fn raw_sql_unknown_status_value_refused_by_check(db: TestDb) {
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    let update_to_done = "UPDATE tasks SET status = 'done', updated_at = $1 WHERE seq = $2";
    let insert_done =
        "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
                       VALUES ('t-done', 'alice', 'echo', '{}', 'done', 0, 0)";

    // Through the triggers, 'done' is refused (it is no allowed transition,
    // and no allowed initial status).
    let r = raw.execute(update_to_done, args![T0 + 1, seq]).await;
    assert_refused(r, T11_TRANSITION);
    let r = raw.execute(insert_done, args![]).await;
    assert_refused(r, "a task must start in status working (T-9)");

    // Behind the triggers the CHECK itself holds: drop the triggers inside a
    // transaction (rolled back), then try again. (One transaction per
    // attempt: PostgreSQL takes no statement after an error until the
    // rollback.)
    let (drop_triggers, count_triggers) = match db.driver() {
        Driver::Sqlite => (
            "DROP TRIGGER tasks_insert_working;
             DROP TRIGGER tasks_transition_allowed;",
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'
                AND name IN ('tasks_insert_working', 'tasks_transition_allowed')",
        ),
        Driver::Postgres => (
            "DROP TRIGGER tasks_insert_working ON tasks;
             DROP TRIGGER tasks_transition_allowed ON tasks;",
            "SELECT COUNT(*) FROM pg_trigger
              WHERE tgname IN ('tasks_insert_working', 'tasks_transition_allowed')",
        ),
    };
    let refusal = check_refusal(db.driver(), "status IN (", "tasks_status_check");
    let attempts: [(&'static str, &[Arg]); 2] =
        [(update_to_done, args![T0 + 1, seq]), (insert_done, args![])];
    for (sql, args) in attempts {
        on_pool!(&raw, |pool| {
            let mut tx = pool.begin().await.unwrap();
            sqlx::raw_sql(drop_triggers)
                .execute(&mut *tx)
                .await
                .unwrap();
            let r = bind_all!(sqlx::query(sql), args).execute(&mut *tx).await;
            assert_refused(r, &refusal);
            tx.rollback().await.unwrap();
        });
    }

    // The rollback restored the triggers.
    assert_eq!(count_all(&raw, count_triggers).await, 2);
    let row = get(&db.store, "t-1").await;
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(history(&raw, "t-1").await.len(), 1);
}
store_test!(raw_sql_unknown_status_value_refused_by_check);

// Group commit (write_batch) --------------------------------------------------

/// A creation for `write_batch`.
fn create_op(new: NewTask, job: Option<NewJob>, outcome: Option<TaskOutcome>) -> Write {
    Write::Create { new, job, outcome }
}

/// A completion for `write_batch`.
fn complete_op(task_seq: i64, token: &str, outcome: TaskOutcome) -> Write {
    Write::Complete {
        task_seq,
        task_id: String::new(),
        lease_token: token.to_owned(),
        outcome,
    }
}

/// The row a batch's creation answered.
fn created(done: Result<Written, StoreError>) -> Result<TaskRow, StoreError> {
    match done? {
        Written::Created(row) => Ok(row),
        other => panic!("expected a created row, got {other:?}"),
    }
}

/// What a batch's completion answered.
fn completed(done: Result<Written, StoreError>) -> Result<bool, StoreError> {
    match done? {
        Written::Completed(took) => Ok(took),
        other => panic!("expected a completion, got {other:?}"),
    }
}

/// Grouped path: creations and completions of one batch in one commit; a
/// lost lease answers LeaseLost for that write alone (T-9, T-22 fencing).
async fn write_batch_groups_creations_and_completions(db: TestDb) {
    let raw = db.raw().await;
    let a = db
        .store
        .task_create(&new_task("a", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let b = db
        .store
        .task_create(&new_task("b", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    let claimed = db
        .store
        .job_claim_available("w1", "lease-1", &echo(10), 10, LEASE_MS, T0 + 1)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(
        claimed.iter().all(|j| j.progress_token.is_none()),
        "a NULL column stays None: {claimed:?}"
    );
    let mut ops = Vec::new();
    for id in ["n1", "n2", "n3"] {
        ops.push(create_op(new_task(id, "bob"), Some(JOB), None));
    }
    ops.push(complete_op(a.seq, "lease-1", completed_outcome()));
    ops.push(complete_op(b.seq, "not-the-lease", completed_outcome()));
    let mut done = db
        .store
        .write_batch(&ops, T0 + 10)
        .await
        .unwrap()
        .into_iter();
    let news: Vec<_> = done.by_ref().take(3).collect();
    let done_a = done.next().unwrap();
    let stale_b = done.next().unwrap();

    for (d, id) in news.into_iter().zip(["n1", "n2", "n3"]) {
        let row = created(d).unwrap();
        assert_eq!(row.task_id, id);
        assert_eq!(row.status, TaskStatus::Working, "T-9");
        assert_eq!(row.created_at, T0 + 10);
        assert_eq!(
            row,
            get(&db.store, id).await,
            "the answer is the stored row"
        );
        let j = job(&raw, row.seq).await.unwrap();
        assert_eq!(j.state, "queued");
    }
    assert!(completed(done_a).unwrap(), "a took its outcome");
    assert_lease_lost(completed(stale_b));
    assert_eq!(get(&db.store, "a").await.status, TaskStatus::Completed);
    assert_eq!(get(&db.store, "a").await.updated_at, T0 + 10);
    assert_eq!(
        get(&db.store, "b").await.status,
        TaskStatus::Working,
        "fenced out"
    );
    assert_eq!(job(&raw, b.seq).await.unwrap().state, "running");
}
store_test!(write_batch_groups_creations_and_completions);

/// A write the grouped statements cannot take (a duplicate task id) sends
/// the batch one by one: that write fails alone, the others commit.
async fn write_batch_failing_write_fails_alone(db: TestDb) {
    let raw = db.raw().await;
    let ops = vec![
        create_op(new_task("dup", "alice"), Some(JOB), None),
        create_op(new_task("dup", "alice"), Some(JOB), None),
        create_op(new_task("ok", "alice"), Some(JOB), None),
        create_op(
            new_task("refused", "alice"),
            None,
            Some(failed_outcome("bad arguments")),
        ),
    ];
    let mut done = db.store.write_batch(&ops, T0).await.unwrap().into_iter();
    let first = created(done.next().unwrap()).unwrap();
    assert!(matches!(
        created(done.next().unwrap()),
        Err(StoreError::Db(_))
    ));
    let other = created(done.next().unwrap()).unwrap();
    let refused = created(done.next().unwrap()).unwrap();
    assert_eq!(refused.status, TaskStatus::Failed);
    assert_eq!(
        transitions(&raw, "refused").await,
        vec![tr(None, "working"), tr(Some("working"), "failed")],
        "T-9: even a refused call starts working"
    );
    let n = count_all(&raw, "SELECT count(*) FROM tasks").await;
    assert_eq!(n, 3);
    assert!(job(&raw, first.seq).await.is_some());
    assert!(job(&raw, other.seq).await.is_some());
    assert!(job(&raw, refused.seq).await.is_none());
}
store_test!(write_batch_failing_write_fails_alone);

/// The same job completed twice in one batch: the first holds the lease,
/// the second is fenced out.
async fn write_batch_same_job_twice_second_is_fenced(db: TestDb) {
    let row = db
        .store
        .task_create(&new_task("t", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let ops = vec![
        complete_op(row.seq, "lease-1", completed_outcome()),
        complete_op(row.seq, "lease-1", failed_outcome("again")),
    ];
    let mut done = db
        .store
        .write_batch(&ops, T0 + 5)
        .await
        .unwrap()
        .into_iter();
    assert!(completed(done.next().unwrap()).unwrap());
    assert_lease_lost(completed(done.next().unwrap()));
    assert_eq!(get(&db.store, "t").await.status, TaskStatus::Completed);
}
store_test!(write_batch_same_job_twice_second_is_fenced);

/// A job back in the queue (its worker vanished) abandons what the lost
/// attempt asked the client and sets an input_required task working again
/// (T-27), in the rescue itself, stamped with the rescuer's clock; while it
/// waits, the task says it is queued and why; the next run starts with no
/// stale message.
async fn new_attempt_abandons_old_requests_and_resumes_working(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let ask = taskbroker::store::TaskMessage {
        request_id: "r-1".into(),
        task_id: "t".into(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    db.store
        .task_message_ask(row.seq, "lease-1", &ask, T0 + 2)
        .await
        .unwrap();
    assert_eq!(get(&db.store, "t").await.status, TaskStatus::InputRequired);
    // The worker vanishes; its lease runs out; another claims the job.
    let rescued_at = T0 + LEASE_MS + 10;
    let report = db.store.job_rescue_expired(0, rescued_at).await.unwrap();
    assert_eq!(report.requeued, 1);
    let task = get(&db.store, "t").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message.as_deref(),
        Some("queued: lease expired on attempt 1")
    );
    assert_eq!(task.updated_at, rescued_at, "T-13: the caller's clock");
    let again = claim_one(&db.store, "w2", "lease-2", T0 + LEASE_MS + 2_000).await;
    assert_eq!(again.attempt, 2);
    let task = get(&db.store, "t").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message, None,
        "the new run has said nothing yet"
    );
    assert!(
        db.store
            .task_messages_pending("t")
            .await
            .unwrap()
            .is_empty()
    );
    let state: String = raw
        .scalar(
            "SELECT state FROM task_messages WHERE request_id = 'r-1'",
            args![],
        )
        .await
        .unwrap();
    assert_eq!(state, "abandoned");
}
store_test!(new_attempt_abandons_old_requests_and_resumes_working);

/// A claim in a group commit sees the jobs created earlier in the same
/// batch, and shares its transaction.
async fn write_batch_claim_sees_jobs_created_in_the_same_batch(db: TestDb) {
    let c1 = create_op(new_task("c1", "alice"), Some(JOB), None);
    let claim = Write::Claim {
        worker: "w1".into(),
        lease_token: "lease-1".into(),
        quotas: echo(5),
        limit: 5,
        lease_ms: LEASE_MS,
    };
    let mut done = db
        .store
        .write_batch(&[claim, c1], T0)
        .await
        .unwrap()
        .into_iter();
    let jobs = match done.next().unwrap().unwrap() {
        Written::Claimed(jobs) => jobs,
        other => panic!("expected claimed jobs, got {other:?}"),
    };
    let row = created(done.next().unwrap()).unwrap();
    assert_eq!(
        row.status_message, None,
        "claimed in its own commit: never says queued"
    );
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].task_seq, row.seq);
    assert_eq!(jobs[0].task_id, "c1");
    assert_eq!(jobs[0].attempt, 1);
    assert_eq!(jobs[0].lease_token, "lease-1");
    assert_eq!(
        job(&db.raw().await, row.seq).await.unwrap().state,
        "running"
    );
}
store_test!(write_batch_claim_sees_jobs_created_in_the_same_batch);

/// A claim undone (its pool stopped before it got the job): queued again,
/// the attempt not counted, fenced by the lease token.
async fn job_unclaim_queues_again_without_counting_the_attempt(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    assert!(
        !db.store
            .job_unclaim(row.seq, "not-the-lease", T0 + 2)
            .await
            .unwrap()
    );
    assert!(
        db.store
            .job_unclaim(row.seq, "lease-1", T0 + 2)
            .await
            .unwrap()
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "queued");
    assert_eq!(j.lease_token, None);
    assert!(
        !db.store
            .job_unclaim(row.seq, "lease-1", T0 + 2)
            .await
            .unwrap()
    );
    let again = claim_one(&db.store, "w2", "lease-2", T0 + 2).await;
    assert_eq!(again.attempt, 1, "the undone claim did not count");
}
store_test!(job_unclaim_queues_again_without_counting_the_attempt);

/// A claim takes at most each tool's quota, leaves tools without a quota,
/// and for a tool with a global limit counts its running jobs in every
/// process, except those of tasks waiting for their client.
async fn job_claim_respects_tool_quotas_and_global_limits(db: TestDb) {
    let mut seq = 0;
    let mut create = |tool: &str| {
        seq += 1;
        let mut task = new_task(&format!("{tool}-{seq}"), "alice");
        task.tool = tool.to_owned();
        task
    };
    for tool in ["a", "a", "a", "b", "b", "b", "b", "c"] {
        let task = create(tool);
        db.store
            .task_create(&task, Some(JOB), None, T0)
            .await
            .unwrap();
    }
    let quota = |tool: &str, free: i64, global: Option<i64>| ToolQuota {
        tool: tool.into(),
        free,
        global,
    };
    let tools = |jobs: &[ClaimedJob]| {
        let mut t: Vec<String> = jobs.iter().map(|j| j.tool.clone()).collect();
        t.sort();
        t
    };
    // a: 1 free here; b: 10 free here but 2 in all processes; c: not served.
    let first = db
        .store
        .job_claim_available(
            "w1",
            "lease-1",
            &[quota("a", 1, None), quota("b", 10, Some(2))],
            10,
            LEASE_MS,
            T0 + 1,
        )
        .await
        .unwrap();
    assert_eq!(tools(&first), ["a", "b", "b"]);
    // Another process: b's two running jobs count against its global limit.
    let second = db
        .store
        .job_claim_available(
            "w2",
            "lease-2",
            &[quota("a", 5, None), quota("b", 10, Some(2))],
            10,
            LEASE_MS,
            T0 + 2,
        )
        .await
        .unwrap();
    assert_eq!(tools(&second), ["a", "a"], "b is at its global limit");
    // One running b waits for its client: it no longer counts.
    let waiting = first.iter().find(|j| j.tool == "b").unwrap();
    let ask = taskbroker::store::TaskMessage {
        request_id: "r-b".into(),
        task_id: waiting.task_id.clone(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    db.store
        .task_message_ask(waiting.task_seq, "lease-1", &ask, T0 + 3)
        .await
        .unwrap();
    let third = db
        .store
        .job_claim_available(
            "w2",
            "lease-3",
            &[quota("b", 10, Some(2))],
            10,
            LEASE_MS,
            T0 + 4,
        )
        .await
        .unwrap();
    assert_eq!(tools(&third), ["b"], "one slot of b's two is free again");
    let none = db
        .store
        .job_claim_available(
            "w2",
            "lease-4",
            &[quota("b", 10, Some(2))],
            10,
            LEASE_MS,
            T0 + 5,
        )
        .await
        .unwrap();
    assert!(none.is_empty());
}
store_test!(job_claim_respects_tool_quotas_and_global_limits);

/// Sessions idle past their time stop counting as live at once unless they
/// own a task whose ttl has not run out; the sweeper ends them, then
/// deletes ended sessions that own no unexpired task.
async fn session_expiry_counts_and_sweeps(db: TestDb) {
    const IDLE: i64 = 1_000;
    for id in ["busy", "idle", "owner", "gone"] {
        db.store.session_create(&new_session(id), T0).await.unwrap();
    }
    let mut task = new_task_ttl("t-owner", "owner", 60_000);
    task.session_id = Some("owner".into());
    db.store
        .task_create(&task, Some(JOB), None, T0)
        .await
        .unwrap();
    db.store.session_end("gone", T0).await.unwrap();
    db.store.session_touch("busy", T0 + 1_500).await.unwrap();
    let later = T0 + 1_600;
    assert_eq!(
        db.store.session_count_live(IDLE, later).await.unwrap(),
        2,
        "busy and owner"
    );
    assert!(
        db.store
            .session_owns_open_tasks("owner", later)
            .await
            .unwrap()
    );
    assert!(
        !db.store
            .session_owns_open_tasks("idle", later)
            .await
            .unwrap()
    );
    let (ended, deleted) = db
        .store
        .session_expire_idle(IDLE, later, 100)
        .await
        .unwrap();
    assert_eq!(
        (ended, deleted),
        (1, 2),
        "idle ended; idle and gone deleted"
    );
    assert!(db.store.session_get("idle").await.unwrap().is_none());
    assert!(db.store.session_get("gone").await.unwrap().is_none());
    assert!(db.store.session_get("owner").await.unwrap().is_some());
    // Once the owner's task has expired, it goes too.
    let after_ttl = T0 + 61_000;
    assert_eq!(
        db.store.session_count_live(IDLE, after_ttl).await.unwrap(),
        0
    );
    let (ended, deleted) = db
        .store
        .session_expire_idle(IDLE, after_ttl, 100)
        .await
        .unwrap();
    assert_eq!((ended, deleted), (2, 2), "busy and owner");
}
store_test!(session_expiry_counts_and_sweeps);

// Progress reports: task_record_progress / task_progress_prune ------------------

/// A progress report, fenced by the lease: the task's statusMessage shows
/// it (lastUpdatedAt never backwards, T-13) and `task_progress` keeps it.
async fn task_record_progress_is_fenced_and_sets_the_status_message_t13(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-p", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    // Queued: nobody holds a lease yet.
    assert_lease_lost(
        db.store
            .task_record_progress(row.seq, "lease-1", 1.0, None, "early", T0 + 1)
            .await,
    );
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    db.store
        .task_record_progress(
            row.seq,
            "lease-1",
            1.5,
            Some(4.0),
            "one and a half",
            T0 + 100,
        )
        .await
        .unwrap();
    // An earlier clock: recorded, lastUpdatedAt stays.
    db.store
        .task_record_progress(row.seq, "lease-1", 2.0, None, "two", T0 + 50)
        .await
        .unwrap();
    let task = get(&db.store, "t-p").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(task.status_message.as_deref(), Some("two"));
    assert_eq!(task.updated_at, T0 + 100);
    type ProgressRow = (String, f64, Option<f64>, Option<String>, i64);
    let rows: Vec<ProgressRow> = raw
        .rows(
            "SELECT task_id, progress, total, message, at FROM task_progress
              WHERE task_seq = $1 ORDER BY id",
            args![row.seq],
        )
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![
            (
                "t-p".to_owned(),
                1.5,
                Some(4.0),
                Some("one and a half".to_owned()),
                T0 + 100
            ),
            ("t-p".to_owned(), 2.0, None, Some("two".to_owned()), T0 + 50),
        ]
    );
    assert_eq!(history(&raw, "t-p").await.len(), 1, "no transition");

    // Another token, or the same once the task is terminal: nothing written.
    assert_lease_lost(
        db.store
            .task_record_progress(row.seq, "lease-other", 3.0, None, "hijack", T0 + 200)
            .await,
    );
    db.store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 300)
        .await
        .unwrap();
    assert_lease_lost(
        db.store
            .task_record_progress(row.seq, "lease-1", 4.0, None, "late", T0 + 400)
            .await,
    );
    assert_eq!(
        count_rows(
            &raw,
            "SELECT COUNT(*) FROM task_progress WHERE task_seq = $1",
            row.seq
        )
        .await,
        2
    );
    assert_eq!(get(&db.store, "t-p").await.status_message, None);
}
store_test!(task_record_progress_is_fenced_and_sets_the_status_message_t13);

async fn task_progress_prune_deletes_reports_older_than_the_cutoff(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-p", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    for at in [T0 + 10, T0 + 20, T0 + 30] {
        db.store
            .task_record_progress(row.seq, "lease-1", (at - T0) as f64, None, "step", at)
            .await
            .unwrap();
    }
    let ats = || async {
        raw.rows::<(i64,)>(
            "SELECT at FROM task_progress WHERE task_seq = $1 ORDER BY id",
            args![row.seq],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|(at,)| at)
        .collect::<Vec<_>>()
    };
    assert_eq!(
        db.store.task_progress_prune(T0 + 10).await.unwrap(),
        0,
        "strictly older than the cutoff"
    );
    assert_eq!(db.store.task_progress_prune(T0 + 21).await.unwrap(), 2);
    assert_eq!(ats().await, vec![T0 + 30]);
    assert_eq!(db.store.task_progress_prune(T0 + 21).await.unwrap(), 0);
    // The task itself is untouched.
    let task = get(&db.store, "t-p").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(task.updated_at, T0 + 30);
}
store_test!(task_progress_prune_deletes_reports_older_than_the_cutoff);

// task_events_for_owner_since / task_count_open ----------------------------------

/// What a session's GET stream missed: one owner's status changes after a
/// feed position, oldest first, with the task's fields.
async fn task_events_for_owner_since_replays_one_owners_changes(db: TestDb) {
    let head = db.store.task_events_head().await.unwrap();
    let a1 = db
        .store
        .task_create(&new_task_ttl("a-1", "alice", 60_000), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("b-1", "bob"), None, None, T0 + 1)
        .await
        .unwrap();
    let mut a2 = new_task("a-2", "alice");
    a2.poll_interval_ms = None;
    db.store.task_create(&a2, None, None, T0 + 2).await.unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 3).await;
    db.store
        .job_complete(a1.seq, "lease-1", &completed_outcome(), T0 + 5)
        .await
        .unwrap();
    db.store
        .task_cancel("b-1", "bob", "stop", T0 + 6)
        .await
        .unwrap();

    let alice = db
        .store
        .task_events_for_owner_since("alice", head, 100)
        .await
        .unwrap();
    let got: Vec<(&str, Option<TaskStatus>, TaskStatus, i64)> = alice
        .iter()
        .map(|e| (e.task_id.as_str(), e.from_status, e.to_status, e.at))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a-1", None, TaskStatus::Working, T0),
            ("a-2", None, TaskStatus::Working, T0 + 2),
            (
                "a-1",
                Some(TaskStatus::Working),
                TaskStatus::Completed,
                T0 + 5
            ),
        ]
    );
    assert!(alice.windows(2).all(|w| w[0].id < w[1].id), "in feed order");
    assert!(alice.iter().all(|e| e.owner == "alice"));
    let first = &alice[0];
    assert_eq!(first.created_at, T0);
    assert_eq!(first.ttl_ms, Some(60_000));
    assert_eq!(first.poll_interval_ms, Some(500));
    assert_eq!(first.message, None);
    assert_eq!(alice[1].poll_interval_ms, None);
    assert_eq!(alice[1].ttl_ms, None);

    // After a position; at most `limit`.
    let after_first = db
        .store
        .task_events_for_owner_since("alice", first.id, 1)
        .await
        .unwrap();
    assert_eq!(after_first.len(), 1);
    assert_eq!(after_first[0].id, alice[1].id);
    let last = alice[2].id;
    assert!(
        db.store
            .task_events_for_owner_since("alice", last, 100)
            .await
            .unwrap()
            .is_empty()
    );

    let bob = db
        .store
        .task_events_for_owner_since("bob", head, 100)
        .await
        .unwrap();
    let got: Vec<(TaskStatus, Option<&str>)> = bob
        .iter()
        .map(|e| (e.to_status, e.message.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (TaskStatus::Working, None),
            (TaskStatus::Cancelled, Some("stop"))
        ]
    );
    assert!(
        db.store
            .task_events_for_owner_since("carol", head, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        db.store.task_events_head().await.unwrap(),
        bob[1].id,
        "the cancel was the last change"
    );
}
store_test!(task_events_for_owner_since_replays_one_owners_changes);

/// Unfinished tasks are working or input_required ones; terminal ones do
/// not count, nor other owners'.
async fn task_count_open_counts_working_and_input_required_tasks(db: TestDb) {
    assert_eq!(db.store.task_count_open("alice").await.unwrap(), 0);
    let waiting = db
        .store
        .task_create(&new_task("waiting", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0).await;
    let ask = TaskMessage {
        request_id: "r-1".into(),
        task_id: "waiting".into(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    db.store
        .task_message_ask(waiting.seq, "lease-1", &ask, T0 + 1)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("working", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    db.store
        .task_create(
            &new_task("refused", "alice"),
            None,
            Some(&failed_outcome("bad arguments")),
            T0,
        )
        .await
        .unwrap();
    db.store
        .task_create(&new_task("cancelled", "alice"), None, None, T0)
        .await
        .unwrap();
    db.store
        .task_cancel("cancelled", "alice", "cancelled", T0 + 1)
        .await
        .unwrap();
    db.store
        .task_create(&new_task("bobs", "bob"), None, None, T0)
        .await
        .unwrap();
    assert_eq!(
        get(&db.store, "waiting").await.status,
        TaskStatus::InputRequired
    );
    assert_eq!(db.store.task_count_open("alice").await.unwrap(), 2);
    assert_eq!(db.store.task_count_open("bob").await.unwrap(), 1);
    assert_eq!(db.store.task_count_open("carol").await.unwrap(), 0);
}
store_test!(task_count_open_counts_working_and_input_required_tasks);

// job_any_runnable / job_release -----------------------------------------------------

async fn job_any_runnable_sees_queued_jobs_whose_time_has_come(db: TestDb) {
    assert!(!db.store.job_any_runnable(T0).await.unwrap(), "empty");
    db.store
        .task_create(&new_task("no-job", "alice"), None, None, T0)
        .await
        .unwrap();
    assert!(!db.store.job_any_runnable(T0).await.unwrap(), "no job");
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0 + 10)
        .await
        .unwrap();
    assert!(!db.store.job_any_runnable(T0 + 9).await.unwrap());
    assert!(db.store.job_any_runnable(T0 + 10).await.unwrap());

    // Running: nothing to claim.
    claim_one(&db.store, "w1", "lease-1", T0 + 10).await;
    assert!(!db.store.job_any_runnable(T0 + 10).await.unwrap());

    // Requeued with a backoff: runnable once its run_after comes.
    let rescued_at = T0 + 10 + LEASE_MS;
    db.store
        .job_rescue_expired(BACKOFF_MS, rescued_at)
        .await
        .unwrap();
    let run_after = job(&db.raw().await, row.seq).await.unwrap().run_after;
    assert!(!db.store.job_any_runnable(run_after - 1).await.unwrap());
    assert!(db.store.job_any_runnable(run_after).await.unwrap());

    // Cancelled while queued: done, never runnable again.
    db.store
        .task_cancel("t-1", "alice", "cancelled", run_after)
        .await
        .unwrap();
    assert!(
        !db.store
            .job_any_runnable(run_after + LEASE_MS)
            .await
            .unwrap()
    );
}
store_test!(job_any_runnable_sees_queued_jobs_whose_time_has_come);

/// A stopping worker gives back a running job: queued again at once, the
/// attempt not counted, what it asked the client abandoned and the task
/// working again (T-27); fenced by the lease. The job of a cancelled task
/// is finished instead.
async fn job_release_requeues_without_counting_the_attempt_t27(db: TestDb) {
    let raw = db.raw().await;
    let row = db
        .store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    let ask = TaskMessage {
        request_id: "r-1".into(),
        task_id: "t-1".into(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    db.store
        .task_message_ask(row.seq, "lease-1", &ask, T0 + 2)
        .await
        .unwrap();
    assert_lease_lost(db.store.job_release(row.seq, "lease-other", T0 + 5).await);

    assert!(
        db.store
            .job_release(row.seq, "lease-1", T0 + 5)
            .await
            .unwrap(),
        "requeued"
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "queued");
    assert_eq!(j.attempt, 0, "not counted");
    assert_eq!(j.run_after, T0 + 5, "runnable at once");
    assert_eq!(j.lease_owner, None);
    assert_eq!(j.lease_token, None);
    assert_eq!(j.lease_expires_at, None);
    assert_eq!(
        j.last_error.as_deref(),
        Some("released by a stopping worker (attempt 1 not counted)")
    );
    let task = get(&db.store, "t-1").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message.as_deref(),
        Some("queued: released by a stopping worker (attempt 1 not counted)")
    );
    assert_eq!(task.updated_at, T0 + 5);
    assert!(
        db.store
            .task_messages_pending("t-1")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![
            tr(None, "working"),
            tr(Some("working"), "input_required"),
            tr(Some("input_required"), "working"),
        ]
    );
    // Released once.
    assert_lease_lost(db.store.job_release(row.seq, "lease-1", T0 + 6).await);

    let again = claim_one(&db.store, "w2", "lease-2", T0 + 5).await;
    assert_eq!(again.attempt, 1, "the released run did not count");

    // Cancelled while running, then released: finished, not requeued.
    db.store
        .task_cancel("t-1", "alice", "cancelled", T0 + 6)
        .await
        .unwrap();
    assert!(
        !db.store
            .job_release(row.seq, "lease-2", T0 + 7)
            .await
            .unwrap(),
        "not requeued"
    );
    let j = job(&raw, row.seq).await.unwrap();
    assert_eq!(j.state, "done");
    assert_eq!(j.attempt, 1);
    assert_eq!(j.finished_at, Some(T0 + 7));
    assert_eq!(j.last_error.as_deref(), Some("cancelled"));
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Cancelled);
}
store_test!(job_release_requeues_without_counting_the_attempt_t27);

// Messages: task_message_ask / _pending / _get / _answer, task_client_capabilities

/// A running task asks its client (input_required), the owner answers;
/// the task works again once nothing is pending. Answers are final, in the
/// database too.
async fn task_messages_ask_answer_round_trip(db: TestDb) {
    let raw = db.raw().await;
    let mut session = new_session("s-1");
    session.client_capabilities = r#"{"elicitation":{},"sampling":{}}"#.to_owned();
    session.principal = Some("alice".to_owned());
    db.store.session_create(&session, T0).await.unwrap();
    assert_eq!(
        db.store
            .session_get("s-1")
            .await
            .unwrap()
            .unwrap()
            .principal
            .as_deref(),
        Some("alice")
    );
    let mut new = new_task("t-m", "alice");
    new.session_id = Some("s-1".to_owned());
    let row = db
        .store
        .task_create(&new, Some(JOB), None, T0)
        .await
        .unwrap();
    let lone = db
        .store
        .task_create(&new_task("t-lone", "alice"), None, None, T0)
        .await
        .unwrap();
    assert_eq!(
        db.store
            .task_client_capabilities(row.seq)
            .await
            .unwrap()
            .as_deref(),
        Some(r#"{"elicitation":{},"sampling":{}}"#)
    );
    assert_eq!(
        db.store.task_client_capabilities(lone.seq).await.unwrap(),
        None,
        "no session"
    );
    assert_eq!(
        db.store
            .task_client_capabilities(row.seq + 100)
            .await
            .unwrap(),
        None,
        "no task"
    );

    let message = |id: &str, method: &str| TaskMessage {
        request_id: id.to_owned(),
        task_id: "t-m".to_owned(),
        method: method.to_owned(),
        params: r#"{"message":"name?"}"#.to_owned(),
        response: None,
    };
    let r1 = message("r-1", "elicitation/create");
    let r2 = message("r-2", "sampling/createMessage");
    // Not claimed: nobody may ask.
    assert_lease_lost(
        db.store
            .task_message_ask(row.seq, "lease-1", &r1, T0 + 1)
            .await,
    );
    claim_one(&db.store, "w1", "lease-1", T0 + 1).await;
    assert_lease_lost(
        db.store
            .task_message_ask(row.seq, "stranger", &r1, T0 + 2)
            .await,
    );
    assert_eq!(db.store.task_message_get("r-1").await.unwrap(), None);

    db.store
        .task_message_ask(row.seq, "lease-1", &r1, T0 + 2)
        .await
        .unwrap();
    let task = get(&db.store, "t-m").await;
    assert_eq!(task.status, TaskStatus::InputRequired);
    assert_eq!(
        task.status_message.as_deref(),
        Some("waiting for the client to answer elicitation/create")
    );
    assert_eq!(task.updated_at, T0 + 2);
    db.store
        .task_message_ask(row.seq, "lease-1", &r2, T0 + 3)
        .await
        .unwrap();
    assert_eq!(
        db.store.task_messages_pending("t-m").await.unwrap(),
        vec![r1.clone(), r2.clone()],
        "oldest first"
    );
    assert_eq!(
        db.store.task_message_get("r-1").await.unwrap(),
        Some(r1.clone())
    );
    assert_eq!(db.store.task_message_get("r-unknown").await.unwrap(), None);

    // Only the task's owner answers.
    assert_eq!(
        db.store
            .task_message_answer("r-1", "mallory", "{}", T0 + 4)
            .await
            .unwrap(),
        AnswerOutcome::Unknown
    );
    let answer = r#"{"jsonrpc":"2.0","id":"r-1","result":{"action":"accept"}}"#;
    assert_eq!(
        db.store
            .task_message_answer("r-1", "alice", answer, T0 + 4)
            .await
            .unwrap(),
        AnswerOutcome::Stored
    );
    assert_eq!(
        get(&db.store, "t-m").await.status,
        TaskStatus::InputRequired,
        "r-2 is still pending"
    );
    assert_eq!(
        db.store.task_messages_pending("t-m").await.unwrap(),
        vec![r2.clone()]
    );
    assert_eq!(
        db.store
            .task_message_answer("r-1", "alice", "{}", T0 + 5)
            .await
            .unwrap(),
        AnswerOutcome::Unknown,
        "answered once"
    );
    assert_eq!(
        db.store
            .task_message_answer("r-2", "alice", r#"{"result":{}}"#, T0 + 6)
            .await
            .unwrap(),
        AnswerOutcome::Stored
    );
    let task = get(&db.store, "t-m").await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message.as_deref(),
        Some("the client answered; working")
    );
    assert_eq!(task.updated_at, T0 + 6);
    assert!(
        db.store
            .task_messages_pending("t-m")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        db.store
            .task_message_get("r-1")
            .await
            .unwrap()
            .unwrap()
            .response
            .as_deref(),
        Some(answer)
    );
    let states: Vec<(String, Option<i64>)> = raw
        .rows(
            "SELECT state, answered_at FROM task_messages WHERE task_seq = $1 ORDER BY id",
            args![row.seq],
        )
        .await
        .unwrap();
    assert_eq!(
        states,
        vec![
            ("answered".to_owned(), Some(T0 + 4)),
            ("answered".to_owned(), Some(T0 + 6))
        ]
    );
    let r = raw
        .execute(
            "UPDATE task_messages SET response = '{}' WHERE request_id = $1",
            args!["r-1"],
        )
        .await;
    assert_refused(r, "a task message is answered (or abandoned) once");
    assert_eq!(
        transitions(&raw, "t-m").await,
        vec![
            tr(None, "working"),
            tr(Some("working"), "input_required"),
            tr(Some("input_required"), "working"),
        ],
        "the second request was asked while input_required already"
    );

    // A finished task asks nothing more.
    db.store
        .job_complete(row.seq, "lease-1", &completed_outcome(), T0 + 7)
        .await
        .unwrap();
    let r3 = message("r-3", "elicitation/create");
    assert_lease_lost(
        db.store
            .task_message_ask(row.seq, "lease-1", &r3, T0 + 8)
            .await,
    );
    assert_eq!(db.store.task_message_get("r-3").await.unwrap(), None);
}
store_test!(task_messages_ask_answer_round_trip);

// Tokens ----------------------------------------------------------------------------

async fn token_create_get_list_touch_revoke(db: TestDb) {
    assert!(!db.store.tokens_exist().await.unwrap());
    assert!(db.store.token_list().await.unwrap().is_empty());
    assert_eq!(db.store.token_get("id-1").await.unwrap(), None);

    db.store
        .token_create(&new_token("id-1", "alice", &[7u8; 32], None), T0)
        .await
        .unwrap();
    db.store
        .token_create(
            &new_token("id-2", "bob", &[8u8; 32], Some(T0 + 10_000)),
            T0 + 1,
        )
        .await
        .unwrap();
    assert!(db.store.tokens_exist().await.unwrap());
    assert!(matches!(
        db.store
            .token_create(&new_token("id-1", "carol", &[9u8; 32], None), T0 + 2)
            .await,
        Err(StoreError::Db(_))
    ));
    assert_db_refused(
        db.store
            .token_create(&new_token("id-3", "carol", &[1u8; 3], None), T0 + 2)
            .await,
        &check_refusal(
            db.driver(),
            "length(secret_hash) = 32",
            "tokens_secret_hash_check",
        ),
    );
    assert_db_refused(
        db.store
            .token_create(&new_token("id-4", "", &[1u8; 32], None), T0 + 2)
            .await,
        &check_refusal(
            db.driver(),
            "length(principal) BETWEEN 1 AND 200",
            "tokens_principal_check",
        ),
    );

    let one = db.store.token_get("id-1").await.unwrap().unwrap();
    assert_eq!(
        one,
        store::TokenRow {
            token_id: "id-1".to_owned(),
            principal: "alice".to_owned(),
            secret_hash: vec![7u8; 32],
            created_at: T0,
            expires_at: None,
            revoked_at: None,
            last_used_at: None,
            operator: false,
        }
    );
    let two = db.store.token_get("id-2").await.unwrap().unwrap();
    assert_eq!(two.expires_at, Some(T0 + 10_000));
    // An operator token (the console's) keeps its mark.
    let ops = NewToken {
        operator: true,
        ..new_token("id-ops", "ops", &[3u8; 32], None)
    };
    db.store.token_create(&ops, T0 + 3).await.unwrap();
    assert!(
        db.store
            .token_get("id-ops")
            .await
            .unwrap()
            .unwrap()
            .operator
    );
    // Newest first (both drivers; the trait's doc says "oldest first").
    let ids: Vec<String> = db
        .store
        .token_list()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.token_id)
        .collect();
    assert_eq!(ids, ["id-ops", "id-2", "id-1"]);

    db.store.token_touch("id-1", T0 + 5).await.unwrap();
    db.store.token_touch("id-unknown", T0 + 5).await.unwrap();
    assert!(db.store.token_revoke("id-1", T0 + 6).await.unwrap());
    assert!(
        !db.store.token_revoke("id-1", T0 + 7).await.unwrap(),
        "revoked once"
    );
    assert!(!db.store.token_revoke("id-unknown", T0 + 7).await.unwrap());
    let one = db.store.token_get("id-1").await.unwrap().unwrap();
    assert_eq!(
        (one.last_used_at, one.revoked_at),
        (Some(T0 + 5), Some(T0 + 6))
    );
    assert!(
        db.store.tokens_exist().await.unwrap(),
        "a revoked token still says authentication is on"
    );
}
store_test!(token_create_get_list_touch_revoke);

// Workers ---------------------------------------------------------------------------

async fn worker_register_heartbeat_set_state_mark_dead(db: TestDb) {
    let raw = db.raw().await;
    type WorkerRow = (String, i64, i64, Option<i64>);
    let read = |id: &'static str| {
        let raw = &raw;
        async move {
            raw.row::<WorkerRow>(
                "SELECT state, jobs_running, heartbeat_at, stopped_at FROM workers
                  WHERE worker_id = $1",
                args![id],
            )
            .await
            .unwrap()
            .unwrap()
        }
    };
    let pool = |id: &str, kind: WorkerKind, lease_ms: i64| NewWorker {
        worker_id: id.to_owned(),
        pid: 4242,
        host: "host-a".to_owned(),
        kind,
        concurrency: 4,
        lease_ms,
    };
    db.store
        .worker_register(&pool("w-1", WorkerKind::Process, 1_000), T0)
        .await
        .unwrap();
    db.store
        .worker_register(&pool("w-2", WorkerKind::Embedded, 10_000), T0)
        .await
        .unwrap();
    assert!(
        db.store
            .worker_register(&pool("w-1", WorkerKind::Process, 1_000), T0)
            .await
            .is_err(),
        "one row per pool"
    );
    let row: Option<(i64, String, String, i64, i64, i64)> = raw
        .row(
            "SELECT pid, host, kind, concurrency, lease_ms, started_at FROM workers
              WHERE worker_id = 'w-1'",
            args![],
        )
        .await
        .unwrap();
    assert_eq!(
        row,
        Some((
            4242,
            "host-a".to_owned(),
            "process".to_owned(),
            4,
            1_000,
            T0
        ))
    );
    assert_eq!(read("w-1").await, ("live".to_owned(), 0, T0, None));
    assert_eq!(read("w-2").await.0, "live");

    db.store.worker_heartbeat("w-1", 3, T0 + 500).await.unwrap();
    assert_eq!(read("w-1").await, ("live".to_owned(), 3, T0 + 500, None));
    db.store
        .worker_heartbeat("w-unknown", 1, T0 + 500)
        .await
        .unwrap();

    // Dead once two leases' worth of heartbeats are missing (strictly).
    assert_eq!(db.store.worker_mark_dead(T0 + 2_500).await.unwrap(), 0);
    assert_eq!(db.store.worker_mark_dead(T0 + 2_501).await.unwrap(), 1);
    assert_eq!(read("w-1").await.0, "dead");
    assert_eq!(read("w-2").await.0, "live", "its lease is longer");
    assert_eq!(
        db.store.worker_mark_dead(T0 + 2_501).await.unwrap(),
        0,
        "dead once"
    );
    // A stalled pool that beats again lives again.
    db.store
        .worker_heartbeat("w-1", 2, T0 + 3_000)
        .await
        .unwrap();
    assert_eq!(read("w-1").await, ("live".to_owned(), 2, T0 + 3_000, None));

    db.store
        .worker_set_state("w-1", WorkerState::Stopping, T0 + 3_100)
        .await
        .unwrap();
    assert_eq!(
        read("w-1").await,
        ("stopping".to_owned(), 2, T0 + 3_100, None),
        "stopping keeps its count"
    );
    db.store
        .worker_set_state("w-1", WorkerState::Stopped, T0 + 3_200)
        .await
        .unwrap();
    assert_eq!(
        read("w-1").await,
        ("stopped".to_owned(), 0, T0 + 3_200, Some(T0 + 3_200))
    );
    // A stopped pool is never marked dead; the silent one is.
    assert_eq!(db.store.worker_mark_dead(T0 + 100_000).await.unwrap(), 1);
    assert_eq!(read("w-1").await.0, "stopped");
    assert_eq!(read("w-2").await.0, "dead");

    // Gone pools are forgotten once they have been gone long enough.
    assert_eq!(db.store.worker_purge_gone(T0).await.unwrap(), 0);
    assert_eq!(
        db.store.worker_purge_gone(T0 + 3_200).await.unwrap(),
        1,
        "w-2 (dead, last beat at T0); w-1 stopped at T0 + 3200, not before"
    );
    assert_eq!(db.store.worker_purge_gone(T0 + 3_201).await.unwrap(), 1);
    let left: i64 = raw
        .scalar("SELECT count(*) FROM workers", args![])
        .await
        .unwrap();
    assert_eq!(left, 0);
}
store_test!(worker_register_heartbeat_set_state_mark_dead);

/// A token row to store: `id` of `principal`, not an operator.
fn new_token(id: &str, principal: &str, hash: &[u8], expires_at: Option<i64>) -> NewToken {
    NewToken {
        token_id: id.into(),
        principal: principal.into(),
        secret_hash: hash.to_vec(),
        expires_at,
        operator: false,
    }
}

/// Issue 23: the keys that sign MCP 2026-07-28 request states live in the
/// database. Two processes (two handles, two `SigningKeys`) asking at once
/// for this period's key get the same one, made once; a state of the
/// previous period is still accepted, an older one is not; the purge
/// deletes exactly the keys no state may use (a period later than this
/// clock stops accepting them), and a process that never cached such a key
/// can no longer read it.
async fn request_state_keys_are_shared_rotated_and_purged(db: TestDb) {
    use taskbroker::broker::keys::{KeyError, SigningKeys};
    const PERIOD: i64 = 3_600_000;
    let other = store::open(&db.fresh.location, Durability::Full)
        .await
        .unwrap();
    let here = SigningKeys::with_period(db.store.clone(), PERIOD);
    let there = SigningKeys::with_period(other.clone(), PERIOD);
    let now = 10 * PERIOD + 5;
    let (a, b) = tokio::join!(here.current(now), there.current(now));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "both processes sign with the key made once");
    assert_eq!(a.epoch, 10);
    assert_eq!(here.current(now + 1).await.unwrap(), a, "same period");

    // The next period has a key of its own; the previous one still opens.
    let later = now + PERIOD;
    let next = there.current(later).await.unwrap();
    assert_eq!(next.epoch, 11);
    assert_ne!(next.secret, a.secret);
    assert_eq!(here.for_epoch(10, later).await.unwrap(), a);
    assert_eq!(here.for_epoch(11, later).await.unwrap(), next);
    // Two periods on, the first key is refused even where it is cached.
    let much_later = now + 2 * PERIOD;
    assert!(matches!(
        here.for_epoch(10, much_later).await,
        Err(KeyError::Expired(1))
    ));
    // A period no process ever signed in has no key to open with.
    assert!(matches!(
        here.for_epoch(12, much_later).await,
        Err(KeyError::Expired(_))
    ));

    // A period is kept beyond what this clock accepts (for a clock ahead).
    assert_eq!(
        here.purge(much_later).await.unwrap(),
        0,
        "epoch 10 is kept a period more"
    );
    let purged = here.purge(much_later + PERIOD).await.unwrap();
    assert_eq!(purged, 1, "then only epoch 10 is past use");
    let fresh_process = SigningKeys::with_period(other, PERIOD);
    assert_eq!(fresh_process.for_epoch(11, much_later).await.unwrap(), next);
    assert!(matches!(
        fresh_process.for_epoch(10, later).await,
        Err(KeyError::Expired(_))
    ));
}
store_test!(request_state_keys_are_shared_rotated_and_purged);

// Operator and metrics reads (OpsStore, MetricsStore) ---------------------------

/// The clock of [`ops_world`]: two hours after `T0`, so that tasks can
/// finish more than an hour before it.
const OPS_NOW: i64 = T0 + 2 * HOUR_MS;

/// `ms` before [`OPS_NOW`].
fn ago(ms: i64) -> i64 {
    OPS_NOW - ms
}

/// The lease token [`OpsWorld::started`] claims task `id` with.
fn lease_of(id: &str) -> String {
    format!("lease-{id}")
}

/// The release reason `job_release` stores for a first attempt.
const RELEASED: &str = "released by a stopping worker (attempt 1 not counted)";

/// What [`ops_world`] built: every task id in creation (row key) order,
/// and each one's row key.
struct OpsWorld {
    order: Vec<String>,
    seqs: std::collections::HashMap<String, i64>,
}

impl OpsWorld {
    fn seq(&self, id: &str) -> i64 {
        self.seqs[id]
    }

    /// The ids of `ids`, newest first (as `ops_task_page` lists them).
    fn newest_first(&self, ids: &[&str]) -> Vec<String> {
        let mut ids: Vec<&str> = ids.to_vec();
        ids.sort_by_key(|id| std::cmp::Reverse(self.seq(id)));
        ids.into_iter().map(str::to_owned).collect()
    }

    async fn create(
        &mut self,
        store: &Store,
        task: NewTask,
        job: Option<NewJob>,
        outcome: Option<&TaskOutcome>,
        at: i64,
    ) -> i64 {
        let row = store.task_create(&task, job, outcome, at).await.unwrap();
        self.order.push(task.task_id.clone());
        self.seqs.insert(task.task_id, row.seq);
        row.seq
    }

    /// A task of `tool` for `owner` created at `at` with a job, which
    /// `worker` claims 10 ms later with the token [`lease_of`] `id` (the
    /// only job of `tool` in the queue then).
    async fn started(
        &mut self,
        store: &Store,
        (id, owner, tool): (&str, &str, &str),
        worker: &str,
        at: i64,
    ) -> i64 {
        let seq = self
            .create(store, ops_task(id, owner, tool), Some(JOB), None, at)
            .await;
        let quota = [ToolQuota {
            tool: tool.to_owned(),
            free: 1,
            global: None,
        }];
        let claimed = store
            .job_claim_available(worker, &lease_of(id), &quota, 1, LEASE_MS, at + 10)
            .await
            .unwrap();
        let seqs: Vec<i64> = claimed.iter().map(|j| j.task_seq).collect();
        assert_eq!(seqs, [seq], "{id} is the one job of {tool} queued");
        seq
    }
}

/// A task of `tool` for `owner`.
fn ops_task(id: &str, owner: &str, tool: &str) -> NewTask {
    NewTask {
        tool: tool.to_owned(),
        ..new_task(id, owner)
    }
}

/// A worker pool of `kind` with a lease of `lease_ms`.
fn ops_pool(id: &str, kind: WorkerKind, lease_ms: i64) -> NewWorker {
    NewWorker {
        worker_id: id.to_owned(),
        pid: 7,
        host: "host-ops".to_owned(),
        kind,
        concurrency: 4,
        lease_ms,
    }
}

/// A known state written through the store's own methods, times relative
/// to [`OPS_NOW`] (tools echo, slow, flaky; owners alice, bob, carol):
///
/// | task            | tool  | owner | at OPS_NOW                                        |
/// |-----------------|-------|-------|---------------------------------------------------|
/// | done-ancient    | echo  | alice | completed 1 h + 1 ms ago (ttl 1 s: expired)       |
/// | done-edge       | echo  | alice | completed exactly 1 h ago                         |
/// | done-recent     | echo  | bob   | completed 30 s ago                                |
/// | fail-flaky-1    | flaky | alice | failed 20 min ago, "boom 1"                       |
/// | fail-flaky-2    | flaky | bob   | failed 10 s ago, "boom 2"                         |
/// | fail-echo       | echo  | carol | created failed 5 min ago, "bad input" (no job)    |
/// | cancel-running  | slow  | alice | cancelled 2 min ago while w-live ran it           |
/// | running-echo    | echo  | alice | run by w-live since 20 min, two progress reports  |
/// | running-slow    | slow  | bob   | run by w-live since 12 min                        |
/// | asking          | slow  | carol | run by w-embedded, input_required since 7 min     |
/// | plain           | echo  | carol | working, no job                                   |
/// | released-echo   | echo  | bob   | released by w-stopping 3 min ago: queued again    |
/// | cancel-queued   | slow  | bob   | cancelled 15 s ago while queued                   |
/// | queued-echo-1   | echo  | alice | queued since 90 s                                 |
/// | queued-echo-2   | echo  | bob   | queued since 45 s                                 |
/// | queued-slow-1   | slow  | alice | queued since 20 s                                 |
///
/// Worker pools: w-old (dead: its 1 s lease ran out long ago), w-stopped
/// (stopped), w-live (live, heartbeat 5 s ago reporting 0 jobs although it
/// runs two), w-embedded (live, embedded) and w-stopping (stopping), the
/// last two started at the same time.
async fn ops_world(store: &Store) -> OpsWorld {
    const MIN: i64 = MINUTE_MS;
    let mut w = OpsWorld {
        order: Vec::new(),
        seqs: std::collections::HashMap::new(),
    };
    store
        .worker_register(&ops_pool("w-old", WorkerKind::Process, 1_000), T0)
        .await
        .unwrap();
    store
        .worker_register(
            &ops_pool("w-stopped", WorkerKind::Process, LEASE_MS),
            ago(40 * MIN),
        )
        .await
        .unwrap();
    store
        .worker_set_state("w-stopped", WorkerState::Stopped, ago(35 * MIN))
        .await
        .unwrap();
    store
        .worker_register(
            &ops_pool("w-live", WorkerKind::Process, LEASE_MS),
            ago(30 * MIN),
        )
        .await
        .unwrap();
    for id in ["w-stopping", "w-embedded"] {
        let kind = if id == "w-embedded" {
            WorkerKind::Embedded
        } else {
            WorkerKind::Process
        };
        store
            .worker_register(&ops_pool(id, kind, LEASE_MS), ago(20 * MIN))
            .await
            .unwrap();
    }

    // Finished, running and released tasks, each claimed as it is made.
    let ancient = w
        .create(
            store,
            NewTask {
                tool: "echo".into(),
                ..new_task_ttl("done-ancient", "alice", 1_000)
            },
            Some(JOB),
            None,
            ago(HOUR_MS + MIN),
        )
        .await;
    claim_one(
        store,
        "w-live",
        &lease_of("done-ancient"),
        ago(HOUR_MS + MIN) + 10,
    )
    .await;
    let edge = w
        .started(
            store,
            ("done-edge", "alice", "echo"),
            "w-live",
            ago(HOUR_MS + 30_000),
        )
        .await;
    let recent = w
        .started(store, ("done-recent", "bob", "echo"), "w-live", ago(50_000))
        .await;
    let flaky1 = w
        .started(
            store,
            ("fail-flaky-1", "alice", "flaky"),
            "w-live",
            ago(25 * MIN),
        )
        .await;
    let flaky2 = w
        .started(
            store,
            ("fail-flaky-2", "bob", "flaky"),
            "w-live",
            ago(15_000),
        )
        .await;
    for (seq, id, outcome, at) in [
        (
            ancient,
            "done-ancient",
            completed_outcome(),
            ago(HOUR_MS + 1),
        ),
        (edge, "done-edge", completed_outcome(), ago(HOUR_MS)),
        (recent, "done-recent", completed_outcome(), ago(30_000)),
        (
            flaky1,
            "fail-flaky-1",
            failed_outcome("boom 1"),
            ago(20 * MIN),
        ),
        (
            flaky2,
            "fail-flaky-2",
            failed_outcome("boom 2"),
            ago(10_000),
        ),
    ] {
        assert!(
            store
                .job_complete(seq, &lease_of(id), &outcome, at)
                .await
                .unwrap()
        );
    }
    w.create(
        store,
        ops_task("fail-echo", "carol", "echo"),
        None,
        Some(&failed_outcome("bad input")),
        ago(5 * MIN),
    )
    .await;
    let cancel_running = w
        .started(
            store,
            ("cancel-running", "alice", "slow"),
            "w-live",
            ago(3 * MIN),
        )
        .await;
    assert!(matches!(
        store
            .task_cancel("cancel-running", "alice", "stopped by alice", ago(2 * MIN))
            .await
            .unwrap(),
        CancelOutcome::Cancelled(_)
    ));
    store
        .job_finish_cancelled(
            cancel_running,
            &lease_of("cancel-running"),
            ago(2 * MIN) + 100,
        )
        .await
        .unwrap();
    let running = w
        .started(
            store,
            ("running-echo", "alice", "echo"),
            "w-live",
            ago(20 * MIN),
        )
        .await;
    for (progress, message, at) in [(1.0, "one", ago(10 * MIN)), (2.0, "two", ago(5 * MIN))] {
        store
            .task_record_progress(
                running,
                &lease_of("running-echo"),
                progress,
                Some(3.0),
                message,
                at,
            )
            .await
            .unwrap();
    }
    w.started(
        store,
        ("running-slow", "bob", "slow"),
        "w-live",
        ago(12 * MIN),
    )
    .await;
    let asking = w
        .started(
            store,
            ("asking", "carol", "slow"),
            "w-embedded",
            ago(8 * MIN),
        )
        .await;
    let ask = TaskMessage {
        request_id: "r-asking".into(),
        task_id: "asking".into(),
        method: "elicitation/create".into(),
        params: "{}".into(),
        response: None,
    };
    store
        .task_message_ask(asking, &lease_of("asking"), &ask, ago(7 * MIN))
        .await
        .unwrap();
    w.create(
        store,
        ops_task("plain", "carol", "echo"),
        None,
        None,
        ago(6 * MIN),
    )
    .await;
    let released = w
        .started(
            store,
            ("released-echo", "bob", "echo"),
            "w-stopping",
            ago(4 * MIN),
        )
        .await;
    assert!(
        store
            .job_release(released, &lease_of("released-echo"), ago(3 * MIN))
            .await
            .unwrap()
    );

    // Queued tasks, one of them cancelled before any worker came.
    w.create(
        store,
        ops_task("cancel-queued", "bob", "slow"),
        Some(JOB),
        None,
        ago(MIN),
    )
    .await;
    assert!(matches!(
        store
            .task_cancel("cancel-queued", "bob", "stopped by bob", ago(15_000))
            .await
            .unwrap(),
        CancelOutcome::Cancelled(_)
    ));
    w.create(
        store,
        ops_task("queued-echo-1", "alice", "echo"),
        Some(JOB),
        None,
        ago(90_000),
    )
    .await;
    w.create(
        store,
        ops_task("queued-echo-2", "bob", "echo"),
        Some(JOB),
        None,
        ago(45_000),
    )
    .await;
    w.create(
        store,
        ops_task("queued-slow-1", "alice", "slow"),
        Some(JOB),
        None,
        ago(20_000),
    )
    .await;

    // Heartbeats: w-live reports a lagging count; w-old never beats.
    store
        .worker_heartbeat("w-live", 0, ago(5_000))
        .await
        .unwrap();
    store
        .worker_heartbeat("w-embedded", 1, ago(5_000))
        .await
        .unwrap();
    store
        .worker_set_state("w-stopping", WorkerState::Stopping, ago(4_000))
        .await
        .unwrap();
    assert_eq!(store.worker_mark_dead(OPS_NOW).await.unwrap(), 1, "w-old");
    w
}

/// `ops_stats` on an empty database, then on [`ops_world`]: queued jobs
/// by tool with the earliest time one became runnable (a released job
/// counts from its release, not its creation), running jobs by tool, open
/// tasks by status, finished tasks by status and by tool over the last
/// minute and hour (both windows include their edge; a task finished
/// 1 h + 1 ms ago is out), and failures by tool with the latest failure's
/// time and message. Two hours later the windows are empty and the rest
/// stands.
async fn ops_stats_counts_queue_running_open_finished_and_failures(db: TestDb) {
    let empty = db.store.ops_stats(OPS_NOW).await.unwrap();
    assert_eq!(
        empty,
        OpsStats {
            now: OPS_NOW,
            queued: vec![],
            running: vec![],
            open: vec![],
            finished: vec![],
            failures: vec![],
            finished_by_tool: vec![],
        }
    );

    ops_world(&db.store).await;
    let mut stats = db.store.ops_stats(OPS_NOW).await.unwrap();
    // Open and finished counts are by status, in no promised order.
    stats.open.sort_by_key(|(s, _)| s.as_str());
    stats.finished.sort_by_key(|f| f.status.as_str());
    let queued = vec![
        ToolQueue {
            tool: "echo".into(),
            jobs: 3,
            oldest_since: ago(3 * MINUTE_MS),
        },
        ToolQueue {
            tool: "slow".into(),
            jobs: 1,
            oldest_since: ago(20_000),
        },
    ];
    let running = vec![
        ToolRunning {
            tool: "echo".into(),
            jobs: 1,
        },
        ToolRunning {
            tool: "slow".into(),
            jobs: 2,
        },
    ];
    let open = vec![(TaskStatus::InputRequired, 1), (TaskStatus::Working, 7)];
    assert_eq!(
        stats,
        OpsStats {
            now: OPS_NOW,
            queued: queued.clone(),
            running: running.clone(),
            open: open.clone(),
            finished: vec![
                Finished {
                    status: TaskStatus::Cancelled,
                    last_minute: 1,
                    last_hour: 2,
                },
                Finished {
                    status: TaskStatus::Completed,
                    last_minute: 1,
                    last_hour: 2,
                },
                Finished {
                    status: TaskStatus::Failed,
                    last_minute: 1,
                    last_hour: 3,
                },
            ],
            failures: vec![
                ToolFailures {
                    tool: "echo".into(),
                    failed: 1,
                    last_at: ago(5 * MINUTE_MS),
                    last_message: Some("bad input".into()),
                },
                ToolFailures {
                    tool: "flaky".into(),
                    failed: 2,
                    last_at: ago(10_000),
                    last_message: Some("boom 2".into()),
                },
            ],
            finished_by_tool: vec![
                ToolFinished {
                    tool: "echo".into(),
                    last_minute: 1,
                    last_hour: 3,
                },
                ToolFinished {
                    tool: "flaky".into(),
                    last_minute: 1,
                    last_hour: 2,
                },
                ToolFinished {
                    tool: "slow".into(),
                    last_minute: 1,
                    last_hour: 2,
                },
            ],
        }
    );

    let later = OPS_NOW + 2 * HOUR_MS;
    let mut stats = db.store.ops_stats(later).await.unwrap();
    stats.open.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        stats,
        OpsStats {
            now: later,
            queued,
            running,
            open,
            finished: vec![],
            failures: vec![],
            finished_by_tool: vec![],
        }
    );
}
store_test!(ops_stats_counts_queue_running_open_finished_and_failures);

/// `ops_workers` lists every pool that registered, newest first (a tie on
/// the start time by worker id), with its state as stored (a stopped pool
/// with its stop time, a pool marked dead), and its running jobs counted
/// from the jobs it leases, not from its last heartbeat's count (w-live
/// reported 0 and runs two; finished jobs it ran do not count).
async fn ops_workers_lists_pools_newest_first_with_their_running_jobs(db: TestDb) {
    assert!(db.store.ops_workers().await.unwrap().is_empty());
    ops_world(&db.store).await;
    let pool = |id: &str,
                kind: WorkerKind,
                state: WorkerLife,
                lease_ms: i64,
                started_at: i64,
                heartbeat_at: i64,
                stopped_at: Option<i64>,
                jobs_running: i64| WorkerInfo {
        worker_id: id.to_owned(),
        kind,
        state,
        host: "host-ops".to_owned(),
        pid: 7,
        concurrency: 4,
        lease_ms,
        started_at,
        heartbeat_at,
        stopped_at,
        jobs_running,
    };
    let twenty = ago(20 * MINUTE_MS);
    assert_eq!(
        db.store.ops_workers().await.unwrap(),
        vec![
            pool(
                "w-embedded",
                WorkerKind::Embedded,
                WorkerLife::Live,
                LEASE_MS,
                twenty,
                ago(5_000),
                None,
                1
            ),
            pool(
                "w-stopping",
                WorkerKind::Process,
                WorkerLife::Stopping,
                LEASE_MS,
                twenty,
                ago(4_000),
                None,
                0
            ),
            pool(
                "w-live",
                WorkerKind::Process,
                WorkerLife::Live,
                LEASE_MS,
                ago(30 * MINUTE_MS),
                ago(5_000),
                None,
                2
            ),
            pool(
                "w-stopped",
                WorkerKind::Process,
                WorkerLife::Stopped,
                LEASE_MS,
                ago(40 * MINUTE_MS),
                ago(35 * MINUTE_MS),
                Some(ago(35 * MINUTE_MS)),
                0
            ),
            pool(
                "w-old",
                WorkerKind::Process,
                WorkerLife::Dead,
                1_000,
                T0,
                T0,
                None,
                0
            ),
        ]
    );
}
store_test!(ops_workers_lists_pools_newest_first_with_their_running_jobs);

/// The task ids of one `ops_task_page`.
async fn page_ids(
    store: &Store,
    filter: &TaskFilter,
    before_seq: Option<i64>,
    limit: i64,
) -> Vec<String> {
    store
        .ops_task_page(filter, before_seq, limit)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.task_id)
        .collect()
}

/// `ops_task_page` lists every owner's tasks newest first, expired ones
/// not yet purged included; pages by `before_seq` strictly older than the
/// cursor, to the end; filters by status (finished ones, unfinished ones
/// only, which takes the open-status index), tool and owner, alone and
/// together; and serves the status message as a client sees it (`queued`
/// while the job waits, with the reason after a release).
async fn ops_task_page_filters_and_pages_newest_first(db: TestDb) {
    let w = ops_world(&db.store).await;
    let any = TaskFilter::default();
    let filter = |statuses: &[TaskStatus], tool: Option<&str>, owner: Option<&str>| TaskFilter {
        statuses: statuses.to_vec(),
        tool: tool.map(str::to_owned),
        owner: owner.map(str::to_owned),
    };

    // Every task, five a page, each page before the last one's oldest.
    let all: Vec<String> = w.order.iter().rev().cloned().collect();
    let (mut pages, mut listed, mut before) = (Vec::new(), Vec::new(), None);
    loop {
        let page = page_ids(&db.store, &any, before, 5).await;
        if page.is_empty() {
            break;
        }
        before = Some(w.seq(page.last().unwrap()));
        pages.push(page.len());
        listed.extend(page);
    }
    assert_eq!(pages, [5, 5, 5, 1]);
    assert_eq!(listed, all);
    assert_eq!(
        page_ids(&db.store, &any, Some(w.seq("plain")), 2).await,
        w.newest_first(&["asking", "running-slow"]),
        "strictly older than the cursor"
    );
    assert!(
        page_ids(&db.store, &any, Some(w.seq("done-ancient")), 10)
            .await
            .is_empty()
    );

    // Expired but not purged: listed for operators, not for its owner.
    let alice = db
        .store
        .task_list_page("alice", None, 100, OPS_NOW)
        .await
        .unwrap();
    assert!(!alice.iter().any(|t| t.task_id == "done-ancient"));
    let ancient = db
        .store
        .ops_task_page(&any, Some(w.seq("done-ancient") + 1), 1)
        .await
        .unwrap();
    assert_eq!(
        ancient,
        vec![TaskSummary {
            seq: w.seq("done-ancient"),
            task_id: "done-ancient".into(),
            status: TaskStatus::Completed,
            tool: "echo".into(),
            owner: "alice".into(),
            created_at: ago(HOUR_MS + MINUTE_MS),
            updated_at: ago(HOUR_MS + 1),
            status_message: None,
        }]
    );

    use TaskStatus::{Cancelled, Completed, Failed, InputRequired, Working};
    let cases: Vec<(TaskFilter, Vec<&str>)> = vec![
        (
            filter(&[Failed], None, None),
            vec!["fail-flaky-1", "fail-flaky-2", "fail-echo"],
        ),
        (
            filter(&[Completed, Cancelled], None, None),
            vec![
                "done-ancient",
                "done-edge",
                "done-recent",
                "cancel-running",
                "cancel-queued",
            ],
        ),
        (
            filter(&[Working, InputRequired], None, None),
            vec![
                "running-echo",
                "running-slow",
                "asking",
                "plain",
                "released-echo",
                "queued-echo-1",
                "queued-echo-2",
                "queued-slow-1",
            ],
        ),
        (filter(&[InputRequired], None, None), vec!["asking"]),
        (
            filter(&[Working, InputRequired], Some("slow"), None),
            vec!["running-slow", "asking", "queued-slow-1"],
        ),
        (
            filter(&[], Some("flaky"), None),
            vec!["fail-flaky-1", "fail-flaky-2"],
        ),
        (
            filter(&[], None, Some("bob")),
            vec![
                "done-recent",
                "fail-flaky-2",
                "running-slow",
                "released-echo",
                "cancel-queued",
                "queued-echo-2",
            ],
        ),
        (
            filter(&[Working], None, Some("bob")),
            vec!["running-slow", "released-echo", "queued-echo-2"],
        ),
        (
            filter(&[], Some("echo"), Some("bob")),
            vec!["done-recent", "released-echo", "queued-echo-2"],
        ),
        (
            filter(&[Working], Some("slow"), Some("bob")),
            vec!["running-slow"],
        ),
        (filter(&[Cancelled], None, Some("carol")), vec![]),
        (filter(&[], None, Some("nobody")), vec![]),
        (filter(&[], Some("unknown"), None), vec![]),
    ];
    for (f, expected) in &cases {
        assert_eq!(
            page_ids(&db.store, f, None, 100).await,
            w.newest_first(expected),
            "{f:?}"
        );
    }

    // Filtered pages page too, on each of the three paths.
    let open = filter(&[Working, InputRequired], None, None);
    assert_eq!(
        page_ids(&db.store, &open, None, 3).await,
        w.newest_first(&["queued-slow-1", "queued-echo-2", "queued-echo-1"])
    );
    assert_eq!(
        page_ids(&db.store, &open, Some(w.seq("queued-echo-1")), 3).await,
        w.newest_first(&["released-echo", "plain", "asking"])
    );
    assert_eq!(
        page_ids(&db.store, &open, Some(w.seq("asking")), 3).await,
        w.newest_first(&["running-slow", "running-echo"])
    );
    let bob = filter(&[], None, Some("bob"));
    assert_eq!(
        page_ids(&db.store, &bob, Some(w.seq("cancel-queued")), 2).await,
        w.newest_first(&["released-echo", "running-slow"])
    );
    let failed = filter(&[Failed], None, None);
    assert_eq!(
        page_ids(&db.store, &failed, Some(w.seq("fail-echo")), 1).await,
        ["fail-flaky-2"]
    );

    // The status message as served.
    let served = db
        .store
        .ops_task_page(&filter(&[Working], Some("echo"), None), None, 100)
        .await
        .unwrap();
    let messages: Vec<(&str, Option<&str>)> = served
        .iter()
        .map(|t| (t.task_id.as_str(), t.status_message.as_deref()))
        .collect();
    let released = format!("queued: {RELEASED}");
    assert_eq!(
        messages,
        [
            ("queued-echo-2", Some("queued")),
            ("queued-echo-1", Some("queued")),
            ("released-echo", Some(released.as_str())),
            ("plain", None),
            ("running-echo", Some("two")),
        ]
    );
    let queued = &served[1];
    assert_eq!(
        (queued.owner.as_str(), queued.created_at, queued.updated_at),
        ("alice", ago(90_000), ago(90_000))
    );
}
store_test!(ops_task_page_filters_and_pages_newest_first);

/// A status change without its feed id: (from, to, message, at).
type Change = (Option<TaskStatus>, TaskStatus, Option<String>, i64);

/// One history's status changes without their feed ids.
fn changes(h: &TaskHistory) -> Vec<Change> {
    h.events
        .iter()
        .map(|e| (e.from_status, e.to_status, e.message.clone(), e.at))
        .collect()
}

/// A job event without its id: (attempt, event, worker, reason, at).
type JobChange = (i64, String, Option<String>, Option<String>, i64);

/// One history's job events without their ids.
fn job_changes(h: &TaskHistory) -> Vec<JobChange> {
    h.job_events
        .iter()
        .map(|e| {
            (
                e.attempt,
                e.event.clone(),
                e.worker.clone(),
                e.reason.clone(),
                e.at,
            )
        })
        .collect()
}

/// Ids strictly increase: oldest first.
#[track_caller]
fn assert_oldest_first(ids: &[i64]) {
    assert!(ids.windows(2).all(|p| p[0] < p[1]), "{ids:?}");
}

/// The history of `id`, which exists.
async fn task_history(store: &Store, id: &str) -> TaskHistory {
    let h = store.ops_task_history(id).await.unwrap().unwrap();
    assert_eq!(h.task.task_id, id);
    assert_oldest_first(&h.events.iter().map(|e| e.id).collect::<Vec<_>>());
    assert_oldest_first(&h.job_events.iter().map(|e| e.id).collect::<Vec<_>>());
    assert_oldest_first(&h.progress.iter().map(|e| e.id).collect::<Vec<_>>());
    h
}

/// `ops_task_history` of any owner's task: the task as served, its job
/// (none for a task made without one), its status changes with their
/// messages, its job's claims, requeue (with the release reason) and
/// finish (how it ended), its progress reports (the latest
/// `PROGRESS_LIMIT` of more) and its requests to the client, each oldest
/// first; None for an unknown id.
async fn ops_task_history_has_status_changes_job_events_progress_and_requests(db: TestDb) {
    let w = ops_world(&db.store).await;
    assert!(
        db.store
            .ops_task_history("unknown")
            .await
            .unwrap()
            .is_none()
    );
    let working = |at: i64| (None, TaskStatus::Working, None, at);
    let claimed =
        |worker: &str, at: i64| (1, "claimed".to_owned(), Some(worker.to_owned()), None, at);

    let h = task_history(&db.store, "running-echo").await;
    let started = ago(20 * MINUTE_MS);
    assert_eq!(
        (
            h.task.status,
            h.task.status_message.as_deref(),
            h.task.owner.as_str()
        ),
        (TaskStatus::Working, Some("two"), "alice")
    );
    assert_eq!(
        h.job,
        Some(JobInfo {
            state: "running".into(),
            attempt: 1,
            max_attempts: 3,
            priority: 0,
            run_after: started,
            lease_owner: Some("w-live".into()),
            lease_expires_at: Some(started + 10 + LEASE_MS),
            cancel_requested: false,
            last_error: None,
            finished_at: None,
        })
    );
    assert_eq!(changes(&h), [working(started)]);
    assert_eq!(job_changes(&h), [claimed("w-live", started + 10)]);
    let progress: Vec<(f64, Option<f64>, Option<&str>, i64)> = h
        .progress
        .iter()
        .map(|p| (p.progress, p.total, p.message.as_deref(), p.at))
        .collect();
    assert_eq!(
        progress,
        [
            (1.0, Some(3.0), Some("one"), ago(10 * MINUTE_MS)),
            (2.0, Some(3.0), Some("two"), ago(5 * MINUTE_MS)),
        ]
    );
    assert!(h.messages.is_empty());

    let h = task_history(&db.store, "fail-flaky-1").await;
    let started = ago(25 * MINUTE_MS);
    assert_eq!(h.task.status, TaskStatus::Failed);
    assert_eq!(h.task.result_kind, Some(ResultKind::Error));
    assert_eq!(
        changes(&h),
        [
            working(started),
            (
                Some(TaskStatus::Working),
                TaskStatus::Failed,
                Some("boom 1".into()),
                ago(20 * MINUTE_MS)
            ),
        ]
    );
    let job = h.job.as_ref().unwrap();
    assert_eq!(
        (
            job.state.as_str(),
            job.attempt,
            job.lease_expires_at,
            job.finished_at
        ),
        ("done", 1, None, Some(ago(20 * MINUTE_MS)))
    );
    assert_eq!(
        job_changes(&h),
        [
            claimed("w-live", started + 10),
            (
                1,
                "finished".into(),
                Some("w-live".into()),
                Some("outcome recorded".into()),
                ago(20 * MINUTE_MS)
            ),
        ]
    );
    assert!(h.progress.is_empty());

    let h = task_history(&db.store, "released-echo").await;
    let started = ago(4 * MINUTE_MS);
    assert_eq!(
        h.job,
        Some(JobInfo {
            state: "queued".into(),
            attempt: 0,
            max_attempts: 3,
            priority: 0,
            run_after: ago(3 * MINUTE_MS),
            lease_owner: None,
            lease_expires_at: None,
            cancel_requested: false,
            last_error: Some(RELEASED.into()),
            finished_at: None,
        })
    );
    assert_eq!(
        job_changes(&h),
        [
            claimed("w-stopping", started + 10),
            (
                1,
                "requeued".into(),
                Some("w-stopping".into()),
                Some(RELEASED.into()),
                ago(3 * MINUTE_MS)
            ),
        ]
    );
    assert_eq!(
        changes(&h),
        [working(started)],
        "a requeue is no status change"
    );

    let h = task_history(&db.store, "cancel-running").await;
    let started = ago(3 * MINUTE_MS);
    assert_eq!(
        changes(&h),
        [
            working(started),
            (
                Some(TaskStatus::Working),
                TaskStatus::Cancelled,
                Some("stopped by alice".into()),
                ago(2 * MINUTE_MS)
            ),
        ]
    );
    let job = h.job.as_ref().unwrap();
    assert_eq!(
        (
            job.state.as_str(),
            job.cancel_requested,
            job.last_error.as_deref()
        ),
        ("done", true, Some("cancelled"))
    );
    assert_eq!(
        job_changes(&h),
        [
            claimed("w-live", started + 10),
            (
                1,
                "finished".into(),
                Some("w-live".into()),
                Some("cancelled".into()),
                ago(2 * MINUTE_MS) + 100
            ),
        ]
    );

    let h = task_history(&db.store, "cancel-queued").await;
    assert_eq!(
        job_changes(&h),
        [(
            0,
            "finished".into(),
            None,
            Some("cancelled while queued".into()),
            ago(15_000)
        )],
        "never claimed"
    );

    let h = task_history(&db.store, "asking").await;
    let asked = "waiting for the client to answer elicitation/create";
    assert_eq!(h.task.status, TaskStatus::InputRequired);
    assert_eq!(
        changes(&h),
        [
            working(ago(8 * MINUTE_MS)),
            (
                Some(TaskStatus::Working),
                TaskStatus::InputRequired,
                Some(asked.into()),
                ago(7 * MINUTE_MS)
            ),
        ]
    );
    assert_eq!(
        h.messages,
        [MessageInfo {
            request_id: "r-asking".into(),
            method: "elicitation/create".into(),
            params: "{}".into(),
            state: "pending".into(),
            response: None,
            created_at: ago(7 * MINUTE_MS),
            answered_at: None,
        }]
    );
    assert_eq!(
        job_changes(&h),
        [claimed("w-embedded", ago(8 * MINUTE_MS) + 10)]
    );

    let h = task_history(&db.store, "plain").await;
    assert!(h.job.is_none() && h.job_events.is_empty() && h.progress.is_empty());
    assert_eq!(changes(&h), [working(ago(6 * MINUTE_MS))]);

    // Only the latest PROGRESS_LIMIT reports, oldest first.
    let seq = w.seq("running-slow");
    let reports = PROGRESS_LIMIT + 2;
    for n in 1..=reports {
        db.store
            .task_record_progress(
                seq,
                &lease_of("running-slow"),
                n as f64,
                None,
                "step",
                ago(60_000) + n,
            )
            .await
            .unwrap();
    }
    let h = task_history(&db.store, "running-slow").await;
    let kept: Vec<f64> = h.progress.iter().map(|p| p.progress).collect();
    let expected: Vec<f64> = (3..=reports).map(|n| n as f64).collect();
    assert_eq!(kept, expected);
    assert_eq!(h.progress.last().unwrap().at, ago(60_000) + reports);
}
store_test!(ops_task_history_has_status_changes_job_events_progress_and_requests);

/// `ops_stats_plans` on [`ops_world`]'s rows: one plan per stats query, in
/// the order `ops_stats` runs them, each by the index it is written for
/// and none a scan of `tasks` or `jobs` without an index (PostgreSQL: no
/// sequential scan).
async fn ops_stats_plans_search_indexes(db: TestDb) {
    ops_world(&db.store).await;
    let plans = db.store.ops_stats_plans(OPS_NOW).await.unwrap();
    let names: Vec<&str> = plans.iter().map(|p| p.name).collect();
    let index_of = [
        ("queued_by_tool", "jobs_queued"),
        ("running_by_tool", "jobs_running_tool"),
        ("open_by_status", "tasks_open_status"),
        ("finished_since", "tasks_finished"),
        ("failures_since", "tasks_finished"),
        ("finished_by_tool", "tasks_finished"),
    ];
    assert_eq!(names, index_of.map(|(name, _)| name));
    for (p, (_, index)) in plans.iter().zip(index_of) {
        assert!(
            p.plan.contains(index),
            "{}: not by {index}:\n{}",
            p.name,
            p.plan
        );
        for line in p.plan.lines() {
            let scan = match db.driver() {
                Driver::Sqlite => {
                    (line.contains("SCAN tasks") || line.contains("SCAN jobs"))
                        && !line.contains("INDEX")
                }
                Driver::Postgres => line.contains("Seq Scan"),
            };
            assert!(!scan, "{}: a full scan:\n{}", p.name, p.plan);
        }
    }
}
store_test!(ops_stats_plans_search_indexes);

/// The `MetricsStore` reads on an empty database, then on
/// [`ops_world`]: the database answers a ping; the schema applied is the
/// one this build knows (one version per migration file); the size is
/// positive and does not shrink as rows arrive; queued jobs by tool with
/// the creation time of the oldest one's task (not when it became
/// runnable again); pools by state (a stopped one not counted); and when
/// each asked job last became runnable (a released job: its release), a
/// task without a job and an unknown row key absent.
async fn metrics_reads_match_the_rows(db: TestDb) {
    db.store.metrics_ping().await.unwrap();
    let known = i64::try_from(migration_files(db.driver())).unwrap();
    assert_eq!(
        db.store.metrics_schema_versions().await.unwrap(),
        SchemaVersions {
            applied: Some(known),
            known,
        }
    );
    let empty_size = db.store.metrics_database_size().await.unwrap();
    assert!(empty_size > 0, "{empty_size}");
    assert!(db.store.metrics_queue_by_tool().await.unwrap().is_empty());
    assert_eq!(
        db.store.metrics_worker_counts().await.unwrap(),
        WorkerCounts::default()
    );
    assert!(
        db.store
            .metrics_jobs_runnable_since(&[1, 2])
            .await
            .unwrap()
            .is_empty()
    );

    let w = ops_world(&db.store).await;
    db.store.metrics_ping().await.unwrap();
    let size = db.store.metrics_database_size().await.unwrap();
    assert!(size >= empty_size, "{size} < {empty_size}");
    let mut queues = db.store.metrics_queue_by_tool().await.unwrap();
    queues.sort_by(|a, b| a.tool.cmp(&b.tool));
    assert_eq!(
        queues,
        [
            QueueDepth {
                tool: "echo".into(),
                depth: 3,
                oldest_created_at: ago(4 * MINUTE_MS),
            },
            QueueDepth {
                tool: "slow".into(),
                depth: 1,
                oldest_created_at: ago(20_000),
            },
        ]
    );
    assert_eq!(
        db.store.metrics_worker_counts().await.unwrap(),
        WorkerCounts {
            live: 2,
            stopping: 1,
            dead: 1,
        }
    );
    assert!(
        db.store
            .metrics_jobs_runnable_since(&[])
            .await
            .unwrap()
            .is_empty()
    );
    let asked = [
        w.seq("queued-echo-1"),
        w.seq("released-echo"),
        w.seq("running-echo"),
        w.seq("done-recent"),
        w.seq("plain"),
        999_999,
    ];
    let mut since = db.store.metrics_jobs_runnable_since(&asked).await.unwrap();
    since.sort_unstable();
    assert_eq!(
        since,
        [
            (w.seq("done-recent"), ago(50_000)),
            (w.seq("running-echo"), ago(20 * MINUTE_MS)),
            (w.seq("released-echo"), ago(3 * MINUTE_MS)),
            (w.seq("queued-echo-1"), ago(90_000)),
        ]
    );
}
store_test!(metrics_reads_match_the_rows);
