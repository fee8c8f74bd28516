//! `taskbroker backup --to FILE`: a consistent copy of a SQLite database
//! while brokers and workers use it. PostgreSQL has pg_dump.

use std::path::{Path, PathBuf};

use clap::Args;

use super::{DbArg, failed};
use crate::client::{EXIT_OK, EXIT_USAGE};
use crate::store::{Database, Durability, Storage, without_password};
use taskbroker_sqlite::SqliteStore;

/// `taskbroker backup`.
#[derive(Debug, Clone, Args)]
pub struct BackupArgs {
    /// The new file to write the copy to (refused if it exists).
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
    /// The database.
    #[command(flatten)]
    pub db: DbArg,
}

/// Run `taskbroker backup`; the exit code.
pub async fn run(args: BackupArgs) -> u8 {
    let path = match Database::parse(&args.db.db) {
        Database::Sqlite(path) => path,
        Database::Postgres(url) => {
            let url = without_password(&url);
            eprintln!(
                "taskbroker: backup: {url} is a PostgreSQL database: back it up with pg_dump \
                 (pg_dump -Fc '{url}' > taskbroker.dump; restore with pg_restore -d URL taskbroker.dump)"
            );
            return EXIT_USAGE;
        }
    };
    match backup(&path, &args.to).await {
        Ok(bytes) => {
            println!(
                "{}: a copy of {} ({bytes} bytes)",
                args.to.display(),
                path.display()
            );
            EXIT_OK
        }
        Err(e) => failed(&format!("backup: {e}")),
    }
}

/// `to` plus `.partial`.
fn partial_of(to: &Path) -> PathBuf {
    let mut name = to.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Copy into `to.partial`, push it to disk, move it to `to`, push the
/// folder: `to` is either absent or whole. The size of the copy.
async fn backup(db: &Path, to: &Path) -> anyhow::Result<u64> {
    if to.exists() {
        anyhow::bail!(
            "{} exists: a backup never overwrites a file (name a new one)",
            to.display()
        );
    }
    let folder = match to.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => p.to_owned(),
        None => PathBuf::from("."),
    };
    if !folder.is_dir() {
        anyhow::bail!(
            "folder {} does not exist (create it first)",
            folder.display()
        );
    }
    let partial = partial_of(to);
    if partial.exists() {
        anyhow::bail!(
            "{} exists: another backup is running, or one was interrupted (delete it if none runs)",
            partial.display()
        );
    }
    let store = SqliteStore::open_existing(db, Durability::Full).await?;
    let copied = store.backup_into(&partial).await;
    store.close().await;
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&partial);
        return Err(e.into());
    }
    let bytes = std::fs::metadata(&partial)?.len();
    // A link, unlike a rename, never replaces a file that appeared since.
    match std::fs::hard_link(&partial, to) {
        Ok(()) => std::fs::remove_file(&partial)?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(&partial);
            anyhow::bail!("{} appeared during the backup: left alone", to.display());
        }
        // A file system without hard links.
        Err(_) => std::fs::rename(&partial, to).map_err(|e| {
            anyhow::anyhow!(
                "cannot rename {} to {}: {e}",
                partial.display(),
                to.display()
            )
        })?,
    }
    // The rename itself reaches the disk with the folder.
    std::fs::File::open(&folder)?.sync_all()?;
    Ok(bytes)
}
