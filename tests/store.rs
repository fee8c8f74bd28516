//! Store tests against real SQLite files: one fresh database file per test,
//! in its own temporary directory.
//!
//! Every public function of `taskbroker::store::Store` is exercised here.
//! Time is never read from the clock: `now` is a parameter of every store
//! call, so the tests drive it explicitly (`T0`, `T0 + LEASE_MS + 1`, ...).
//!
//! Spec ids named below: T-9 (a task starts working), T-11 (allowed
//! transitions, terminal immutability), T-13 (lastUpdatedAt moves, never
//! backwards), T-17/T-18 (tasks/list pagination), T-22 (cancelled stays
//! cancelled), T-33/T-34 (ttl and purge).
//!
//! The `raw_sql_*` tests bypass the store and talk to the migrated file with a
//! plain `SqlitePool`: the database itself must refuse what the lifecycle
//! rules forbid.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use taskbroker::store::{
    self, CancelOutcome, ClaimedJob, Durability, NewJob, NewSession, NewTask, RescueReport,
    ResultKind, Store, StoreError, TaskOutcome, TaskRow, TaskStatus, ToolQuota, Write, Written,
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

// Helpers -------------------------------------------------------------------

/// A fresh, migrated database file and a store on it. The directory (and the
/// file) is removed when this is dropped.
struct TestDb {
    _dir: TempDir,
    path: PathBuf,
    store: Store,
}

impl TestDb {
    async fn new() -> Self {
        let dir = tempfile::tempdir().expect("create temp dir");
        let path = dir.path().join("broker.db");
        let store = store::open(&path, Durability::Full)
            .await
            .expect("open store");
        Self {
            _dir: dir,
            path,
            store,
        }
    }

    /// A plain pool on the same file, outside the store (a sqlite3 shell).
    async fn raw(&self) -> SqlitePool {
        raw_pool(&self.path).await
    }
}

async fn raw_pool(path: &Path) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(10));
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("open raw pool")
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
async fn history(pool: &SqlitePool, task_id: &str) -> Vec<HistoryRow> {
    sqlx::query_as(
        "SELECT from_status, to_status, message, at FROM task_events WHERE task_id = ? ORDER BY id",
    )
    .bind(task_id)
    .fetch_all(pool)
    .await
    .expect("read history")
}

/// Just the (from, to) pairs of a task's history.
async fn transitions(pool: &SqlitePool, task_id: &str) -> Vec<(Option<String>, String)> {
    history(pool, task_id)
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

async fn job(pool: &SqlitePool, task_seq: i64) -> Option<JobState> {
    let row: Option<JobTuple> = sqlx::query_as(
        "SELECT state, attempt, max_attempts, priority, run_after, lease_owner, lease_token,
                lease_expires_at, cancel_requested, last_error, finished_at
           FROM jobs WHERE task_seq = ?",
    )
    .bind(task_seq)
    .fetch_optional(pool)
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

async fn count_rows(pool: &SqlitePool, sql: &'static str, task_seq: i64) -> i64 {
    sqlx::query_scalar(sql)
        .bind(task_seq)
        .fetch_one(pool)
        .await
        .expect("count rows")
}

async fn get(store: &Store, task_id: &str) -> TaskRow {
    store
        .task_get(task_id)
        .await
        .expect("task_get")
        .unwrap_or_else(|| panic!("task {task_id} not found"))
}

/// Claim exactly one job and return it.
/// A claim's quota for the tool of [`new_task`]: `n` jobs of `echo`.
fn echo(n: i64) -> Vec<ToolQuota> {
    vec![ToolQuota {
        tool: "echo".into(),
        free: n,
        global: None,
    }]
}

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

/// The two trigger texts a status change of a terminal task can meet: both
/// triggers apply, and which one SQLite fires first is its own business.
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

// open / migrate / close ------------------------------------------------------

#[tokio::test]
async fn open_creates_wal_database_and_data_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    assert!(!path.exists());

    let store = store::open(&path, Durability::Full).await.unwrap();
    assert!(path.exists(), "open creates the file");
    assert_eq!(store.describe(), path.display().to_string());
    store
        .task_create(&new_task("t-1", "alice"), Some(JOB), None, T0)
        .await
        .unwrap();
    store.close().await;

    let raw = raw_pool(&path).await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&raw)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    raw.close().await;

    // Reopen (with the other durability): the task is still there.
    let store = store::open(&path, Durability::Normal).await.unwrap();
    let row = get(&store, "t-1").await;
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(row.owner, "alice");
    store.close().await;
}

