//! Storage: the interface every driver implements (crate
//! `taskbroker-storage`, re-exported here) and the choice of driver from
//! `--db`. Only the broker (and `app.rs`, which opens it) holds a
//! [`Store`]; nothing above the broker calls it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use taskbroker_storage::*;

use taskbroker_postgres::PostgresStore;
use taskbroker_sqlite::SqliteStore;

/// One open database, whatever its driver.
pub type Store = Arc<dyn Storage>;

/// Where the database is: the scheme of `--db` picks the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// A SQLite file: a plain path, or `sqlite:PATH`.
    Sqlite(PathBuf),
    /// A PostgreSQL server: `postgres://` or `postgresql://` URL.
    Postgres(String),
}

impl Database {
    /// Read `--db`.
    pub fn parse(db: &Path) -> Self {
        let text = db.to_string_lossy();
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Self::Postgres(text.into_owned())
        } else if let Some(path) = text.strip_prefix("sqlite://") {
            Self::Sqlite(PathBuf::from(path))
        } else if let Some(path) = text.strip_prefix("sqlite:") {
            Self::Sqlite(PathBuf::from(path))
        } else {
            Self::Sqlite(db.to_owned())
        }
    }
}

/// `postgres://user:secret@host/db` as `postgres://user@host/db`.
pub fn without_password(url: &str) -> String {
    taskbroker_postgres::without_password(url)
}

/// Open (creating and migrating if needed) the database: `token`.
pub async fn open(db: &Path, durability: Durability) -> Result<Store, StoreError> {
    match Database::parse(db) {
        Database::Sqlite(path) => Ok(Arc::new(SqliteStore::open(&path, durability).await?)),
        Database::Postgres(url) => Ok(Arc::new(PostgresStore::open(&url, durability).await?)),
    }
}

/// [`open`] for a broker (`serve`), which also warns about database
/// settings that hurt a broker's throughput (PostgreSQL without
/// autovacuum).
pub async fn open_for_broker(db: &Path, durability: Durability) -> Result<Store, StoreError> {
    match Database::parse(db) {
        Database::Sqlite(path) => Ok(Arc::new(SqliteStore::open(&path, durability).await?)),
        Database::Postgres(url) => {
            let store = PostgresStore::open(&url, durability).await?;
            store.warn_without_autovacuum().await?;
            Ok(Arc::new(store))
        }
    }
}

/// Open a database without migrating it (worker processes): refused unless
/// its schema is exactly the one this build knows.
pub async fn open_existing(db: &Path, durability: Durability) -> Result<Store, StoreError> {
    match Database::parse(db) {
        Database::Sqlite(path) => Ok(Arc::new(
            SqliteStore::open_existing(&path, durability).await?,
        )),
        Database::Postgres(url) => Ok(Arc::new(
            PostgresStore::open_existing(&url, durability).await?,
        )),
    }
}

/// Apply pending migrations; how many were applied.
pub async fn migrate(db: &Path) -> Result<usize, StoreError> {
    match Database::parse(db) {
        Database::Sqlite(path) => SqliteStore::migrate(&path).await,
        Database::Postgres(url) => PostgresStore::migrate(&url).await,
    }
}
