//! Smoke tests of the PostgreSQL driver against a real server: each test
//! makes a database of its own (random name) on the server that
//! `TASKBROKER_TEST_POSTGRES` names (default: postgres@127.0.0.1:5432) and
//! drops it at the end, even when the test fails. Where no server answers
//! they are skipped with a line saying so, unless
//! `TASKBROKER_REQUIRE_POSTGRES` is set (CI): then they fail.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use taskbroker_postgres::{FEED_LOCK_KEY, PostgresStore};
use taskbroker_storage::*;
use tokio_util::sync::CancellationToken;

const NOW: i64 = 1_700_000_000_000;
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432";

/// A database of one test: created empty, dropped (forcibly) on drop.
struct TestDb {
    name: String,
    url: String,
    admin_url: String,
}

fn server_url() -> url::Url {
    let text = std::env::var("TASKBROKER_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    url::Url::parse(&text).expect("TASKBROKER_TEST_POSTGRES is a URL")
}

impl TestDb {
    /// A fresh database, or `None` (said once) where no server answers.
    async fn create() -> Option<Self> {
        let name = format!("tbk_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = server_url();
        admin.set_path("/postgres");
        let mut url = server_url();
        url.set_path(&format!("/{name}"));
        let mut conn = match sqlx::PgConnection::connect(admin.as_str()).await {
            Ok(conn) => conn,
            Err(e) if std::env::var_os("TASKBROKER_REQUIRE_POSTGRES").is_none() => {
                static SAID: std::sync::Once = std::sync::Once::new();
                // Straight to fd 2: the test harness captures eprintln!.
                SAID.call_once(|| {
                    use std::io::Write;
                    let _ = writeln!(
                        std::io::stderr(),
                        "skipping the PostgreSQL cases: no server at {admin} ({e})"
                    );
                });
                return None;
            }
            Err(e) => panic!("PostgreSQL is required (TASKBROKER_REQUIRE_POSTGRES): {e}"),
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create the test database");
        conn.close().await.ok();
        Some(Self {
            name,
            url: url.to_string(),
            admin_url: admin.to_string(),
        })
    }

    async fn open(&self) -> PostgresStore {
        PostgresStore::open(&self.url, Durability::Normal)
            .await
            .expect("open the test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin_url.clone();
        let name = self.name.clone();
        // Async work in a drop: a runtime of its own, on a thread of its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let mut conn = sqlx::PgConnection::connect(&admin).await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}

fn new_task(id: &str, owner: &str, tool: &str) -> NewTask {
    NewTask {
        task_id: id.to_owned(),
        owner: owner.to_owned(),
        tool: tool.to_owned(),
        arguments: r#"{"n":1}"#.to_owned(),
        ttl_ms: Some(3_600_000),
        poll_interval_ms: Some(1000),
        progress_token: None,
        session_id: None,
        client_capabilities: None,
    }
}

fn job(max_attempts: i64) -> Option<NewJob> {
    Some(NewJob {
        max_attempts,
        priority: 0,
    })
}

fn quota(tool: &str, free: i64) -> Vec<ToolQuota> {
    vec![ToolQuota {
        tool: tool.to_owned(),
        free,
        global: None,
    }]
}

fn done(text: &str) -> TaskOutcome {
    TaskOutcome {
        status: TaskStatus::Completed,
        status_message: None,
        result: format!(r#"{{"content":[{{"type":"text","text":"{text}"}}]}}"#),
        result_kind: ResultKind::Result,
        tool_error: false,
    }
}

async fn job_state(db: &TestDb, seq: i64) -> (String, i64, Option<String>) {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let row: (String, i64, Option<String>) =
        sqlx::query_as("SELECT state, cancel_requested, last_error FROM jobs WHERE task_seq = $1")
            .bind(seq)
            .fetch_one(&mut conn)
            .await
            .expect("the job");
    conn.close().await.ok();
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_heartbeat_complete() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = Arc::new(db.open().await);
    assert_eq!(store.driver(), Driver::Postgres);
    assert!(!store.describe().contains("secret"));

    let mut seqs = HashSet::new();
    for i in 0..20 {
        let row = store
            .task_create(
                &new_task(&format!("t{i}"), "alice", "echo"),
                job(3),
                None,
                NOW,
            )
            .await
            .expect("create");
        assert_eq!(row.status, TaskStatus::Working);
        assert_eq!(row.status_message.as_deref(), Some("queued"));
        seqs.insert(row.seq);
    }
    assert!(store.job_any_runnable(NOW).await.expect("runnable"));

    // Two claimers at once: disjoint sets that cover every job.
    let claimer = |name: &'static str| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = store
                    .job_claim_available(
                        name,
                        &format!("lease-{name}"),
                        &quota("echo", 3),
                        3,
                        60_000,
                        NOW,
                    )
                    .await
                    .expect("claim");
                if got.is_empty() && !store.job_any_runnable(NOW).await.expect("runnable") {
                    return mine;
                }
                mine.extend(got);
            }
        })
    };
    let (a, b) = (claimer("a"), claimer("b"));
    let (a, b) = (a.await.expect("a"), b.await.expect("b"));
    let a_seqs: HashSet<i64> = a.iter().map(|j| j.task_seq).collect();
    let b_seqs: HashSet<i64> = b.iter().map(|j| j.task_seq).collect();
    assert_eq!(a_seqs.len(), a.len());
    assert_eq!(b_seqs.len(), b.len());
    assert!(a_seqs.is_disjoint(&b_seqs), "a job claimed twice");
    assert_eq!(&a_seqs | &b_seqs, seqs);
    let first = a.first().or(b.first()).expect("a claim").clone();
    assert_eq!(first.attempt, 1);
    assert_eq!(first.max_attempts, 3);
    assert_eq!(first.tool, "echo");
    assert_eq!(first.arguments, r#"{"n":1}"#);

    let beat = store
        .job_heartbeat(first.task_seq, &first.lease_token, 60_000, NOW + 10)
        .await
        .expect("heartbeat");
    assert!(!beat.cancel_requested);
    assert!(matches!(
        store
            .job_heartbeat(first.task_seq, "wrong", 60_000, NOW + 10)
            .await,
        Err(StoreError::LeaseLost)
    ));
    store
        .task_set_status_message(first.task_seq, &first.lease_token, "halfway", NOW + 20)
        .await
        .expect("status message");
    assert!(matches!(
        store
            .task_set_status_message(first.task_seq, "wrong", "no", NOW + 20)
            .await,
        Err(StoreError::LeaseLost)
    ));
    store
        .task_record_progress(
            first.task_seq,
            &first.lease_token,
            1.0,
            Some(2.0),
            "one of two",
            NOW + 30,
        )
        .await
        .expect("progress");

    assert!(matches!(
        store
            .job_complete(first.task_seq, "wrong", &done("x"), NOW + 40)
            .await,
        Err(StoreError::LeaseLost)
    ));
    let took = store
        .job_complete(first.task_seq, &first.lease_token, &done("ok"), NOW + 40)
        .await
        .expect("complete");
    assert!(took);
    let task = store
        .task_get(&first.task_id)
        .await
        .expect("get")
        .expect("the task");
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.result_kind, Some(ResultKind::Result));
    assert_eq!(task.updated_at, NOW + 40);
    // The lease is gone with the job.
    assert!(matches!(
        store
            .job_complete(first.task_seq, &first.lease_token, &done("again"), NOW + 50)
            .await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(store.task_count_open("alice").await.expect("count"), 19);
    store.close().await;
}

#[tokio::test]
async fn global_limit_holds_across_claims() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    for i in 0..6 {
        store
            .task_create(
                &new_task(&format!("g{i}"), "alice", "gpu"),
                job(3),
                None,
                NOW,
            )
            .await
            .expect("create");
    }
    let capped = |free| {
        vec![ToolQuota {
            tool: "gpu".into(),
            free,
            global: Some(3),
        }]
    };
    let first = store
        .job_claim_available("w1", "l1", &capped(2), 10, 60_000, NOW)
        .await
        .expect("claim");
    assert_eq!(first.len(), 2);
    let second = store
        .job_claim_available("w2", "l2", &capped(5), 10, 60_000, NOW)
        .await
        .expect("claim");
    assert_eq!(second.len(), 1, "3 at most across pools");
    store.close().await;
}

#[tokio::test]
async fn write_batch_with_a_refused_write() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    store
        .task_create(&new_task("old", "alice", "echo"), job(3), None, NOW)
        .await
        .expect("create");
    let running = store
        .job_claim_available("w", "lease-old", &quota("echo", 1), 1, 60_000, NOW)
        .await
        .expect("claim")
        .pop()
        .expect("one job");

    let mut bad = new_task("bad", "alice", "echo");
    bad.arguments = "not json".into();
    let writes = vec![
        Write::Create {
            new: new_task("a", "alice", "echo"),
            job: job(3),
            outcome: None,
        },
        Write::Create {
            new: bad,
            job: job(3),
            outcome: None,
        },
        Write::Create {
            new: new_task("b", "alice", "echo"),
            job: job(3),
            outcome: None,
        },
        Write::Complete {
            task_seq: running.task_seq,
            task_id: running.task_id.clone(),
            lease_token: running.lease_token.clone(),
            outcome: done("ok"),
        },
        Write::Complete {
            task_seq: running.task_seq + 1000,
            task_id: "nobody".into(),
            lease_token: "nothing".into(),
            outcome: done("no"),
        },
        Write::Claim {
            worker: "w".into(),
            lease_token: "lease-batch".into(),
            quotas: quota("echo", 1),
            limit: 1,
            lease_ms: 60_000,
        },
    ];
    let results = store.write_batch(&writes, NOW + 5).await.expect("batch");
    assert_eq!(results.len(), writes.len());
    let mut results = results.into_iter();
    // a: claimed in the same batch (the oldest queued job), so not queued.
    let Some(Ok(Written::Created(a))) = results.next() else {
        panic!("a not created")
    };
    assert_eq!(a.task_id, "a");
    assert_eq!(a.status_message, None);
    let refused = results.next().expect("bad");
    let Err(error) = refused else {
        panic!("bad arguments accepted")
    };
    assert!(
        error
            .db_message()
            .expect("a database refusal")
            .contains("tasks_arguments_check"),
        "{error}"
    );
    let Some(Ok(Written::Created(b))) = results.next() else {
        panic!("b not created")
    };
    assert_eq!(b.status_message.as_deref(), Some("queued"));
    assert!(matches!(results.next(), Some(Ok(Written::Completed(true)))));
    assert!(matches!(results.next(), Some(Err(StoreError::LeaseLost))));
    let Some(Ok(Written::Claimed(claimed))) = results.next() else {
        panic!("no claim")
    };
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].task_seq, a.seq);

    assert!(store.task_get("bad").await.expect("get").is_none());
    let old = store.task_get("old").await.expect("get").expect("old");
    assert_eq!(old.status, TaskStatus::Completed);
    let b = store.task_get("b").await.expect("get").expect("b");
    assert_eq!(b.status_message.as_deref(), Some("queued"));

    // Grouped (nothing refused): the same rule.
    let results = store
        .write_batch(
            &[
                Write::Create {
                    new: new_task("c", "alice", "echo"),
                    job: job(3),
                    outcome: None,
                },
                Write::Create {
                    new: new_task("d", "alice", "echo"),
                    job: None,
                    outcome: Some(TaskOutcome {
                        status: TaskStatus::Failed,
                        status_message: Some("invalid arguments".into()),
                        result: r#"{"code":-32602,"message":"no"}"#.into(),
                        result_kind: ResultKind::Error,
                        tool_error: false,
                    }),
                },
            ],
            NOW + 6,
        )
        .await
        .expect("batch");
    let [Ok(Written::Created(c)), Ok(Written::Created(d))] = &results[..] else {
        panic!("{results:?}")
    };
    assert_eq!(c.status_message.as_deref(), Some("queued"));
    assert_eq!(d.status, TaskStatus::Failed);
    assert_eq!(d.status_message.as_deref(), Some("invalid arguments"));
    store.close().await;
}

#[tokio::test]
async fn cancel_queued_and_running() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    let queued = store
        .task_create(&new_task("q", "alice", "echo"), job(3), None, NOW)
        .await
        .expect("create");
    let CancelOutcome::Cancelled(row) = store
        .task_cancel("q", "alice", "cancelled by the client", NOW + 1)
        .await
        .expect("cancel")
    else {
        panic!("not cancelled")
    };
    assert_eq!(row.status, TaskStatus::Cancelled);
    assert_eq!(
        row.status_message.as_deref(),
        Some("cancelled by the client")
    );
    assert_eq!(
        job_state(&db, queued.seq).await,
        ("done".into(), 1, Some("cancelled while queued".into()))
    );
    assert!(!store.job_any_runnable(NOW + 2).await.expect("runnable"));

    store
        .task_create(&new_task("r", "alice", "echo"), job(3), None, NOW)
        .await
        .expect("create");
    let running = store
        .job_claim_available("w", "lease", &quota("echo", 1), 1, 60_000, NOW)
        .await
        .expect("claim")
        .pop()
        .expect("one job");
    assert!(matches!(
        store.task_cancel("r", "mallory", "no", NOW + 1).await,
        Ok(CancelOutcome::NotFound)
    ));
    assert!(matches!(
        store.task_cancel("r", "alice", "stop", NOW + 1).await,
        Ok(CancelOutcome::Cancelled(_))
    ));
    assert_eq!(job_state(&db, running.task_seq).await.0, "running");
    let beat = store
        .job_heartbeat(running.task_seq, "lease", 60_000, NOW + 2)
        .await
        .expect("heartbeat");
    assert!(beat.cancel_requested);
    // The worker's outcome comes too late: the task stays cancelled.
    assert!(
        !store
            .write_batch(
                &[Write::Complete {
                    task_seq: running.task_seq,
                    task_id: running.task_id.clone(),
                    lease_token: "other".into(),
                    outcome: done("late"),
                }],
                NOW + 3
            )
            .await
            .expect("batch")
            .iter()
            .any(|r| r.is_ok())
    );
    store
        .job_finish_cancelled(running.task_seq, "lease", NOW + 3)
        .await
        .expect("finish");
    assert!(matches!(
        store
            .job_finish_cancelled(running.task_seq, "lease", NOW + 3)
            .await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.task_cancel("r", "alice", "again", NOW + 4).await,
        Ok(CancelOutcome::Terminal(TaskStatus::Cancelled))
    ));
    store.close().await;
}

