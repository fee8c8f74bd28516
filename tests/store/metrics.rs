//! The metrics reads (`MetricsStore`) on an empty database, then on the
//! operator tests' known state ([`ops_world`]).

use super::ops::{ago, ops_world};
use super::*;

/// The `MetricsStore` reads on an empty database, then on
/// [`ops_world`]: the database answers a ping; the schema applied is the
/// one this build knows (one version per migration file); the size is
/// positive and does not shrink as rows arrive; queued jobs by tool with
/// the creation time of the oldest one's task (not when it became
/// runnable again); pools by state (a stopped one not counted).
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
    assert!(
        db.store
            .metrics_queue_by_tool(crate::ops::OPS_NOW)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        db.store.metrics_worker_counts().await.unwrap(),
        WorkerCounts::default()
    );

    ops_world(&db.store).await;
    db.store.metrics_ping().await.unwrap();
    let size = db.store.metrics_database_size().await.unwrap();
    assert!(size >= empty_size, "{size} < {empty_size}");
    let mut queues = db
        .store
        .metrics_queue_by_tool(crate::ops::OPS_NOW)
        .await
        .unwrap();
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
    // A job queued to start later counts in the depth, not in the age:
    // waiting for its start is no backlog (issue 27 item 2).
    let now = crate::ops::OPS_NOW;
    let mut later = new_task("later", "alice");
    later.tool = "delayed".into();
    let start = NewJob {
        run_after: Some(now + HOUR_MS),
        ..JOB
    };
    db.store
        .task_create(&later, Some(start), None, ago(HOUR_MS))
        .await
        .unwrap();
    let queues = db.store.metrics_queue_by_tool(now).await.unwrap();
    let delayed = queues.iter().find(|q| q.tool == "delayed").unwrap();
    assert_eq!((delayed.depth, delayed.oldest_created_at), (1, now));
    assert_eq!(
        db.store.metrics_worker_counts().await.unwrap(),
        WorkerCounts {
            live: 2,
            stopping: 1,
            dead: 1,
        }
    );
}
store_test!(metrics_reads_match_the_rows);
