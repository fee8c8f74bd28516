//! `taskbroker`: the command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use taskbroker::app::{self, ServeConfig};
use taskbroker::broker::BrokerConfig;
use taskbroker::server::ServerConfig;
use taskbroker::store::Durability;
use tracing_subscriber::EnvFilter;

/// A durable MCP task broker: tasks, results and history in SQLite.
#[derive(Debug, Parser)]
#[command(name = "taskbroker", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the MCP server (with embedded workers).
    Serve(ServeArgs),
    /// Create or upgrade the database schema, then exit.
    Migrate {
        /// SQLite database file.
        #[arg(long, env = "TASKBROKER_DB", default_value = "taskbroker.db")]
        db: PathBuf,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// SQLite database file (created and migrated on first start).
    #[arg(long, env = "TASKBROKER_DB", default_value = "taskbroker.db")]
    db: PathBuf,
    /// Address to listen on. Port 0 picks a free port.
    #[arg(long, env = "TASKBROKER_LISTEN", default_value = "127.0.0.1:8808")]
    listen: SocketAddr,
    /// Embedded workers (jobs run at once); default one per core; 0 leaves
    /// execution to separate worker processes.
    #[arg(long, env = "TASKBROKER_WORKERS")]
    workers: Option<usize>,
    /// Job lease in seconds: a worker silent this long is presumed dead and
    /// its job is run again.
    #[arg(long, env = "TASKBROKER_LEASE", default_value_t = 30.0, value_parser = positive_secs)]
    lease: f64,
    /// Longest ttl a task may have, in seconds; requested ttls are clamped.
    #[arg(long, env = "TASKBROKER_MAX_TTL", default_value_t = 7 * 24 * 3600)]
    max_ttl: u64,
    /// ttl in seconds of a task whose request names none.
    #[arg(long, env = "TASKBROKER_DEFAULT_TTL", default_value_t = 3600)]
    default_ttl: u64,
    /// pollInterval suggested on every task, in milliseconds.
    #[arg(long, env = "TASKBROKER_POLL_INTERVAL", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    poll_interval: u64,
    /// Tasks per tasks/list page.
    #[arg(long, env = "TASKBROKER_PAGE_SIZE", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    page_size: u64,
    /// Largest POST body in bytes (413 beyond).
    #[arg(long, env = "TASKBROKER_MAX_BODY", default_value_t = 4 * 1024 * 1024)]
    max_body: usize,
    /// Extra allowed Origin (repeatable); localhost is always allowed.
    #[arg(
        long = "allowed-origin",
        env = "TASKBROKER_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    allowed_origins: Vec<String>,
    /// Commit durability: full (fsync per commit, default) or normal.
    #[arg(long, env = "TASKBROKER_DURABILITY", default_value = "full")]
    durability: Durability,
    /// Also serve the MCP conformance suite's fixture tools (test_*).
    #[arg(long)]
    conformance_tools: bool,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds above 0 and at most 86400".into())
    }
}

fn secs_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

impl ServeArgs {
    fn into_config(self) -> ServeConfig {
        let workers = self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(1)
        });
        ServeConfig {
            db: self.db,
            listen: self.listen,
            workers,
            lease: Duration::from_secs_f64(self.lease),
            durability: self.durability,
            broker: BrokerConfig {
                default_ttl_ms: Some(secs_ms(self.default_ttl.min(self.max_ttl))),
                max_ttl_ms: secs_ms(self.max_ttl),
                poll_interval_ms: i64::try_from(self.poll_interval).unwrap_or(i64::MAX),
                page_size: i64::try_from(self.page_size).unwrap_or(100),
            },
            server: ServerConfig {
                max_body_bytes: self.max_body,
                allowed_origins: self.allowed_origins,
                ..ServerConfig::default()
            },
            shutdown_grace: Duration::from_secs(5),
            conformance_tools: self.conformance_tools,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => app::serve(args.into_config()).await,
        Command::Migrate { db } => {
            let applied = app::migrate(&db).await?;
            println!("{}: {applied} migration(s) applied", db.display());
            Ok(())
        }
    }
}
