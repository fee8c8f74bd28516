//! `store::open`, `store::open_existing` and `store::migrate`: a new
//! database is made and migrated once, an existing one opened as it is.

use super::*;

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

/// Two `migrate` runs at once on a new database (two operators, or an
/// operator and a starting broker): one applies every migration, the
/// other finds nothing left to do.
async fn concurrent_migrations_apply_once(fresh: FreshDb) {
    let (a, b) = tokio::join!(
        store::migrate(&fresh.location),
        store::migrate(&fresh.location)
    );
    let mut applied = [a.expect("first migrate"), b.expect("second migrate")];
    applied.sort_unstable();
    assert_eq!(applied, [0, migration_files(fresh.driver)]);
}
store_test!(concurrent_migrations_apply_once);

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
