//! refinery migrations (files in `migrations/postgres/`) run over a sqlx
//! connection, so the build has one PostgreSQL client. Processes starting
//! at once take turns: the runner holds a session advisory lock
//! ([`MIGRATE_LOCK_KEY`]) for the whole run, so the second one finds the
//! migrations applied.

use refinery::Migration;
use refinery_core::traits::r#async::{AsyncMigrate, AsyncQuery, AsyncTransaction};

use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::{MIGRATE_LOCK_KEY, StoreError, open_failed, without_password};

refinery::embed_migrations!("../../migrations/postgres");

/// One sqlx connection that refinery drives through its async traits.
struct SqlxMigrationConn(PgConnection);

impl AsyncTransaction for SqlxMigrationConn {
    type Error = sqlx::Error;

    async fn execute<'a, T: Iterator<Item = &'a str> + Send + 'a>(
        &'a mut self,
        queries: T,
    ) -> Result<usize, Self::Error> {
        // Each migration and its history row commit together (PostgreSQL
        // DDL is transactional).
        let mut tx = self.0.begin().await?;
        let mut count = 0;
        for query in queries {
            // Migration text comes from files compiled into the binary.
            sqlx::raw_sql(AssertSqlSafe(query.to_owned()))
                .execute(&mut *tx)
                .await?;
            count += 1;
        }
        tx.commit().await?;
        Ok(count)
    }
}

impl AsyncQuery<Vec<Migration>> for SqlxMigrationConn {
    async fn query<'a>(&'a mut self, query: &'a str) -> Result<Vec<Migration>, Self::Error> {
        let rows = sqlx::query(AssertSqlSafe(query.to_owned()))
            .fetch_all(&mut self.0)
            .await?;
        let mut applied = Vec::with_capacity(rows.len());
        for row in rows {
            // refinery's history table: version INT4, the rest VARCHAR.
            let version: i32 = row.try_get(0)?;
            let name: String = row.try_get(1)?;
            let applied_on: String = row.try_get(2)?;
            let checksum: String = row.try_get(3)?;
            let decode = |e: String| sqlx::Error::Decode(e.into());
            let applied_on = OffsetDateTime::parse(&applied_on, &Rfc3339)
                .map_err(|e| decode(format!("migration {version} applied_on: {e}")))?;
            let checksum = checksum
                .parse::<u64>()
                .map_err(|e| decode(format!("migration {version} checksum: {e}")))?;
            applied.push(Migration::applied(version, name, applied_on, checksum));
        }
        Ok(applied)
    }
}

impl AsyncMigrate for SqlxMigrationConn {}

/// The newest schema version this build knows.
pub(super) fn known_version() -> i64 {
    migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| i64::from(m.version()))
        .max()
        .unwrap_or(0)
}

/// Refuse a database whose schema is not exactly the one this build knows
/// (`taskbroker_storage::schema::check_version`).
pub(super) async fn check(url: &str, conn: &mut PgConnection) -> Result<(), StoreError> {
    let known = known_version();
    let has_history = sqlx::query_scalar!(
        r#"SELECT to_regclass('refinery_schema_history') IS NOT NULL AS "found!""#
    )
    .fetch_one(&mut *conn)
    .await?;
    let applied: Option<i32> = if has_history {
        // refinery makes this table at run time: no query! macro.
        sqlx::query_scalar("SELECT MAX(version) FROM refinery_schema_history")
            .fetch_one(&mut *conn)
            .await?
    } else {
        None
    };
    let db = without_password(url);
    taskbroker_storage::schema::check_version(&db, applied.map(i64::from), known)
}

/// Apply every pending migration; returns how many were applied.
pub(super) async fn run(url: &str, options: &PgConnectOptions) -> Result<usize, StoreError> {
    let conn = PgConnection::connect_with(options)
        .await
        .map_err(|e| open_failed(url, options, &e))?;
    let mut conn = SqlxMigrationConn(conn);
    // Held until unlocked or the connection ends, whatever happens below.
    sqlx::query!("SELECT pg_advisory_lock($1)", MIGRATE_LOCK_KEY)
        .execute(&mut conn.0)
        .await?;
    let outcome = migrations::runner().run_async(&mut conn).await;
    // Closing the connection releases the lock too: a failed unlock (or
    // close) is no reason to hide the migration's outcome.
    if let Err(e) = sqlx::query_scalar!(
        r#"SELECT pg_advisory_unlock($1) AS "released!""#,
        MIGRATE_LOCK_KEY
    )
    .fetch_one(&mut conn.0)
    .await
    {
        tracing::debug!(error = %e, "migration lock: unlock failed; the connection's end releases it");
    }
    if let Err(e) = conn.0.close().await {
        tracing::debug!(error = %e, "migration connection: close failed");
    }
    let report = outcome.map_err(|e| StoreError::Migrate(e.to_string()))?;
    let applied = report.applied_migrations();
    if let (Some(first), Some(last)) = (applied.first(), applied.last()) {
        tracing::info!(db = %without_password(url), applied = applied.len(),
                       from = first.version() - 1, to = last.version(),
                       "database schema migrated");
    }
    Ok(applied.len())
}
