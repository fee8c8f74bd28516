//! About the PostgreSQL driver as such, so on PostgreSQL alone (skipped,
//! as the other PostgreSQL cases are, where no server answers): what the
//! schema and the driver must agree on, and what a database that cannot
//! be opened says.

use sqlx::{Connection, PgConnection};

use super::*;

/// Issue 26: a transaction's status history, and with it its feed ids, is
/// written as it commits (migration V14), under the feed lock the schema
/// takes with the driver's key. A transaction that changed a task's status
/// holds no advisory lock before its COMMIT, so another process's
/// transaction on another task commits meanwhile (with a global lock held
/// from the first change it would wait, then fail on its lock timeout),
/// and the feed's ids follow the order of the commits, not of the changes.
#[tokio::test]
async fn issue26_feed_ids_are_drawn_at_commit() {
    run(Driver::Postgres, |db: TestDb| async move {
        for task_id in ["first", "second"] {
            db.store
                .task_create(&new_task(task_id, "alice"), None, None, T0)
                .await
                .unwrap();
        }
        let url = db.location().to_string_lossy().into_owned();
        let mut a = PgConnection::connect(&url).await.expect("connect");
        let mut b = PgConnection::connect(&url).await.expect("connect");
        // A bound on a wait that must not happen, so that a regression
        // fails rather than hangs.
        sqlx::query("SET lock_timeout = '30s'")
            .execute(&mut b)
            .await
            .unwrap();
        let mut first = a.begin().await.unwrap();
        sqlx::query(
            "UPDATE tasks SET status = 'input_required', updated_at = $1 WHERE task_id = 'first'",
        )
        .bind(T0 + 1)
        .execute(&mut *first)
        .await
        .unwrap();
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        )
        .fetch_one(&mut *first)
        .await
        .unwrap();
        assert_eq!(held, 0, "an advisory lock is held before COMMIT");
        let mut second = b.begin().await.unwrap();
        sqlx::query(
            "UPDATE tasks SET status = 'cancelled', updated_at = $1 WHERE task_id = 'second'",
        )
        .bind(T0 + 2)
        .execute(&mut *second)
        .await
        .unwrap();
        second
            .commit()
            .await
            .expect("commits while the first transaction is open");
        first.commit().await.unwrap();

        let raw = db.raw().await;
        let feed: Vec<(String, String)> = raw
            .rows(
                "SELECT task_id, to_status FROM task_events ORDER BY id",
                args![],
            )
            .await
            .unwrap();
        let feed: Vec<(&str, &str)> = feed.iter().map(|(t, s)| (&**t, &**s)).collect();
        assert_eq!(
            feed,
            [
                ("first", "working"),
                ("second", "working"),
                ("second", "cancelled"),
                ("first", "input_required"),
            ]
        );
        // Status history takes the lock in the functions that write it
        // (migration V18), progress in its statement trigger.
        for function in [
            "tasks_history_insert",
            "tasks_history_update",
            "taskbroker_feed_order",
        ] {
            let source: String = raw
                .scalar(
                    "SELECT prosrc FROM pg_proc WHERE proname = $1",
                    args![function],
                )
                .await
                .expect("the trigger function");
            let lock = source
                .find(&format!(
                    "pg_advisory_xact_lock({})",
                    taskbroker_postgres::FEED_LOCK_KEY
                ))
                .unwrap_or_else(|| panic!("{function} takes no feed lock: {source}"));
            // Before the feed id is drawn.
            if let Some(insert) = source.find("INSERT INTO task_events") {
                assert!(
                    lock < insert,
                    "{function}: the lock after the insert: {source}"
                );
            }
        }
        raw.close().await;
        a.close().await.unwrap();
        b.close().await.unwrap();
    })
    .await;
}