#[tokio::test]
async fn rescue_requeues_then_fails() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    let row = store
        .task_create(&new_task("lost", "alice", "echo"), job(2), None, NOW)
        .await
        .expect("create");
    let first = store
        .job_claim_available("w", "l1", &quota("echo", 1), 1, 100, NOW)
        .await
        .expect("claim");
    assert_eq!(first.len(), 1);
    // Nothing expired yet.
    assert_eq!(
        store
            .job_rescue_expired(1000, NOW + 50)
            .await
            .expect("rescue"),
        RescueReport::default()
    );
    let report = store
        .job_rescue_expired(1000, NOW + 200)
        .await
        .expect("rescue");
    assert_eq!(
        report,
        RescueReport {
            requeued: 1,
            failed: vec![],
            closed: 0
        }
    );
    let task = store.task_get("lost").await.expect("get").expect("task");
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message.as_deref(),
        Some("queued: lease expired on attempt 1")
    );
    assert!(matches!(
        store.job_heartbeat(row.seq, "l1", 100, NOW + 201).await,
        Err(StoreError::LeaseLost)
    ));
    // Backoff: 1000 ms per attempt plus up to 250 ms of jitter.
    assert!(
        store
            .job_claim_available("w", "l2", &quota("echo", 1), 1, 100, NOW + 1199)
            .await
            .expect("claim")
            .is_empty()
    );
    let later = NOW + 200 + 1000 + 250;
    let second = store
        .job_claim_available("w", "l2", &quota("echo", 1), 1, 100, later)
        .await
        .expect("claim");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].attempt, 2);
    let report = store
        .job_rescue_expired(1000, later + 500)
        .await
        .expect("rescue");
    assert_eq!(
        report,
        RescueReport {
            requeued: 0,
            failed: vec!["echo".to_owned()],
            closed: 0
        }
    );
    let task = store.task_get("lost").await.expect("get").expect("task");
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(
        task.status_message.as_deref(),
        Some("worker lost 2 time(s): lease expired with no attempts left")
    );
    assert_eq!(
        task.result.as_deref(),
        Some(r#"{"message":"Task failed: worker lost 2 time(s) (lease expired)"}"#)
    );
    assert_eq!(task.result_kind, Some(ResultKind::Error));
    assert_eq!(
        job_state(&db, row.seq).await,
        (
            "done".into(),
            0,
            Some("lease expired on attempt 2; no attempts left".into())
        )
    );
    store.close().await;
}

