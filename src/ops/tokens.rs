//! `taskbroker token create|list|revoke`: bearer tokens, written to the
//! database directly (no broker needs to run). Unlike the other operator
//! commands, `token create` on a new database creates and migrates it, so
//! that tokens can exist before the first broker starts.

use std::path::PathBuf;

use clap::Subcommand;

use crate::clock::now_ms;
use crate::mcp::format_time;
use crate::store::{self, Durability};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for a principal; prints it once, alone, on the last
    /// line (only its hash is stored).
    Create {
        /// Who the token acts as: tasks and sessions belong to principals.
        #[arg(long)]
        principal: String,
        /// Lifetime, e.g. "30d", "12h" [default: never expires].
        #[arg(long)]
        expires: Option<humantime::Duration>,
        /// May open the web console (/ui), which shows and cancels every
        /// principal's tasks.
        #[arg(long)]
        operator: bool,
        /// The database: a SQLite file or a postgres://user@host/dbname URL.
        #[arg(long, env = "TASKBROKER_DB", default_value = "taskbroker.db")]
        db: PathBuf,
    },
    /// List tokens (never their secrets).
    List {
        /// The database: a SQLite file or a postgres://user@host/dbname URL.
        #[arg(long, env = "TASKBROKER_DB", default_value = "taskbroker.db")]
        db: PathBuf,
    },
    /// Revoke a token by id (the part after tbk_ and before the next _).
    Revoke {
        /// The token id.
        id: String,
        /// The database: a SQLite file or a postgres://user@host/dbname URL.
        #[arg(long, env = "TASKBROKER_DB", default_value = "taskbroker.db")]
        db: PathBuf,
    },
}

/// Run a `taskbroker token` command.
pub async fn run(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Create {
            principal,
            expires,
            operator,
            db,
        } => {
            anyhow::ensure!(
                !principal.is_empty()
                    && principal.len() <= 200
                    && !principal.chars().any(char::is_control),
                "--principal must be 1-200 printable characters"
            );
            let store = store::open(&db, Durability::Full).await?;
            let (id, token, hash) = crate::server::auth::mint()
                .map_err(|e| anyhow::anyhow!("no randomness for a token: {e}"))?;
            let now = now_ms();
            let expires_at = expires
                .map(|d| now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
            let new = store::NewToken {
                token_id: id.clone(),
                principal: principal.clone(),
                secret_hash: hash.to_vec(),
                expires_at,
                operator,
            };
            store.token_create(&new, now).await?;
            store.close().await;
            eprintln!(
                "{} {id} for principal '{principal}'{}; it is shown once, store it now:",
                if operator { "operator token" } else { "token" },
                expires_at
                    .map(|at| format!(", expires {}", format_time(at)))
                    .unwrap_or_default()
            );
            println!("{token}");
            Ok(())
        }
        TokenCommand::List { db } => {
            let store = store::open(&db, Durability::Full).await?;
            for t in store.token_list().await? {
                let state = match (t.revoked_at, t.expires_at) {
                    (Some(at), _) => format!("revoked {}", format_time(at)),
                    (None, Some(at)) if at <= now_ms() => format!("expired {}", format_time(at)),
                    (None, Some(at)) => format!("expires {}", format_time(at)),
                    (None, None) => "no expiry".to_owned(),
                };
                let used = t
                    .last_used_at
                    .map(format_time)
                    .unwrap_or_else(|| "never used".into());
                println!(
                    "{}\t{}\tcreated {}\t{state}\t{used}{}",
                    t.token_id,
                    t.principal,
                    format_time(t.created_at),
                    if t.operator { "\toperator" } else { "" }
                );
            }
            store.close().await;
            Ok(())
        }
        TokenCommand::Revoke { id, db } => {
            let store = store::open(&db, Durability::Full).await?;
            let revoked = store.token_revoke(&id, now_ms()).await?;
            store.close().await;
            anyhow::ensure!(revoked, "no live token with id {id}");
            println!("token {id} revoked");
            Ok(())
        }
    }
}
