//! The MCP sessions (`SessionStore`): made, read, touched, ended, and
//! swept once idle.

use super::*;

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