#[tokio::test]
async fn release_and_unclaim() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    let row = store
        .task_create(&new_task("r", "alice", "echo"), job(3), None, NOW)
        .await
        .expect("create");
    store
        .job_claim_available("w", "l1", &quota("echo", 1), 1, 60_000, NOW)
        .await
        .expect("claim");
    assert!(
        store
            .job_unclaim(row.seq, "l1", NOW + 1)
            .await
            .expect("unclaim")
    );
    assert!(
        !store
            .job_unclaim(row.seq, "l1", NOW + 1)
            .await
            .expect("unclaim")
    );
    let again = store
        .job_claim_available("w", "l2", &quota("echo", 1), 1, 60_000, NOW + 2)
        .await
        .expect("claim");
    assert_eq!(again[0].attempt, 1, "an unclaim is no attempt");
    assert!(
        store
            .job_release(row.seq, "l2", NOW + 3)
            .await
            .expect("release")
    );
    assert!(matches!(
        store.job_release(row.seq, "l2", NOW + 3).await,
        Err(StoreError::LeaseLost)
    ));
    let (state, _, error) = job_state(&db, row.seq).await;
    assert_eq!(state, "queued");
    assert_eq!(
        error.as_deref(),
        Some("released by a stopping worker (attempt 1 not counted)")
    );
    store.close().await;
}

