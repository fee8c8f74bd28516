//! The `taskbroker` command line: its subcommands, how each turns flags
//! (and their environment variables), the config file and the defaults
//! into a process's settings, and how a failure is printed. The binary
//! (`src/main.rs`) only parses, starts logging and the runtime, and calls
//! [`run`].

mod serve;
mod settings;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::{app, client, logging, ops};

pub use serve::ServeArgs;
pub use worker::WorkerArgs;

/// A durable MCP task broker (MCP 2025-11-25 and 2026-07-28): tasks, results and history in SQLite or PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "taskbroker", version, about)]
pub struct Cli {
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the MCP server (with embedded workers).
    Serve(ServeArgs),
    /// Run jobs from the database in this process (no HTTP).
    Worker(WorkerArgs),
    /// Create or upgrade the database schema, then exit.
    Migrate {
        /// The database: a SQLite file or a postgres://user@host/dbname URL.
        #[arg(long, env = "TASKBROKER_DB", default_value = "taskbroker.db")]
        db: PathBuf,
    },
    /// Call a tool on a running broker (plainly or as a task) and print its result.
    Call(client::CallArgs),
    /// Inspect the tasks of a session on a running broker: list, get, result, cancel.
    Tasks(client::TasksArgs),
    /// Load generator: K clients create tasks and wait for their results;
    /// reports tasks/s and latency percentiles. Works against any MCP server.
    Bench(client::BenchArgs),
    /// Manage bearer tokens: with any token, every request needs one.
    #[command(subcommand)]
    Token(ops::TokenCommand),
    /// Operators: queue depth and age by tool, running jobs, tasks by
    /// status, finish rates and recent failures, read from the database.
    Stats(ops::StatsArgs),
    /// Operators: one line per worker pool (state, host, pid, last
    /// heartbeat, jobs running), read from the database.
    Workers(ops::WorkersArgs),
    /// Operators: one line per upstream MCP server (state, restarts, tools
    /// served, calls running, last error), read from the database.
    Upstreams(ops::UpstreamsArgs),
    /// Operators: a consistent copy of a SQLite database, taken while
    /// brokers run (PostgreSQL: use pg_dump).
    Backup(ops::BackupArgs),
    /// Operators: purge tasks past their ttl now, as brokers do every few
    /// seconds, with their retention rules; `--dry-run` says what would be
    /// deleted, archived or kept.
    Prune(ops::PruneArgs),
}

/// Where OpenTelemetry spans go (`serve`, `worker`).
#[derive(Debug, Clone, clap::Args)]
pub struct TraceArgs {
    /// Export OpenTelemetry spans of each task's life (call, creation,
    /// claim, attempt, completion) over OTLP/HTTP to the collector at URL,
    /// e.g. http://127.0.0.1:4318 (spans go to URL/v1/traces) [default: off,
    /// unless OTEL_EXPORTER_OTLP_ENDPOINT is set].
    #[arg(long, env = "TASKBROKER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

impl Command {
    /// What this subcommand exports spans as, if it runs tasks (`serve`,
    /// `worker`); whether it does is [`crate::traces::export::start`]'s
    /// call.
    pub fn trace_settings(&self) -> Option<crate::traces::export::Settings> {
        let (args, process) = match self {
            Command::Serve(args) => (&args.traces, "serve"),
            Command::Worker(args) => (&args.traces, "worker"),
            _ => return None,
        };
        Some(crate::traces::export::Settings {
            endpoint: args.otlp_endpoint.clone(),
            process,
        })
    }

    /// The log filter of this subcommand: the client and operator
    /// commands print their own output, so their logs are warnings only.
    pub fn log_filter(&self) -> &'static str {
        match self {
            Command::Call(_) | Command::Tasks(_) => "warn",
            // A token command's output is its answer: no migration notes, no
            // slow-statement warnings (a first migration on a busy server is
            // slow); failures are its error line.
            Command::Token(_) => "warn,sqlx=error",
            // A backup (VACUUM INTO) is one long statement by nature: no
            // slow-statement warnings from sqlx.
            Command::Stats(_)
            | Command::Workers(_)
            | Command::Upstreams(_)
            | Command::Backup(_)
            | Command::Prune(_) => "warn,sqlx=error",
            _ => logging::DEFAULT_FILTER,
        }
    }
}

/// Run one subcommand to its end; its exit status, or why it failed.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => app::serve(args.into_config()?).await?,
        Command::Worker(args) => app::work(args.into_config()?).await?,
        Command::Migrate { db } => {
            let applied = app::migrate(&db).await?;
            println!("{}: {applied} migration(s) applied", db.display());
        }
        Command::Call(args) => std::process::exit(client::call(args).await.into()),
        // `tasks list --db` reads the database, like the operator commands.
        Command::Tasks(args) => match &args.command {
            client::TasksCommand::List { all, operator, .. } if operator.db.is_some() => {
                return Ok(ops::tasks::list(operator, *all).await.into());
            }
            _ => std::process::exit(client::tasks(args).await.into()),
        },
        Command::Token(cmd) => ops::token(cmd).await?,
        Command::Bench(args) => std::process::exit(client::bench(args).await.into()),
        Command::Stats(args) => return Ok(ops::stats(args).await.into()),
        Command::Workers(args) => return Ok(ops::workers(args).await.into()),
        Command::Upstreams(args) => return Ok(ops::upstreams(args).await.into()),
        Command::Backup(args) => return Ok(ops::backup(args).await.into()),
        Command::Prune(args) => return Ok(ops::prune(args).await.into()),
    }
    Ok(ExitCode::SUCCESS)
}

/// A failure is one line on stderr, `taskbroker: <what>: <why> (<hint>)`,
/// and exit status 1: no `Caused by:` list and no backtrace, whatever
/// `RUST_BACKTRACE` says (backtraces are for panics).
pub fn fail(e: &anyhow::Error) -> ExitCode {
    let line = format!("taskbroker: {}\n", one_line(e));
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    ExitCode::FAILURE
}

/// An error and its causes joined with ": ", leaving out a cause whose
/// text the line already holds (wrappers often repeat their source).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
