//! Access tokens (`TokenStore`): made, read, listed, touched, revoked.

use super::*;

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