#[tokio::test]
async fn ask_and_answer() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    store
        .session_create(
            &NewSession {
                session_id: "s1".into(),
                protocol_version: "2025-11-25".into(),
                client_info: "{}".into(),
                client_capabilities: r#"{"elicitation":{}}"#.into(),
                principal: None,
            },
            NOW,
        )
        .await
        .expect("session");
    let mut new = new_task("m", "s1", "ask");
    new.session_id = Some("s1".into());
    let row = store
        .task_create(&new, job(3), None, NOW)
        .await
        .expect("create");
    assert_eq!(
        store
            .task_client_capabilities(row.seq)
            .await
            .expect("caps")
            .as_deref(),
        Some(r#"{"elicitation":{}}"#)
    );
    store
        .job_claim_available("w", "lease", &quota("ask", 1), 1, 60_000, NOW)
        .await
        .expect("claim");
    let message = TaskMessage {
        request_id: "req-1".into(),
        task_id: "m".into(),
        method: "elicitation/create".into(),
        params: r#"{"message":"name?"}"#.into(),
        response: None,
    };
    assert!(matches!(
        store
            .task_message_ask(row.seq, "wrong", &message, NOW + 1)
            .await,
        Err(StoreError::LeaseLost)
    ));
    store
        .task_message_ask(row.seq, "lease", &message, NOW + 1)
        .await
        .expect("ask");
    let task = store.task_get("m").await.expect("get").expect("task");
    assert_eq!(task.status, TaskStatus::InputRequired);
    assert_eq!(
        task.status_message.as_deref(),
        Some("waiting for the client to answer elicitation/create")
    );
    assert_eq!(
        store.task_messages_pending("m").await.expect("pending"),
        vec![message.clone()]
    );
    assert_eq!(
        store
            .task_message_answer("req-1", "someone else", "{}", NOW + 2)
            .await
            .expect("answer"),
        AnswerOutcome::Unknown
    );
    assert_eq!(
        store
            .task_message_answer("req-1", "s1", r#"{"result":{"action":"accept"}}"#, NOW + 2)
            .await
            .expect("answer"),
        AnswerOutcome::Stored
    );
    assert_eq!(
        store
            .task_message_answer("req-1", "s1", "{}", NOW + 3)
            .await
            .expect("answer"),
        AnswerOutcome::Unknown
    );
    let task = store.task_get("m").await.expect("get").expect("task");
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(
        task.status_message.as_deref(),
        Some("the client answered; working")
    );
    let answered = store
        .task_message_get("req-1")
        .await
        .expect("get")
        .expect("message");
    assert_eq!(
        answered.response.as_deref(),
        Some(r#"{"result":{"action":"accept"}}"#)
    );
    assert!(
        store
            .task_messages_pending("m")
            .await
            .expect("pending")
            .is_empty()
    );
    store.close().await;
}

#[tokio::test]
async fn sessions() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    let new = |id: &str| NewSession {
        session_id: id.into(),
        protocol_version: "2025-11-25".into(),
        client_info: r#"{"name":"test"}"#.into(),
        client_capabilities: "{}".into(),
        principal: Some("alice".into()),
    };
    store.session_create(&new("s1"), NOW).await.expect("create");
    store.session_create(&new("s2"), NOW).await.expect("create");
    let s1 = store.session_get("s1").await.expect("get").expect("s1");
    assert_eq!(s1.principal.as_deref(), Some("alice"));
    assert_eq!(s1.last_seen_at, NOW);
    store.session_touch("s1", NOW + 5000).await.expect("touch");
    store.session_touch("s1", NOW + 10).await.expect("touch");
    assert_eq!(
        store
            .session_get("s1")
            .await
            .expect("get")
            .expect("s1")
            .last_seen_at,
        NOW + 5000
    );
    assert_eq!(
        store
            .session_count_live(1000, NOW + 5500)
            .await
            .expect("live"),
        1
    );
    // s2 owns a task: live however idle.
    let mut task = new_task("t", "alice", "echo");
    task.session_id = Some("s2".into());
    store
        .task_create(&task, None, None, NOW)
        .await
        .expect("task");
    assert!(
        store
            .session_owns_open_tasks("s2", NOW + 1)
            .await
            .expect("owns")
    );
    assert!(
        !store
            .session_owns_open_tasks("s1", NOW + 1)
            .await
            .expect("owns")
    );
    assert_eq!(
        store
            .session_count_live(1000, NOW + 5500)
            .await
            .expect("live"),
        2
    );
    assert_eq!(
        store
            .session_expire_idle(1000, NOW + 10_000, 100)
            .await
            .expect("expire"),
        (1, 1)
    );
    assert!(store.session_get("s1").await.expect("get").is_none());
    assert!(!store.session_end("s1", NOW).await.expect("end"));
    assert!(store.session_end("s2", NOW + 1).await.expect("end"));
    assert!(!store.session_end("s2", NOW + 2).await.expect("end"));
    assert_eq!(
        store
            .session_get("s2")
            .await
            .expect("get")
            .expect("s2")
            .ended_at,
        Some(NOW + 1)
    );
    store.close().await;
}

#[tokio::test]
async fn tokens() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    assert!(!store.tokens_exist().await.expect("exist"));
    store
        .token_create(
            &NewToken {
                token_id: "id1".into(),
                principal: "alice".into(),
                secret_hash: vec![7u8; 32],
                expires_at: None,
                operator: false,
            },
            NOW,
        )
        .await
        .expect("create");
    store
        .token_create(
            &NewToken {
                token_id: "id2".into(),
                principal: "bob".into(),
                secret_hash: vec![8u8; 32],
                expires_at: Some(NOW + 10),
                operator: true,
            },
            NOW + 1,
        )
        .await
        .expect("create");
    assert!(
        store
            .token_create(
                &NewToken {
                    token_id: "id3".into(),
                    principal: "carol".into(),
                    secret_hash: vec![1u8; 3],
                    expires_at: None,
                    operator: false,
                },
                NOW,
            )
            .await
            .is_err(),
        "a hash must be 32 bytes"
    );
    assert!(store.tokens_exist().await.expect("exist"));
    let t = store.token_get("id1").await.expect("get").expect("id1");
    assert_eq!(t.secret_hash, vec![7u8; 32]);
    assert_eq!(t.principal, "alice");
    assert!(!t.operator);
    assert!(
        store
            .token_get("id2")
            .await
            .expect("get")
            .expect("id2")
            .operator
    );
    let list: Vec<String> = store
        .token_list()
        .await
        .expect("list")
        .into_iter()
        .map(|t| t.token_id)
        .collect();
    assert_eq!(list, ["id2", "id1"]);
    store.token_touch("id1", NOW + 5).await.expect("touch");
    assert!(store.token_revoke("id1", NOW + 6).await.expect("revoke"));
    assert!(!store.token_revoke("id1", NOW + 7).await.expect("revoke"));
    assert!(!store.token_revoke("nope", NOW + 7).await.expect("revoke"));
    let t = store.token_get("id1").await.expect("get").expect("id1");
    assert_eq!(
        (t.last_used_at, t.revoked_at),
        (Some(NOW + 5), Some(NOW + 6))
    );
    store.close().await;
}