#[tokio::test]
async fn durability_parses_case_insensitively() {
    assert_eq!("full".parse::<Durability>().unwrap(), Durability::Full);
    assert_eq!("NORMAL".parse::<Durability>().unwrap(), Durability::Normal);
    assert_eq!(Durability::default(), Durability::Full);
    let err = "fast".parse::<Durability>().unwrap_err();
    assert!(err.contains("fast"), "{err}");
}

#[tokio::test]
async fn open_two_handles_concurrently_on_a_fresh_file() {
    // Two processes starting at once on a new file both migrate it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("race.db");
    let (a, b) = tokio::join!(
        store::open(&path, Durability::Full),
        store::open(&path, Durability::Full)
    );
    let a = a.expect("first open");
    let b = b.expect("second open");
    a.task_create(&new_task("t-a", "alice"), None, None, T0)
        .await
        .unwrap();
    assert_eq!(get(&b, "t-a").await.task_id, "t-a");
    let raw = raw_pool(&path).await;
    let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM refinery_schema_history")
        .fetch_one(&raw)
        .await
        .unwrap();
    assert_eq!(
        applied as usize,
        migration_files(),
        "each migration is recorded once"
    );
}

/// How many migration files the repository has.
fn migration_files() -> usize {
    std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite"))
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

#[tokio::test]
async fn migrate_applies_once_then_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("migrate.db");
    let files = migration_files();
    assert_eq!(
        store::migrate(&path).await.unwrap(),
        files,
        "fresh file: every migration"
    );
    assert_eq!(store::migrate(&path).await.unwrap(), 0, "second run: none");

    // open migrates too, and finds nothing to do.
    let store = store::open(&path, Durability::Full).await.unwrap();
    assert_eq!(store::migrate(&path).await.unwrap(), 0);
    store
        .task_create(&new_task("t-1", "alice"), None, None, T0)
        .await
        .unwrap();
    store.close().await;

    let raw = raw_pool(&path).await;
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM refinery_schema_history ORDER BY version")
            .fetch_all(&raw)
            .await
            .unwrap();
    assert_eq!(versions, (1..=files as i64).collect::<Vec<_>>());
}

// task_create / task_get -----------------------------------------------------

#[tokio::test]
async fn task_create_without_job_starts_working_t9() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_create_with_job_queues_it() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_create_with_outcome_history_shows_working_then_failed_t9() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_create_duplicate_task_id_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
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
    let tasks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tasks")
        .fetch_one(&raw)
        .await
        .unwrap();
    let jobs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
        .fetch_one(&raw)
        .await
        .unwrap();
    assert_eq!((tasks, jobs), (1, 1), "the failed transaction left nothing");
    assert_eq!(history(&raw, "t-1").await.len(), 1);
}

// task_list_page ---------------------------------------------------------------

