//! refinery migrations (files in `migrations/`) run over a sqlx connection,
//! so the build has one SQLite driver.

use refinery::Migration;
use refinery_core::traits::r#async::{AsyncMigrate, AsyncQuery, AsyncTransaction};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, Connection, Row, SqliteConnection};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{BEGIN_IMMEDIATE, StoreError};

refinery::embed_migrations!("migrations");

/// One sqlx connection that refinery drives through its async traits.
struct SqlxMigrationConn(SqliteConnection);

impl AsyncTransaction for SqlxMigrationConn {
    type Error = sqlx::Error;

    async fn execute<'a, T: Iterator<Item = &'a str> + Send + 'a>(
        &'a mut self,
        queries: T,
    ) -> Result<usize, Self::Error> {
        // Each migration and its history row commit together.
        let mut tx = self.0.begin_with(BEGIN_IMMEDIATE).await?;
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
            let version: i64 = row.try_get(0)?;
            let name: String = row.try_get(1)?;
            let applied_on: String = row.try_get(2)?;
            let checksum: String = row.try_get(3)?;
            let decode = |e: String| sqlx::Error::Decode(e.into());
            let applied_on = OffsetDateTime::parse(&applied_on, &Rfc3339)
                .map_err(|e| decode(format!("migration {version} applied_on: {e}")))?;
            let checksum = checksum
                .parse::<u64>()
                .map_err(|e| decode(format!("migration {version} checksum: {e}")))?;
            let version = i32::try_from(version)
                .map_err(|e| decode(format!("migration version {version}: {e}")))?;
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

/// Refuse a database whose schema is not exactly the one this build knows:
/// newer needs a newer taskbroker; older (or none) needs `taskbroker
/// migrate` (or `serve`), so that workers never race to migrate.
pub(super) async fn check(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    let known = known_version();
    let applied: Option<i64> =
        sqlx::query_scalar("SELECT MAX(version) FROM refinery_schema_history")
            .fetch_one(&mut *conn)
            .await
            .unwrap_or(None);
    match applied {
        Some(v) if v == known => Ok(()),
        Some(v) if v > known => Err(StoreError::Schema(format!(
            "the database schema is version {v}, newer than this taskbroker knows ({known}): upgrade taskbroker"
        ))),
        Some(v) => Err(StoreError::Schema(format!(
            "the database schema is version {v}, older than this taskbroker's ({known}): run `taskbroker migrate` (or start `taskbroker serve`) first"
        ))),
        None => Err(StoreError::Schema(format!(
            "the database has no taskbroker schema: run `taskbroker migrate` (or start `taskbroker serve`) first (schema version {known})"
        ))),
    }
}

/// Apply every pending migration; returns how many were applied.
///
/// Two processes starting on a fresh file may race to apply the same
/// migration: the loser's transaction fails, and a retry then finds the
/// migration applied.
pub(super) async fn run(options: &SqliteConnectOptions) -> Result<usize, StoreError> {
    let mut last_error = String::new();
    for attempt in 0..5u64 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
        }
        let conn = SqliteConnection::connect_with(options).await?;
        let mut conn = SqlxMigrationConn(conn);
        match migrations::runner().run_async(&mut conn).await {
            Ok(report) => {
                let applied = report.applied_migrations().len();
                for m in report.applied_migrations() {
                    tracing::info!(version = m.version(), name = m.name(), "migration applied");
                }
                conn.0.close().await?;
                return Ok(applied);
            }
            Err(e) => last_error = e.to_string(),
        }
    }
    Err(StoreError::Migrate(last_error))
}