#[tokio::test]
async fn workers() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    let w = NewWorker {
        worker_id: "host:1:abc".into(),
        pid: 1,
        host: "host".into(),
        kind: WorkerKind::Process,
        concurrency: 4,
        lease_ms: 1000,
    };
    store.worker_register(&w, NOW).await.expect("register");
    store
        .worker_heartbeat(&w.worker_id, 3, NOW + 500)
        .await
        .expect("beat");
    assert_eq!(store.worker_mark_dead(NOW + 2000).await.expect("dead"), 0);
    assert_eq!(store.worker_mark_dead(NOW + 3000).await.expect("dead"), 1);
    store
        .worker_heartbeat(&w.worker_id, 2, NOW + 3100)
        .await
        .expect("beat");
    store
        .worker_set_state(&w.worker_id, WorkerState::Stopping, NOW + 3200)
        .await
        .expect("stopping");
    let read = || async {
        let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
        let row: (String, i64, Option<i64>) = sqlx::query_as(
            "SELECT state, jobs_running, stopped_at FROM workers WHERE worker_id = 'host:1:abc'",
        )
        .fetch_one(&mut conn)
        .await
        .expect("the worker");
        row
    };
    assert_eq!(read().await, ("stopping".into(), 2, None));
    store
        .worker_set_state(&w.worker_id, WorkerState::Stopped, NOW + 3300)
        .await
        .expect("stopped");
    assert_eq!(read().await, ("stopped".into(), 0, Some(NOW + 3300)));
    store.close().await;
}

