//! The one error type of every storage driver.

/// Errors of storage. Callers map them to protocol errors; the database
/// error text is logged, never sent to clients.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The lease token no longer matches: another worker (or the rescuer)
    /// owns the job now, so this worker must write nothing more.
    #[error("lease lost")]
    LeaseLost,
    /// The database or the connection failed, or refused a write.
    #[error("database error: {0}")]
    Db(Box<dyn std::error::Error + Send + Sync>),
    /// A stored value this build cannot read (an unknown status...).
    #[error("unreadable row: {0}")]
    Decode(String),
    /// A schema migration failed.
    #[error("migration failed: {0}")]
    Migrate(String),
    /// A group commit failed as a whole: this write was not committed.
    #[error("the group commit failed: {0}")]
    Batch(String),
    /// The database's schema is newer than the one this build knows.
    #[error("{0}")]
    Schema(String),
    /// The database does not exist yet, or has no schema or an older one:
    /// `taskbroker migrate` (or a starting broker) brings it up to date,
    /// so a process that may wait for one (a worker) does.
    #[error("{0}")]
    NotMigrated(String),
    /// A task with this idempotency key exists already for the same owner
    /// and tool (another request, maybe on another broker, created it
    /// first).
    #[error("a task with this idempotency key exists")]
    IdempotencyKeyTaken,
    /// The database cannot be used at all: a path that names a directory,
    /// a file that is not a database, a server that refuses us...
    #[error("database {path}: {reason}")]
    Open {
        /// The database as given (a URL without its password).
        path: String,
        /// What is wrong, and what to do.
        reason: String,
    },
}

impl StoreError {
    /// A database failure from any source.
    pub fn db(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Db(Box::new(error))
    }

    /// The text of a database failure (a trigger's message, a constraint
    /// name...), for callers that tell refusals apart.
    pub fn db_message(&self) -> Option<String> {
        match self {
            Self::Db(e) => Some(e.to_string()),
            _ => None,
        }
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if let Some(db) = error.as_database_error()
            && db.is_unique_violation()
            && (db.constraint() == Some("tasks_idempotency_key")
                || db.message().contains("tasks.idempotency_key"))
        {
            return Self::IdempotencyKeyTaken;
        }
        Self::Db(Box::new(error))
    }
}
