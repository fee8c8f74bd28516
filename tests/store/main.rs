//! Store tests, one suite for both drivers: every test that is not about a
//! SQLite file as such runs twice, as `<entity>::<test>::sqlite` on a fresh
//! SQLite file in a temporary directory, and as `<entity>::<test>::postgres`
//! on a fresh PostgreSQL database of its own (`common/pg.rs`; where no
//! server answers the PostgreSQL case is skipped with one line on stderr,
//! unless `TASKBROKER_REQUIRE_POSTGRES=1` makes it fail). A test is an
//! `async fn <test>(db: TestDb)` (or `(fresh: FreshDb)` for a database not
//! opened yet) followed by `store_test!(<test>)`, which makes the two.
//! Run alone: `migrate::sqlite_open_creates_the_file_in_wal_mode` (about
//! the SQLite file itself), `migrate::durability_parses_case_insensitively`
//! (no database), and the `postgres::` tests (about the PostgreSQL driver
//! as such, on PostgreSQL only).
//!
//! This file is the harness (how each driver's database is made and
//! opened, the both-drivers macro, raw SQL beside the store, helpers the
//! entities share); one file per entity of the storage interface holds its
//! tests: `migrate` (`store::open`, `store::open_existing`,
//! `store::migrate`), `tasks`, `feed` (the `ChangeFeed`), `sessions`,
//! `jobs`, `batch` (`write_batch`), `raw_sql` (the database's own rules),
//! `messages`, `tokens`, `workers`, `keys`, `upstreams`, `ops` (the operator reads,
//! `OpsStore`, against one known state written through the store's own
//! methods, `ops_world`, with exact values) and `metrics`
//! (`MetricsStore`). Every method of a `Store` is exercised on both
//! drivers. Time is never read from the clock: `now` is a parameter of
//! every store call, so the tests drive it explicitly (`T0`,
//! `T0 + LEASE_MS + 1`, ...).
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

#[path = "../common/mod.rs"]
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
    self, AnswerOutcome, CancelOutcome, ClaimedJob, Driver, Durability, FeedInterest, NewJob,
    NewSession, NewTask, NewToken, NewWorker, OneWrite, PurgeReport, QueueDepth, QueuedJobs,
    RescueReport, ResultKind, Retention, SchemaVersions, Signal, Store, StoreError, TaskMessage,
    TaskOutcome, TaskRow, TaskStatus, ToolQuota, WorkerCounts, WorkerKind, WorkerState, Write,
    Written,
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
    run_after: None,
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
                crate::run(crate::Driver::Sqlite, super::$name).await;
            }

            #[$test]
            async fn postgres() {
                crate::run(crate::Driver::Postgres, super::$name).await;
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

    /// Run one statement made at run time (a column name in it, say).
    async fn execute_text(&self, sql: String, args: &[Arg]) -> Result<u64, sqlx::Error> {
        on_pool!(self, |pool| bind_all!(
            sqlx::query(sqlx::AssertSqlSafe(sql.clone())),
            args
        )
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

/// Now in ms since the epoch: heartbeats are judged against the
/// database's clock.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A worker process's row `id` of `concurrency` (30 s lease), as its
/// pool registers it.
fn process_worker(id: &str, concurrency: i64) -> NewWorker {
    NewWorker {
        worker_id: id.to_owned(),
        pid: 7,
        host: "host-test".to_owned(),
        kind: WorkerKind::Process,
        concurrency,
        lease_ms: 30_000,
    }
}

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
        idempotency_key: None,
        retention: Default::default(),
        traceparent: None,
        tracestate: None,
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
        tool_error: false,
    }
}

fn failed_outcome(message: &str) -> TaskOutcome {
    TaskOutcome {
        status: TaskStatus::Failed,
        status_message: Some(message.to_owned()),
        result: r#"{"code":-32602,"message":"Invalid params"}"#.to_owned(),
        result_kind: ResultKind::Error,
        tool_error: false,
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

/// `n` running tasks of alice, `t0` to `t{n-1}`, their jobs claimed by
/// `w1` with lease `lease-1`; their seqs in order.
async fn running_tasks(store: &Store, n: usize) -> Vec<i64> {
    for i in 0..n {
        store
            .task_create(&new_task(&format!("t{i}"), "alice"), Some(JOB), None, T0)
            .await
            .unwrap();
    }
    let limit = i64::try_from(n).unwrap();
    let mut seqs: Vec<i64> = store
        .job_claim_available("w1", "lease-1", &echo(limit), limit, LEASE_MS, T0 + 1)
        .await
        .unwrap()
        .iter()
        .map(|j| j.task_seq)
        .collect();
    assert_eq!(seqs.len(), n);
    seqs.sort_unstable();
    seqs
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

// The tests, one file per entity (after the macros above, which they use).
mod batch;
mod feed;
mod jobs;
mod keys;
mod messages;
mod metrics;
mod migrate;
mod ops;
mod postgres;
mod raw_sql;
mod sessions;
mod tasks;
mod tokens;
mod upstreams;
mod workers;