#[tokio::test]
async fn list_pages_and_purge() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    for i in 0..5 {
        store
            .task_create(
                &new_task(&format!("p{i}"), "alice", "echo"),
                None,
                None,
                NOW + i,
            )
            .await
            .expect("create");
    }
    store
        .task_create(&new_task("other", "bob", "echo"), None, None, NOW)
        .await
        .expect("create");
    let mut ids = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .task_list_page("alice", before, 2, NOW + 10)
            .await
            .expect("page");
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        before = page.last().map(|t| t.seq);
        ids.extend(page.into_iter().map(|t| t.task_id));
    }
    assert_eq!(ids, ["p4", "p3", "p2", "p1", "p0"]);
    // Past their ttl: hidden, then purged.
    assert!(
        store
            .task_list_page("alice", None, 10, NOW + 3_600_003)
            .await
            .expect("page")
            .iter()
            .map(|t| t.task_id.as_str())
            .eq(["p4"])
    );
    assert_eq!(
        store
            .task_purge_expired(NOW + 3_600_003, 100)
            .await
            .expect("purge"),
        5
    );
    assert!(store.task_get("p0").await.expect("get").is_none());
    assert_eq!(store.task_count_open("alice").await.expect("count"), 1);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_feed_hears_another_handle() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let here = db.open().await;
    let there = PostgresStore::open_existing(&db.url, Durability::Full)
        .await
        .expect("open_existing on a migrated database");
    here.task_create(&new_task("before", "alice", "echo"), None, None, NOW)
        .await
        .expect("create");
    let shutdown = CancellationToken::new();
    let mut feed = here.change_feed(shutdown.clone()).await.expect("feed");
    let remote = feed.remote();
    let v0 = feed.version().await.expect("version");
    // At the head: what came before is not replayed.
    assert!(feed.next_events(100).await.expect("events").is_empty());

    let row = there
        .task_create(&new_task("after", "alice", "echo"), job(3), None, NOW + 1)
        .await
        .expect("create");
    tokio::time::timeout(Duration::from_secs(5), remote.notified())
        .await
        .expect("remote() woke");
    assert_ne!(feed.version().await.expect("version"), v0);
    let events = feed.next_events(100).await.expect("events");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].task_id, "after");
    assert_eq!(events[0].from_status, None);
    assert_eq!(events[0].to_status, TaskStatus::Working);
    assert_eq!(events[0].owner, "alice");
    assert!(feed.next_events(100).await.expect("events").is_empty());

    // Progress, from the other handle too.
    let claimed = there
        .job_claim_available("w", "lease", &quota("echo", 1), 1, 60_000, NOW + 2)
        .await
        .expect("claim");
    assert_eq!(claimed[0].task_seq, row.seq);
    there
        .task_record_progress(row.seq, "lease", 0.5, None, "half", NOW + 3)
        .await
        .expect("progress");
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let progress = feed.next_progress(100).await.expect("progress");
            if let Some(p) = progress.first() {
                assert_eq!((p.task_id.as_str(), p.progress), ("after", 0.5));
                return;
            }
            remote.notified().await;
        }
    })
    .await
    .expect("progress heard");
    assert_eq!(
        here.task_events_for_owner_since("alice", 0, 10)
            .await
            .expect("replay")
            .len(),
        2
    );
    shutdown.cancel();
    here.close().await;
    there.close().await;
}