/// Issue 26: a commit that queues jobs names as many live worker
/// processes as it takes to run them (migration V19), not one per job:
/// those with room first (their concurrency less the jobs they reported
/// running), until their room covers the jobs; one reported full only when
/// the others' room does not cover them; at most 8. Heard on a real
/// LISTEN connection, as the workers hear it.
#[tokio::test]
async fn issue26_a_queued_job_names_workers_by_their_room() {
    run(Driver::Postgres, |db: TestDb| async move {
        let now = wall_clock_ms();
        // w-roomy: room 6; w-small: room 2; w-full: reported full.
        for (id, concurrency, running) in [("w-roomy", 8, 2), ("w-small", 4, 2), ("w-full", 4, 4)] {
            db.store
                .worker_register(&process_worker(id, concurrency), now)
                .await
                .unwrap();
            db.store.worker_heartbeat(id, running, now).await.unwrap();
        }
        let url = db.location().to_string_lossy().into_owned();
        let mut listener = sqlx::postgres::PgListener::connect(&url).await.unwrap();
        listener.listen("taskbroker_queued").await.unwrap();
        let mut raw = PgConnection::connect(&url).await.expect("connect");
        // The tool of each job queued.
        let mut named_for_each = async |tools: &[&str]| -> Vec<String> {
            sqlx::query("SELECT taskbroker_announce_queued($1, $2)")
                .bind(tools)
                .bind(now)
                .execute(&mut raw)
                .await
                .unwrap();
            let heard = tokio::time::timeout(Duration::from_secs(10), listener.recv())
                .await
                .expect("a notification")
                .unwrap();
            let mut ids: Vec<String> = heard
                .payload()
                .strip_prefix("claim:")
                .unwrap_or_else(|| panic!("names claimers: {:?}", heard.payload()))
                .split(' ')
                .map(str::to_owned)
                .collect();
            ids.sort();
            ids
        };
        let mut named_for = async |tool: &str, jobs: usize| named_for_each(&vec![tool; jobs]).await;
        let mut named = async |jobs: usize| named_for("echo", jobs).await;
        // Whatever the random order, jobs that fit in one worker's room
        // name one worker with room, never the full one.
        for _ in 0..20 {
            let one = named(2).await;
            assert_eq!(one.len(), 1, "{one:?}");
            assert!(one[0] != "w-full", "{one:?}");
        }
        // 8 jobs: both with room (6 + 2), and no more.
        assert_eq!(named(8).await, ["w-roomy", "w-small"]);
        // More than all the room: the full one too.
        assert_eq!(named(9).await, ["w-full", "w-roomy", "w-small"]);
        // A stopped worker is named no more.
        db.store
            .worker_set_state("w-roomy", WorkerState::Stopped, now + 1)
            .await
            .unwrap();
        assert_eq!(named(3).await, ["w-full", "w-small"]);
        // Named only for the tools each serves (as it reported; one that
        // did not say is named for any).
        db.store
            .worker_serves("w-small", &["report".to_owned()])
            .await
            .unwrap();
        assert_eq!(named_for("echo", 3).await, ["w-full"]);
        db.store
            .worker_serves("w-full", &["echo".to_owned()])
            .await
            .unwrap();
        assert_eq!(named_for("report", 1).await, ["w-small"]);
        assert_eq!(named_for("echo", 1).await, ["w-full"]);
        // Past the cap of 8, each tool keeps one named: 10 workers of
        // room 1 serve a, one of them, reported full, b too; 10 jobs of a
        // and 1 of b name 8, among them the one serving b (for a it comes
        // last).
        for i in 0..10 {
            let id = format!("w-a{i}");
            db.store
                .worker_register(&process_worker(&id, 1), now)
                .await
                .unwrap();
            let tools = if i == 9 { vec!["a", "b"] } else { vec!["a"] };
            let tools: Vec<String> = tools.into_iter().map(str::to_owned).collect();
            db.store.worker_serves(&id, &tools).await.unwrap();
        }
        // The one serving b reported itself full: last in turn for a.
        db.store.worker_heartbeat("w-a9", 1, now).await.unwrap();
        for _ in 0..10 {
            let named = named_for_each(&[&["a"; 10][..], &["b"]].concat()).await;
            assert_eq!(named.len(), 8, "{named:?}");
            assert!(named.iter().any(|id| id == "w-a9"), "{named:?}");
        }
        raw.close().await.unwrap();
    })
    .await;
}

/// A database that does not exist, a server that does not listen, a URL
/// that is not one: each refused with an error that says which, and never
/// with the password it was given.
#[tokio::test]
async fn connection_errors_say_what_is_wrong() {
    // A server must answer for "no such database" to be its answer.
    run(Driver::Postgres, |_fresh: FreshDb| async move {
        let server = url::Url::parse(&common::pg::server_url()).expect("a server URL");
        let mut missing = server.clone();
        missing.set_path("/tbk_no_such_database");
        missing.set_password(Some("hunter2")).expect("a password");
        let error = store::open(Path::new(missing.as_str()), Durability::Full)
            .await
            .expect_err("no such database");
        let text = error.to_string();
        assert!(matches!(error, StoreError::Open { .. }), "{text}");
        assert!(text.contains("does not exist"), "{text}");
        assert!(text.contains("createdb"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");

        let mut closed = server;
        closed.set_port(Some(1)).expect("a port");
        let error = store::open(Path::new(closed.as_str()), Durability::Full)
            .await
            .expect_err("nobody listens");
        assert!(error.to_string().contains("server unreachable"), "{error}");

        let error = store::open(Path::new("postgres://[::1"), Durability::Full)
            .await
            .expect_err("not a URL");
        assert!(matches!(error, StoreError::Open { .. }), "{error}");
    })
    .await;
}
