//! The schema-version rule every driver applies when it opens a database:
//! exactly the version this build knows, or a refusal that says what to do.

use crate::StoreError;

/// Refuse a database (`db`, as logs show it) whose schema version
/// (`applied`, `None` when it has no taskbroker schema) is not `known`:
/// newer needs a newer taskbroker; older (or none) needs `taskbroker
/// migrate` (or `serve`), so that workers never race to migrate.
pub fn check_version(db: &str, applied: Option<i64>, known: i64) -> Result<(), StoreError> {
    let schema = |reason: String| StoreError::Schema(format!("database {db}: {reason}"));
    let not_migrated = |reason: String| StoreError::NotMigrated(format!("database {db}: {reason}"));
    match applied {
        Some(v) if v == known => Ok(()),
        Some(v) if v > known => Err(schema(format!(
            "its schema (version {v}) is newer than this taskbroker knows ({known}) (upgrade taskbroker)"
        ))),
        Some(v) => Err(not_migrated(format!(
            "its schema (version {v}) is older than this taskbroker's ({known}) (run 'taskbroker migrate --db {db}', or start 'taskbroker serve --db {db}' once)"
        ))),
        None => Err(not_migrated(format!(
            "it has no taskbroker schema yet (run 'taskbroker migrate --db {db}', or start 'taskbroker serve --db {db}' once)"
        ))),
    }
}
