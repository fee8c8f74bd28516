//! About the PostgreSQL driver as such, so on PostgreSQL alone (skipped,
//! as the other PostgreSQL cases are, where no server answers): what the
//! schema and the driver must agree on, and what a database that cannot
//! be opened says.

use super::*;

/// The schema's feed trigger takes the same advisory lock as the driver's
/// writes, so that feed ids become visible in id order.
#[tokio::test]
async fn schema_and_driver_share_the_feed_lock_key() {
    run(Driver::Postgres, |db: TestDb| async move {
        let raw = db.raw().await;
        let source: String = raw
            .scalar(
                "SELECT prosrc FROM pg_proc WHERE proname = 'taskbroker_feed_order'",
                args![],
            )
            .await
            .expect("the trigger function");
        assert!(
            source.contains(&format!(
                "pg_advisory_xact_lock({})",
                taskbroker_postgres::FEED_LOCK_KEY
            )),
            "{source}"
        );
        raw.close().await;
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