#[tokio::test]
async fn task_list_page_newest_first_keyset_by_before_seq_t17_t18() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_list_page_excludes_expired_rows_t33() {
    let db = TestDb::new().await;
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

// task_cancel ------------------------------------------------------------------

#[tokio::test]
async fn task_cancel_not_found_for_other_owner_or_unknown_id() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_cancel_terminal_for_completed_task_t11() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_cancel_finishes_a_queued_job() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_cancel_running_job_requests_stop_and_keeps_it_running() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_cancel_without_job_and_never_moves_updated_at_backwards_t13() {
    let db = TestDb::new().await;
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

// task_set_status_message ------------------------------------------------------

#[tokio::test]
async fn task_set_status_message_with_lease_moves_updated_at_t13() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn task_set_status_message_lease_lost_with_wrong_token() {
    let db = TestDb::new().await;
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

// task_purge_expired -------------------------------------------------------------

#[tokio::test]
async fn task_purge_expired_deletes_task_job_and_history_t33_t34() {
    let db = TestDb::new().await;
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
                "SELECT COUNT(*) FROM task_events WHERE task_seq = ?",
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

    // A purged seq is never handed out again (AUTOINCREMENT).
    let next = db
        .store
        .task_create(&new_task("next", "alice"), None, None, T0 + 10_000_001)
        .await
        .unwrap();
    assert!(next.seq > forever.seq);
}

// change feed: change_feed (version, next_events, next_progress) / task_events_head

#[tokio::test]
async fn change_feed_follows_every_transition_from_the_head() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn change_feed_version_moves_when_another_handle_commits() {
    let db = TestDb::new().await;
    let shutdown = CancellationToken::new();
    let mut feed = db.store.change_feed(shutdown.clone()).await.unwrap();
    let v1 = feed.version().await.unwrap();
    assert_eq!(feed.version().await.unwrap(), v1, "no commit, no change");

    // A commit through this store.
    db.store
        .task_create(&new_task("t-1", "alice"), None, None, T0)
        .await
        .unwrap();
    let v2 = feed.version().await.unwrap();
    assert_ne!(v2, v1);

    // A commit from another handle on the database (another process),
    // announced as a process does after its commits: the feed's remote
    // signal fires.
    let other = store::open(&db.path, Durability::Full).await.unwrap();
    let other_feed = other.change_feed(shutdown.clone()).await.unwrap();
    let remote = feed.remote();
    let woken = remote.notified();
    other.session_create(&new_session("s-1"), T0).await.unwrap();
    other.announce_commit();
    tokio::time::timeout(Duration::from_secs(10), woken)
        .await
        .expect("the other handle's commit wakes this feed");
    let v3 = feed.version().await.unwrap();
    assert_ne!(v3, v2);

    let events = feed.next_events(10).await.unwrap();
    assert_eq!(events.len(), 1);
    shutdown.cancel();
    // A feed holds a connection of its own: drop it before closing.
    drop(other_feed);
    other.close().await;
}

#[tokio::test]
async fn change_feed_reads_progress_reports_in_order() {
    let db = TestDb::new().await;
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

// sessions -----------------------------------------------------------------------

#[tokio::test]
async fn session_create_get_touch_end() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn session_create_refuses_invalid_json() {
    let db = TestDb::new().await;
    let mut bad = new_session("s-bad");
    bad.client_info = "{not json".to_owned();
    let err = db.store.session_create(&bad, T0).await.unwrap_err();
    assert!(err.to_string().contains("CHECK constraint failed"), "{err}");
    assert_eq!(db.store.session_get("s-bad").await.unwrap(), None);
}

// job_claim_available -------------------------------------------------------------

#[tokio::test]
async fn job_claim_available_priority_then_age() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn job_claim_available_respects_limit() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn job_claim_available_skips_run_after_in_the_future() {
    let db = TestDb::new().await;
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

// job_heartbeat ----------------------------------------------------------------------

#[tokio::test]
async fn job_heartbeat_extends_lease() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn job_heartbeat_reports_cancel_requested() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn job_heartbeat_lease_lost_with_wrong_token() {
    let db = TestDb::new().await;
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

// job_complete -------------------------------------------------------------------------

#[tokio::test]
async fn job_complete_records_outcome_and_closes_job() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn job_complete_with_wrong_token_writes_nothing() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn job_complete_after_cancel_returns_false_and_task_stays_cancelled_t22() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn job_complete_by_stale_worker_after_rescue_is_fenced() {
    let db = TestDb::new().await;
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

// job_finish_cancelled --------------------------------------------------------------------

#[tokio::test]
async fn job_finish_cancelled_closes_the_job_fenced() {
    let db = TestDb::new().await;
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

// job_rescue_expired ------------------------------------------------------------------------

#[tokio::test]
async fn job_rescue_expired_leaves_live_leases_alone() {
    let db = TestDb::new().await;
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

#[tokio::test]
async fn job_rescue_expired_requeues_with_backoff_while_attempts_remain() {
    let db = TestDb::new().await;
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
            failed: 0,
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

#[tokio::test]
async fn job_rescue_expired_fails_task_when_attempts_are_exhausted() {
    let db = TestDb::new().await;
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
            failed: 1,
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

#[tokio::test]
async fn job_rescue_expired_closes_jobs_of_cancelled_tasks_t22() {
    let db = TestDb::new().await;
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
            failed: 0,
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

#[tokio::test]
async fn job_rescue_expired_mixed_batch_counts_each_kind() {
    let db = TestDb::new().await;
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
            failed: 1,
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

// Two claimers, two handles on one file -------------------------------------------------------

/// Two `Store` handles on one file, as two broker processes would have.
async fn two_handles(db: &TestDb) -> (Store, Store) {
    let a = store::open(&db.path, Durability::Full).await.unwrap();
    let b = store::open(&db.path, Durability::Full).await.unwrap();
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claimers_racing_for_one_job_exactly_one_wins() {
    let db = TestDb::new().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claimers_draining_one_queue_never_share_a_job() {
    let db = TestDb::new().await;
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

// The database itself enforces the lifecycle (raw SQL) -------------------------------------------

/// Insert a working task directly; returns its seq.
async fn raw_insert_task(pool: &SqlitePool, task_id: &'static str, at: i64) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
         VALUES (?, 'alice', 'echo', '{}', 'working', ?, ?) RETURNING seq",
    )
    .bind(task_id)
    .bind(at)
    .bind(at)
    .fetch_one(pool)
    .await
    .expect("insert working task")
}

/// Move a task to a terminal status directly (an allowed transition).
async fn raw_finish(pool: &SqlitePool, seq: i64, status: &'static str, at: i64) {
    let (result, kind) = match status {
        "completed" => (Some(r#"{"content":[]}"#), Some("result")),
        "failed" => (Some(r#"{"code":-32603,"message":"x"}"#), Some("error")),
        _ => (None, None),
    };
    sqlx::query(
        "UPDATE tasks SET status = ?, result = ?, result_kind = ?, updated_at = ? WHERE seq = ?",
    )
    .bind(status)
    .bind(result)
    .bind(kind)
    .bind(at)
    .bind(seq)
    .execute(pool)
    .await
    .expect("allowed transition to a terminal status");
}

#[tokio::test]
async fn raw_sql_insert_must_start_working_t9() {
    let db = TestDb::new().await;
    let raw = db.raw().await;
    for status in ["completed", "failed", "cancelled", "input_required"] {
        let result = sqlx::query(
            "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
             VALUES (?, 'alice', 'echo', '{}', ?, 0, 0)",
        )
        .bind(format!("t-{status}"))
        .bind(status)
        .execute(&raw)
        .await;
        assert_refused(result, "a task must start in status working (T-9)");
    }
    let tasks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tasks")
        .fetch_one(&raw)
        .await
        .unwrap();
    let events: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM task_events")
        .fetch_one(&raw)
        .await
        .unwrap();
    assert_eq!((tasks, events), (0, 0), "nothing inserted, no history");
}

#[tokio::test]
async fn raw_sql_allowed_transitions_write_one_history_row_each_t11() {
    let db = TestDb::new().await;
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;

    // working -> working is not a transition: allowed, no history row.
    sqlx::query("UPDATE tasks SET status = 'working', status_message = 'still going', updated_at = ? WHERE seq = ?")
        .bind(T0 + 1)
        .bind(seq)
        .execute(&raw)
        .await
        .unwrap();
    // working -> input_required -> working -> completed: all allowed.
    for (status, at) in [
        ("input_required", T0 + 2),
        ("working", T0 + 3),
        ("input_required", T0 + 4),
    ] {
        sqlx::query(
            "UPDATE tasks SET status = ?, status_message = ?, updated_at = ? WHERE seq = ?",
        )
        .bind(status)
        .bind(format!("now {status}"))
        .bind(at)
        .bind(seq)
        .execute(&raw)
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
            sqlx::query("UPDATE tasks SET status = 'input_required', updated_at = ? WHERE seq = ?")
                .bind(T0 + 1)
                .bind(seq)
                .execute(&raw)
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

#[tokio::test]
async fn raw_sql_terminal_tasks_never_change_t11() {
    let db = TestDb::new().await;
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
        let r = sqlx::query("UPDATE tasks SET status = 'working', updated_at = ? WHERE seq = ?")
            .bind(T0 + 2)
            .bind(seq)
            .execute(&raw)
            .await;
        assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
        // To another terminal status: refused.
        let other = if status == "cancelled" {
            "failed"
        } else {
            "cancelled"
        };
        let r = sqlx::query("UPDATE tasks SET status = ?, result = NULL, result_kind = NULL, updated_at = ? WHERE seq = ?")
            .bind(other)
            .bind(T0 + 2)
            .bind(seq)
            .execute(&raw)
            .await;
        assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
        // Any other column: refused by the terminal trigger.
        let r = sqlx::query("UPDATE tasks SET status_message = 'rewritten' WHERE seq = ?")
            .bind(seq)
            .execute(&raw)
            .await;
        assert_refused(r, terminal_msg);
        let r = sqlx::query("UPDATE tasks SET updated_at = updated_at + 1 WHERE seq = ?")
            .bind(seq)
            .execute(&raw)
            .await;
        assert_refused(r, terminal_msg);
        let r = sqlx::query("UPDATE tasks SET poll_interval_ms = 1 WHERE seq = ?")
            .bind(seq)
            .execute(&raw)
            .await;
        assert_refused(r, terminal_msg);
        // Even a no-op update of a terminal row is refused.
        let r = sqlx::query("UPDATE tasks SET status = status WHERE seq = ?")
            .bind(seq)
            .execute(&raw)
            .await;
        assert_refused(r, terminal_msg);
        if status != "cancelled" {
            let r = sqlx::query("UPDATE tasks SET result = '{}' WHERE seq = ?")
                .bind(seq)
                .execute(&raw)
                .await;
            assert_refused(r, terminal_msg);
        }
        assert_eq!(get(&db.store, id).await, before, "{id} unchanged");
        assert_eq!(transitions(&raw, id).await.len(), 2, "{id}: no new history");
    }
}

#[tokio::test]
async fn raw_sql_completed_to_working_refused_t11() {
    let db = TestDb::new().await;
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw_finish(&raw, seq, "completed", T0 + 1).await;
    let r = sqlx::query(
        "UPDATE tasks SET status = 'working', result = NULL, result_kind = NULL WHERE seq = ?",
    )
    .bind(seq)
    .execute(&raw)
    .await;
    assert_refused_any(r, &[T11_TERMINAL, T11_TRANSITION]);
    assert_eq!(get(&db.store, "t-1").await.status, TaskStatus::Completed);
}

#[tokio::test]
async fn raw_sql_identity_columns_are_immutable() {
    let db = TestDb::new().await;
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    let before = get(&db.store, "t-1").await;
    let msg = "task identity columns are immutable";
    let statements: [&'static str; 7] = [
        "UPDATE tasks SET task_id = 't-other' WHERE seq = ?",
        "UPDATE tasks SET owner = 'mallory' WHERE seq = ?",
        "UPDATE tasks SET created_at = created_at - 1 WHERE seq = ?",
        "UPDATE tasks SET tool = 'rm' WHERE seq = ?",
        "UPDATE tasks SET arguments = '{\"x\":1}' WHERE seq = ?",
        "UPDATE tasks SET ttl_ms = 5, expires_at = created_at + 5 WHERE seq = ?",
        "UPDATE tasks SET seq = seq + 1000 WHERE seq = ?",
    ];
    for sql in statements {
        let r = sqlx::query(sql).bind(seq).execute(&raw).await;
        assert_refused(r, msg);
    }
    // Setting a column to its own value is not a change.
    sqlx::query("UPDATE tasks SET owner = owner, task_id = task_id WHERE seq = ?")
        .bind(seq)
        .execute(&raw)
        .await
        .unwrap();
    assert_eq!(get(&db.store, "t-1").await, before);
}

#[tokio::test]
async fn raw_sql_updated_at_never_moves_backwards_t13() {
    let db = TestDb::new().await;
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    sqlx::query("UPDATE tasks SET updated_at = ? WHERE seq = ?")
        .bind(T0 + 100)
        .bind(seq)
        .execute(&raw)
        .await
        .unwrap();
    let r = sqlx::query("UPDATE tasks SET status_message = 'x', updated_at = ? WHERE seq = ?")
        .bind(T0 + 99)
        .bind(seq)
        .execute(&raw)
        .await;
    assert_refused(r, "updated_at cannot move backwards");
    let row = get(&db.store, "t-1").await;
    assert_eq!(row.updated_at, T0 + 100);
    assert_eq!(row.status_message, None);
}

#[tokio::test]
async fn raw_sql_task_events_are_append_only() {
    let db = TestDb::new().await;
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;
    raw_finish(&raw, seq, "completed", T0 + 1).await;

    let r = sqlx::query("DELETE FROM task_events WHERE task_seq = ?")
        .bind(seq)
        .execute(&raw)
        .await;
    assert_refused(r, "task_events of an existing task cannot be deleted");
    let r = sqlx::query("UPDATE task_events SET to_status = 'failed' WHERE task_seq = ?")
        .bind(seq)
        .execute(&raw)
        .await;
    assert_refused(r, "task_events is append-only");
    let r = sqlx::query("UPDATE task_events SET message = 'edited' WHERE task_seq = ?")
        .bind(seq)
        .execute(&raw)
        .await;
    assert_refused(r, "task_events is append-only");
    assert_eq!(
        transitions(&raw, "t-1").await,
        vec![tr(None, "working"), tr(Some("working"), "completed")]
    );

    // Deleting the task (what the ttl purge does) takes its history along.
    sqlx::query("DELETE FROM tasks WHERE seq = ?")
        .bind(seq)
        .execute(&raw)
        .await
        .unwrap();
    assert!(history(&raw, "t-1").await.is_empty());
}

#[tokio::test]
async fn raw_sql_unknown_status_value_refused_by_check() {
    let db = TestDb::new().await;
    let raw = db.raw().await;
    let seq = raw_insert_task(&raw, "t-1", T0).await;

    // Through the triggers, 'done' is refused (it is no allowed transition,
    // and no allowed initial status).
    let r = sqlx::query("UPDATE tasks SET status = 'done', updated_at = ? WHERE seq = ?")
        .bind(T0 + 1)
        .bind(seq)
        .execute(&raw)
        .await;
    assert_refused(r, T11_TRANSITION);
    let r = sqlx::query(
        "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
         VALUES ('t-done', 'alice', 'echo', '{}', 'done', 0, 0)",
    )
    .execute(&raw)
    .await;
    assert_refused(r, "a task must start in status working (T-9)");

    // Behind the triggers the CHECK itself holds: drop the triggers inside a
    // transaction (rolled back), then try again.
    let mut tx = raw.begin().await.unwrap();
    sqlx::raw_sql(
        "DROP TRIGGER tasks_insert_working;
         DROP TRIGGER tasks_transition_allowed;",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let r = sqlx::query("UPDATE tasks SET status = 'done', updated_at = ? WHERE seq = ?")
        .bind(T0 + 1)
        .bind(seq)
        .execute(&mut *tx)
        .await;
    assert_refused(r, "CHECK constraint failed");
    let r = sqlx::query(
        "INSERT INTO tasks (task_id, owner, tool, arguments, status, created_at, updated_at)
         VALUES ('t-done', 'alice', 'echo', '{}', 'done', 0, 0)",
    )
    .execute(&mut *tx)
    .await;
    assert_refused(r, "CHECK constraint failed");
    tx.rollback().await.unwrap();

    // The rollback restored the triggers.
    let triggers: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'
            AND name IN ('tasks_insert_working', 'tasks_transition_allowed')",
    )
    .fetch_one(&raw)
    .await
    .unwrap();
    assert_eq!(triggers, 2);
    let row = get(&db.store, "t-1").await;
    assert_eq!(row.status, TaskStatus::Working);
    assert_eq!(history(&raw, "t-1").await.len(), 1);
}

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
#[tokio::test]
async fn write_batch_groups_creations_and_completions() {
    let db = TestDb::new().await;
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

/// A write the grouped statements cannot take (a duplicate task id) sends
/// the batch one by one: that write fails alone, the others commit.
#[tokio::test]
async fn write_batch_failing_write_fails_alone() {
    let db = TestDb::new().await;
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
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&raw)
        .await
        .unwrap();
    assert_eq!(n, 3);
    assert!(job(&raw, first.seq).await.is_some());
    assert!(job(&raw, other.seq).await.is_some());
    assert!(job(&raw, refused.seq).await.is_none());
}

/// The same job completed twice in one batch: the first holds the lease,
/// the second is fenced out.
#[tokio::test]
async fn write_batch_same_job_twice_second_is_fenced() {
    let db = TestDb::new().await;
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

/// A job back in the queue (its worker vanished) abandons what the lost
/// attempt asked the client and sets an input_required task working again
/// (T-27), in the rescue itself, stamped with the rescuer's clock; while it
/// waits, the task says it is queued and why; the next run starts with no
/// stale message.
#[tokio::test]
async fn new_attempt_abandons_old_requests_and_resumes_working() {
    let db = TestDb::new().await;
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
    let state: String =
        sqlx::query_scalar("SELECT state FROM task_messages WHERE request_id = 'r-1'")
            .fetch_one(&raw)
            .await
            .unwrap();
    assert_eq!(state, "abandoned");
}

/// A claim in a group commit sees the jobs created earlier in the same
/// batch, and shares its transaction.
#[tokio::test]
async fn write_batch_claim_sees_jobs_created_in_the_same_batch() {
    let db = TestDb::new().await;
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

/// A claim undone (its pool stopped before it got the job): queued again,
/// the attempt not counted, fenced by the lease token.
#[tokio::test]
async fn job_unclaim_queues_again_without_counting_the_attempt() {
    let db = TestDb::new().await;
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

/// A claim takes at most each tool's quota, leaves tools without a quota,
/// and for a tool with a global limit counts its running jobs in every
/// process, except those of tasks waiting for their client.
#[tokio::test]
async fn job_claim_respects_tool_quotas_and_global_limits() {
    let db = TestDb::new().await;
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

/// Sessions idle past their time stop counting as live at once unless they
/// own a task whose ttl has not run out; the sweeper ends them, then
/// deletes ended sessions that own no unexpired task.
#[tokio::test]
async fn session_expiry_counts_and_sweeps() {
    let db = TestDb::new().await;
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
