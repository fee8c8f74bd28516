//! Worker pools (`WorkerStore`): registered, heartbeats, states, marked
//! dead.

use super::*;

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
