//! refinery migrations (files in `migrations/`) run over a sqlx connection,
//! so the build has one SQLite driver.

use refinery::Migration;
use refinery_core::traits::r#async::{AsyncMigrate, AsyncQuery, AsyncTransaction};
use std::path::Path;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, Connection, Row, SqliteConnection};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{BEGIN_IMMEDIATE, StoreError};

refinery::embed_migrations!("../../migrations/sqlite");

/// One sqlx connection that refinery drives through its async traits.
struct SqlxMigrationConn(SqliteConnection);

impl AsyncTransaction for SqlxMigrationConn {
    type Error = sqlx::Error;

    async fn execute<'a, T: Iterator<Item = &'a str> + Send + 'a>(
        &'a mut self,
        queries: T,
    ) -> Result<usize, Self::Error> {
        // The migrations and their history rows commit together.
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

/// Refuse a database whose schema is not exactly the one this build knows
/// (`taskbroker_storage::schema::check_version`).
pub(super) async fn check(path: &Path, conn: &mut SqliteConnection) -> Result<(), StoreError> {
    let known = known_version();
    let has_history: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'refinery_schema_history')",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| super::open_failed(path, &e))?;
    let applied: Option<i64> = if has_history {
        sqlx::query_scalar("SELECT MAX(version) FROM refinery_schema_history")
            .fetch_one(&mut *conn)
            .await?
    } else {
        None
    };
    let db = path.display().to_string();
    taskbroker_storage::schema::check_version(&db, applied, known)
}

/// How long a process keeps retrying a migration that another process
/// applying the same migrations at once makes fail.
const RACE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Apply every pending migration; returns how many were applied.
///
/// Processes starting at once on a fresh file race to apply the same
/// migrations: the loser's connection or transaction fails (locked, a
/// table that already exists, a history row taken), and it retries until
/// the winner is done and nothing is left to apply, for up to
/// [`RACE_DEADLINE`]. The winner applies them all in one transaction.
pub(super) async fn run(path: &Path, options: &SqliteConnectOptions) -> Result<usize, StoreError> {
    let deadline = tokio::time::Instant::now() + RACE_DEADLINE;
    let mut attempt = 0u64;
    loop {
        let error = match try_run(path, options).await {
            Ok(applied) => return Ok(applied),
            Err(e) => e,
        };
        // Only what another process migrating at once causes is worth
        // another try: the file locked, a table, column or history row it
        // made first, a trigger or view it already replaced (each process
        // reads the applied versions before it takes the write lock). A
        // migration that fails so on its own still fails at the deadline.
        // Anything else (a file that is no database, a full or broken
        // disk) is said at once.
        let raced = [
            "database is locked",
            "database table is locked",
            "already exists",
            "duplicate column name",
            "no such trigger",
            "no such view",
            "UNIQUE constraint failed: refinery_schema_history",
        ]
        .iter()
        .any(|t| error.contains(t));
        if !raced {
            let unusable = ["file is not a database", "unable to open", "readonly"]
                .iter()
                .any(|t| error.contains(t));
            return Err(if unusable {
                super::open_failed(path, &error)
            } else {
                StoreError::Migrate(error)
            });
        }
        attempt += 1;
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::Migrate(format!(
                "{error} (still failing after {attempt} attempts in {} s)",
                RACE_DEADLINE.as_secs()
            )));
        }
        tracing::debug!(db = %path.display(), attempt, error = %error,
                        "migration raced another process; retrying");
        tokio::time::sleep(std::time::Duration::from_millis(20 * attempt.min(10))).await;
    }
}

/// One attempt of [`run`]; the error as text.
async fn try_run(path: &Path, options: &SqliteConnectOptions) -> Result<usize, String> {
    let conn = SqliteConnection::connect_with(options)
        .await
        .map_err(|e| e.to_string())?;
    let mut conn = SqlxMigrationConn(conn);
    // All pending migrations in one transaction: processes migrating at
    // once take turns on the write lock, so one applies them all and the
    // others find nothing left (each migration committing on its own let
    // two processes apply alternate ones), and an upgrade that fails part
    // way leaves the schema it found.
    let report = migrations::runner()
        .set_grouped(true)
        .run_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let applied = report.applied_migrations();
    if let (Some(first), Some(last)) = (applied.first(), applied.last()) {
        tracing::info!(db = %path.display(), applied = applied.len(),
                       from = first.version() - 1, to = last.version(),
                       "database schema migrated");
    }
    conn.0.close().await.map_err(|e| e.to_string())?;
    Ok(applied.len())
}