/// Many writers at once: the feed still sees every event (ids become
/// visible in id order).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn feed_misses_nothing_under_concurrent_writers() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = Arc::new(db.open().await);
    let shutdown = CancellationToken::new();
    let mut feed = store.change_feed(shutdown.clone()).await.expect("feed");
    let writers: Vec<_> = (0..6)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..25 {
                    store
                        .task_create(
                            &new_task(&format!("w{w}-{i}"), "alice", "echo"),
                            job(3),
                            None,
                            NOW,
                        )
                        .await
                        .expect("create");
                }
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut last = 0;
    let all_written = async {
        for w in writers {
            w.await.expect("writer");
        }
    };
    tokio::pin!(all_written);
    let mut finished = false;
    loop {
        for e in feed.next_events(7).await.expect("events") {
            assert!(e.id > last, "feed out of order");
            last = e.id;
            assert!(seen.insert(e.task_id), "an event twice");
        }
        if finished && seen.len() == 150 {
            break;
        }
        if finished {
            // Everything committed: one more read must find the rest.
            let rest = feed.next_events(1000).await.expect("events");
            for e in &rest {
                seen.insert(e.task_id.clone());
            }
            assert_eq!(seen.len(), 150, "the feed skipped events");
            break;
        }
        tokio::select! {
            _ = &mut all_written => finished = true,
            _ = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
    }
    shutdown.cancel();
    store.close().await;
}

