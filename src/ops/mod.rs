//! Operator commands: `taskbroker stats`, `taskbroker workers`,
//! `taskbroker upstreams`,
//! `taskbroker tasks list --db`, `taskbroker backup`, `taskbroker prune`
//! and `taskbroker token`. They use the database directly (no broker needs to run; one
//! may), so they need what the broker needs: the SQLite file, or the
//! PostgreSQL URL and its rights. Only `token` creates or migrates a
//! database (see [`tokens`]).

pub mod backup;
pub mod prune;
pub mod stats;
pub mod tasks;
pub mod tokens;
pub mod upstreams;
pub mod workers;

use std::path::{Path, PathBuf};

use clap::Args;

pub(crate) use crate::client::table;
use crate::client::{EXIT_FAILURE, EXIT_OK};
use crate::store::{self, Durability, Store};

pub use backup::{BackupArgs, run as backup};
pub use prune::{PruneArgs, run as prune};
pub use stats::{StatsArgs, run as stats};
pub use tokens::{TokenCommand, run as token};
pub use upstreams::{UpstreamsArgs, run as upstreams};
pub use workers::{WorkersArgs, run as workers};

/// `--db` of the operator commands.
#[derive(Debug, Clone, Args)]
pub struct DbArg {
    /// The database: a SQLite file or a postgres://user@host/dbname URL.
    #[arg(long, env = "TASKBROKER_DB", default_value = "taskbroker.db")]
    pub db: PathBuf,
}

/// Open an existing, current database, or say why not on stderr.
async fn open(db: &Path) -> Result<Store, u8> {
    store::open_existing(db, Durability::Full)
        .await
        .map_err(|e| failed(&e))
}

/// Print `taskbroker: <error>` and give the failure exit code.
fn failed(e: &dyn std::fmt::Display) -> u8 {
    eprintln!("taskbroker: {e}");
    EXIT_FAILURE
}

/// Print `value` as one line of JSON on stdout.
fn print_json(value: &serde_json::Value) -> u8 {
    println!("{value}");
    EXIT_OK
}

/// A duration in ms as `850ms`, `12.3s`, `4m05s`, `2h10m`, `3d04h`.
fn age(ms: i64) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if ms < 86_400_000 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(-5), "0ms");
        assert_eq!(age(850), "850ms");
        assert_eq!(age(12_345), "12.3s");
        assert_eq!(age(245_000), "4m05s");
        assert_eq!(age(7_800_000), "2h10m");
        assert_eq!(age(273_600_000), "3d04h");
    }
}
