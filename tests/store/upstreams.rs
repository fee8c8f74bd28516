//! Upstream MCP servers (`UpstreamStore`): each link's state, restarts and
//! last tool list, kept across processes and restarts.

use super::*;
use taskbroker::store::UpstreamRow;

/// Issue 25 items 1 and 7: a state is recorded (the first write makes the
/// row), restarts add up, the last error stays until another replaces it,
/// and the tool list kept survives state changes; rows come by name.
async fn upstream_state_restarts_and_tools_are_kept(db: TestDb) {
    assert!(db.store.upstreams_list().await.unwrap().is_empty());
    assert_eq!(db.store.upstream_tools_saved("b").await.unwrap(), None);

    db.store
        .upstream_set_state("b", "starting", None, false, T0)
        .await
        .unwrap();
    assert_eq!(
        db.store.upstream_tools_saved("b").await.unwrap(),
        None,
        "no list before one was kept"
    );
    db.store
        .upstream_save_tools("b", r#"[{"name":"x"}]"#, r#"["p_x"]"#, T0 + 1)
        .await
        .unwrap();
    db.store
        .upstream_set_state("b", "ready", None, false, T0 + 2)
        .await
        .unwrap();
    db.store
        .upstream_set_state(
            "b",
            "down",
            Some("the process exited (exit status: 1)"),
            false,
            T0 + 3,
        )
        .await
        .unwrap();
    db.store
        .upstream_set_state("b", "starting", None, true, T0 + 4)
        .await
        .unwrap();
    db.store
        .upstream_set_state("b", "ready", None, false, T0 + 5)
        .await
        .unwrap();
    // A list kept first makes a ready row.
    db.store
        .upstream_save_tools("a", "[]", "[]", T0 + 6)
        .await
        .unwrap();

    let rows = db.store.upstreams_list().await.unwrap();
    assert_eq!(
        rows,
        vec![
            UpstreamRow {
                name: "a".into(),
                state: "ready".into(),
                last_error: None,
                state_at: T0 + 6,
                restarts: 0,
                tools: Some("[]".into()),
                served: Some("[]".into()),
                listed_at: Some(T0 + 6),
            },
            UpstreamRow {
                name: "b".into(),
                state: "ready".into(),
                last_error: Some("the process exited (exit status: 1)".into()),
                state_at: T0 + 5,
                restarts: 1,
                tools: Some(r#"[{"name":"x"}]"#.into()),
                served: Some(r#"["p_x"]"#.into()),
                listed_at: Some(T0 + 1),
            },
        ]
    );
    assert_eq!(
        db.store.upstream_tools_saved("b").await.unwrap(),
        Some((r#"[{"name":"x"}]"#.to_owned(), T0 + 1))
    );
}
store_test!(upstream_state_restarts_and_tools_are_kept);

/// Issue 25 "colliding names": the names served change alone (another
/// upstream took or gave back one); the kept list and when it was listed
/// stay; an upstream with no row yet gets none.
async fn upstream_served_names_change_alone(db: TestDb) {
    db.store
        .upstream_save_tools("b", r#"[{"name":"x"},{"name":"y"}]"#, r#"["x","y"]"#, T0)
        .await
        .unwrap();
    db.store.upstream_set_served("b", r#"["y"]"#).await.unwrap();
    db.store.upstream_set_served("nobody", "[]").await.unwrap();
    let rows = db.store.upstreams_list().await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].served.as_deref(), Some(r#"["y"]"#));
    assert_eq!(
        rows[0].tools.as_deref(),
        Some(r#"[{"name":"x"},{"name":"y"}]"#)
    );
    assert_eq!(rows[0].listed_at, Some(T0));
}
store_test!(upstream_served_names_change_alone);

/// The database refuses what the store never writes: an unknown state and
/// a tool list that is not JSON.
async fn upstream_rows_hold_only_known_states_and_json(db: TestDb) {
    assert!(matches!(
        db.store
            .upstream_set_state("a", "sleeping", None, false, T0)
            .await,
        Err(StoreError::Db(_))
    ));
    assert!(matches!(
        db.store
            .upstream_save_tools("a", "[not json", "[]", T0)
            .await,
        Err(StoreError::Db(_))
    ));
    assert!(db.store.upstreams_list().await.unwrap().is_empty());
}
store_test!(upstream_rows_hold_only_known_states_and_json);