#[tokio::test]
async fn open_existing_refuses_an_unmigrated_database() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let error = PostgresStore::open_existing(&db.url, Durability::Full)
        .await
        .expect_err("no schema");
    let text = error.to_string();
    assert!(matches!(error, StoreError::NotMigrated(_)), "{text}");
    assert!(text.contains("it has no taskbroker schema yet"), "{text}");
    assert!(
        text.contains(&format!("taskbroker migrate --db {}", db.url)),
        "{text}"
    );
    assert_eq!(
        PostgresStore::migrate(&db.url).await.expect("migrate"),
        migration_files()
    );
    assert_eq!(PostgresStore::migrate(&db.url).await.expect("migrate"), 0);
    let store = PostgresStore::open_existing(&db.url, Durability::Full)
        .await
        .expect("now it opens");
    store.close().await;
}

#[tokio::test]
async fn concurrent_migrations_apply_once() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let (a, b) = tokio::join!(
        PostgresStore::migrate(&db.url),
        PostgresStore::migrate(&db.url)
    );
    let mut applied = [a.expect("migrate"), b.expect("migrate")];
    applied.sort_unstable();
    assert_eq!(applied, [0, migration_files()]);
}

/// How many migrations a fresh database gets: the files of
/// migrations/postgres.
fn migration_files() -> usize {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations/postgres");
    std::fs::read_dir(dir)
        .expect("migrations/postgres")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".sql"))
        })
        .count()
}

#[tokio::test]
async fn schema_and_driver_share_the_feed_lock_key() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let store = db.open().await;
    store.close().await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let source: String =
        sqlx::query_scalar("SELECT prosrc FROM pg_proc WHERE proname = 'taskbroker_feed_order'")
            .fetch_one(&mut conn)
            .await
            .expect("the trigger function");
    assert!(
        source.contains(&format!("pg_advisory_xact_lock({FEED_LOCK_KEY})")),
        "{source}"
    );
    conn.close().await.ok();
}

#[tokio::test]
async fn connection_errors_say_what_is_wrong() {
    // A server must answer for "no such database" to be its answer.
    let Some(_db) = TestDb::create().await else {
        return;
    };
    let mut missing = server_url();
    missing.set_path("/tbk_no_such_database");
    missing.set_password(Some("hunter2")).expect("a password");
    let error = PostgresStore::open(missing.as_str(), Durability::Full)
        .await
        .expect_err("no such database");
    let text = error.to_string();
    assert!(matches!(error, StoreError::Open { .. }), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    assert!(text.contains("createdb"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");

    let mut closed = server_url();
    closed.set_port(Some(1)).expect("a port");
    let error = PostgresStore::open(closed.as_str(), Durability::Full)
        .await
        .expect_err("nobody listens");
    assert!(error.to_string().contains("server unreachable"), "{error}");

    let error = PostgresStore::open("postgres://[::1", Durability::Full)
        .await
        .expect_err("not a URL");
    assert!(matches!(error, StoreError::Open { .. }), "{error}");
}
