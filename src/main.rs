//! `taskbroker`: the command line. Flags (and their environment variables)
//! override the config file, which overrides the defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::process::ExitCode;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand};
use taskbroker::app::{self, ServeConfig, WorkConfig};
use taskbroker::broker::BrokerConfig;
use taskbroker::client;
use taskbroker::config::{Config, DurationValue};
use taskbroker::defaults;
use taskbroker::logging;
use taskbroker::server::{HeaderPresence, ServerConfig};
use taskbroker::store::Durability;
use taskbroker::tools::{Tool, conformance_tools, demo_tools};

/// A durable MCP task broker (MCP 2025-11-25 and 2026-07-28): tasks, results and history in SQLite or PostgreSQL.
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
    Token(taskbroker::ops::TokenCommand),
    /// Operators: queue depth and age by tool, running jobs, tasks by
    /// status, finish rates and recent failures, read from the database.
    Stats(taskbroker::ops::StatsArgs),
    /// Operators: one line per worker pool (state, host, pid, last
    /// heartbeat, jobs running), read from the database.
    Workers(taskbroker::ops::WorkersArgs),
    /// Operators: a consistent copy of a SQLite database, taken while
    /// brokers run (PostgreSQL: use pg_dump).
    Backup(taskbroker::ops::BackupArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Config file (taskbroker.toml): settings and command tools.
    #[arg(long, env = "TASKBROKER_CONFIG")]
    config: Option<PathBuf>,
    /// The database: a SQLite file (created and migrated on first start), or a
    /// postgres://user@host/dbname URL (the database must exist; it is migrated)
    /// [default: taskbroker.db].
    #[arg(long, env = "TASKBROKER_DB")]
    db: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port [default: 127.0.0.1:8808].
    #[arg(long, env = "TASKBROKER_LISTEN")]
    listen: Option<SocketAddr>,
    /// Jobs the embedded pool runs at once, all tools together (a tool's
    /// own `concurrency` may be lower) [default: 256]; 0 leaves
    /// execution to `taskbroker worker` processes.
    #[arg(long, env = "TASKBROKER_WORKERS")]
    workers: Option<usize>,
    /// Job lease in seconds: a worker silent this long is presumed dead and
    /// its job is run again [default: 30].
    #[arg(long, env = "TASKBROKER_LEASE", value_parser = positive_secs)]
    lease: Option<f64>,
    /// On shutdown, seconds running jobs may finish before their leases are
    /// released to other workers [default: 10].
    #[arg(long, env = "TASKBROKER_GRACE", value_parser = secs)]
    grace: Option<f64>,
    /// Longest ttl a task may have, in seconds; requested ttls are clamped [default: 604800].
    #[arg(long, env = "TASKBROKER_MAX_TTL")]
    max_ttl: Option<u64>,
    /// ttl in seconds of a task whose request names none [default: 3600].
    #[arg(long, env = "TASKBROKER_DEFAULT_TTL")]
    default_ttl: Option<u64>,
    /// pollInterval suggested on every task, in milliseconds [default: 1000].
    #[arg(long, env = "TASKBROKER_POLL_INTERVAL", value_parser = clap::value_parser!(u64).range(1..))]
    poll_interval: Option<u64>,
    /// Tasks per tasks/list page [default: 100].
    #[arg(long, env = "TASKBROKER_PAGE_SIZE", value_parser = clap::value_parser!(u64).range(1..=1000))]
    page_size: Option<u64>,
    /// Largest POST body in bytes (413 beyond) [default: 4194304].
    #[arg(long, env = "TASKBROKER_MAX_BODY")]
    max_body: Option<usize>,
    /// Extra allowed Origin (repeatable); localhost is always allowed.
    #[arg(
        long = "allowed-origin",
        env = "TASKBROKER_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    allowed_origins: Vec<String>,
    /// Commit durability: full (fsync per commit) or normal [default: full].
    #[arg(long, env = "TASKBROKER_DURABILITY")]
    durability: Option<Durability>,
    /// Also serve the MCP conformance suite's fixture tools (test_*).
    #[arg(long, env = "TASKBROKER_CONFORMANCE_TOOLS", value_parser = BoolishValueParser::new())]
    conformance_tools: bool,
    /// Do not serve the demo tools (echo, sleep, sleep_as_task, fail, approve).
    #[arg(long, env = "TASKBROKER_NO_DEMO_TOOLS", value_parser = BoolishValueParser::new())]
    no_demo_tools: bool,
    /// Non-terminal tasks one requestor (principal or session) may have [default: 100000].
    #[arg(long, env = "TASKBROKER_MAX_OPEN_TASKS", value_parser = clap::value_parser!(i64).range(1..))]
    max_open_tasks: Option<i64>,
    /// Largest tool arguments in bytes [default: 1048576].
    #[arg(long, env = "TASKBROKER_MAX_ARGUMENT_BYTES")]
    max_argument_bytes: Option<usize>,
    /// Requests per second per principal (per session without tokens);
    /// 0 = unlimited [default: 1000].
    #[arg(long, env = "TASKBROKER_RATE")]
    rate: Option<f64>,
    /// Burst above the rate [default: 10000].
    #[arg(long, env = "TASKBROKER_RATE_BURST")]
    rate_burst: Option<f64>,
    /// Without tokens, initialize requests (and any request naming no live
    /// session) per second per client address; 0 = unlimited [default: 20].
    #[arg(long, env = "TASKBROKER_INITIALIZE_RATE")]
    initialize_rate: Option<f64>,
    /// Burst above the initialize rate [default: 200].
    #[arg(long, env = "TASKBROKER_INITIALIZE_BURST")]
    initialize_burst: Option<f64>,
    /// Live sessions at most [default: 10000].
    #[arg(long, env = "TASKBROKER_MAX_SESSIONS")]
    max_sessions: Option<i64>,
    /// Open SSE streams at most [default: 1000].
    #[arg(long, env = "TASKBROKER_MAX_SSE_STREAMS")]
    max_sse_streams: Option<usize>,
    /// Seconds a session may go unused before it expires (404; the client
    /// initializes again), unless it owns a task whose ttl has not run out
    /// [default: 3600].
    #[arg(long, env = "TASKBROKER_SESSION_IDLE", value_parser = positive_secs)]
    session_idle: Option<f64>,
    /// Seconds a client has to send a request's head, from connecting (or
    /// from its first byte on a reused connection); the connection is
    /// closed beyond [default: 10].
    #[arg(long, env = "TASKBROKER_HEADER_TIMEOUT", value_parser = positive_secs)]
    header_timeout: Option<f64>,
    /// Seconds a client has to send a request's body once its head is in
    /// (408 beyond); responses and SSE streams have no such limit [default: 30].
    #[arg(long, env = "TASKBROKER_BODY_TIMEOUT", value_parser = positive_secs)]
    body_timeout: Option<f64>,
    /// Seconds a kept-alive connection may wait with no request in flight
    /// before it is closed; an open SSE stream is never idle [default: 60].
    #[arg(long, env = "TASKBROKER_IDLE_TIMEOUT", value_parser = positive_secs)]
    idle_timeout: Option<f64>,
    /// Open connections at most; beyond, new ones are refused at once
    /// with 503 [default: 10000].
    #[arg(long, env = "TASKBROKER_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: Option<u32>,
    /// After its last answer on a connection (a refusal that left the body
    /// unread, say), seconds the broker reads and throws away what the
    /// client still sends, so that a client writing its whole body before
    /// reading gets the answer instead of a reset [default: 10].
    #[arg(long, env = "TASKBROKER_LINGER_TIME", value_parser = positive_secs)]
    linger_time: Option<f64>,
    /// Bytes read and thrown away so, at most; beyond, the connection is
    /// closed [default: 67108864].
    #[arg(long, env = "TASKBROKER_LINGER_BYTES")]
    linger_bytes: Option<u64>,
    /// Refuse MCP 2026-07-28 requests that lack any header the spec requires
    /// (Mcp-Name on tasks/*, Mcp-Param-*), for deployments behind gateways
    /// that route on headers; by default only a header that disagrees with
    /// the body is refused.
    #[arg(long, env = "TASKBROKER_STRICT_HEADERS", value_parser = BoolishValueParser::new())]
    strict_headers: bool,
}

#[derive(Debug, Args)]
struct WorkerArgs {
    /// Config file (taskbroker.toml): the same tools as the server.
    #[arg(long, env = "TASKBROKER_CONFIG")]
    config: Option<PathBuf>,
    /// The database: a SQLite file or a postgres://user@host/dbname URL; it must
    /// have the current schema [default: taskbroker.db].
    #[arg(long, env = "TASKBROKER_DB")]
    db: Option<PathBuf>,
    /// Jobs run at once, all tools together (a tool's own `concurrency` may
    /// be lower) [default: 256].
    #[arg(long, env = "TASKBROKER_CONCURRENCY", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    concurrency: Option<u64>,
    /// Job lease in seconds [default: 30].
    #[arg(long, env = "TASKBROKER_LEASE", value_parser = positive_secs)]
    lease: Option<f64>,
    /// On SIGTERM/SIGINT, seconds running jobs may finish before their
    /// leases are released to other workers [default: 10].
    #[arg(long, env = "TASKBROKER_GRACE", value_parser = secs)]
    grace: Option<f64>,
    /// Commit durability: full or normal [default: full].
    #[arg(long, env = "TASKBROKER_DURABILITY")]
    durability: Option<Durability>,
    /// Do not serve the demo tools (echo, sleep, sleep_as_task, fail, approve).
    #[arg(long, env = "TASKBROKER_NO_DEMO_TOOLS", value_parser = BoolishValueParser::new())]
    no_demo_tools: bool,
    /// Serve this process's Prometheus metrics (/metrics, /readyz, /healthz)
    /// on ADDR, e.g. 127.0.0.1:9809 [default: off].
    #[arg(long, env = "TASKBROKER_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
}

fn secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && (0.0..=86_400.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be a number of seconds from 0 to 86400".into())
    }
}

fn positive_secs(s: &str) -> Result<f64, String> {
    let v = secs(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err("must be a number of seconds above 0".into())
    }
}

/// A duration in the config file, if set.
type FileDuration = Option<toml::Spanned<DurationValue>>;

/// A duration setting: the flag if given, else the first config key that is
/// set, else `default`.
fn duration_setting(
    config: &Config,
    flag: Option<Duration>,
    keys: &[&FileDuration],
    default: Duration,
) -> anyhow::Result<Duration> {
    if let Some(d) = flag {
        return Ok(d);
    }
    for key in keys {
        if let Some(d) = config.duration(key)? {
            return Ok(d);
        }
    }
    Ok(default)
}

/// A deadline of 0 would close every connection at once.
fn positive_setting(name: &str, value: Duration) -> anyhow::Result<Duration> {
    anyhow::ensure!(!value.is_zero(), "{name} must be above 0");
    Ok(value)
}

/// Leases shorter than this would expire between heartbeats.
fn lease_setting(lease: Duration) -> anyhow::Result<Duration> {
    anyhow::ensure!(
        lease >= Duration::from_millis(100),
        "lease must be at least 100 ms"
    );
    Ok(lease)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn load_config(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None => Ok(Config::default()),
    }
}

/// Demo tools (unless turned off), conformance fixtures (if asked), then
/// the config's command tools, none of which may take a built-in's name.
fn tools(config: &Config, no_demo: bool, conformance: bool) -> anyhow::Result<Vec<Arc<dyn Tool>>> {
    let mut tools = Vec::new();
    if !no_demo && config.file.server.demo_tools.unwrap_or(true) {
        let demo = demo_tools();
        config.check_reserved(
            demo.iter().map(|t| t.definition().name.as_str()),
            "a built-in demo tool",
        )?;
        tools.extend(demo);
    }
    if conformance || config.file.server.conformance_tools.unwrap_or(false) {
        let fixtures = conformance_tools();
        config.check_reserved(
            fixtures.iter().map(|t| t.definition().name.as_str()),
            "a conformance fixture tool",
        )?;
        tools.extend(fixtures);
    }
    tools.extend(config.tools.iter().cloned());
    Ok(tools)
}

fn durability(flag: Option<Durability>, file: &Option<String>) -> anyhow::Result<Durability> {
    match (flag, file) {
        (Some(d), _) => Ok(d),
        (None, Some(text)) => text
            .parse()
            .map_err(|e: String| anyhow::anyhow!("config: durability: {e}")),
        (None, None) => Ok(Durability::default()),
    }
}

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<ServeConfig> {
        let config = load_config(self.config.as_ref())?;
        let s = &config.file.server;
        let setting = |flag: Option<Duration>, keys: &[&FileDuration], default: Duration| {
            duration_setting(&config, flag, keys, default)
        };
        let lease = lease_setting(setting(
            self.lease.map(Duration::from_secs_f64),
            &[&s.lease],
            defaults::LEASE,
        )?)?;
        let grace = setting(
            self.grace.map(Duration::from_secs_f64),
            &[&s.grace],
            defaults::GRACE,
        )?;
        let session_idle = setting(
            self.session_idle.map(Duration::from_secs_f64),
            &[&s.session_idle],
            defaults::SESSION_IDLE,
        )?;
        let max_ttl = setting(
            self.max_ttl.map(Duration::from_secs),
            &[&s.max_ttl],
            defaults::MAX_TTL,
        )?;
        let default_ttl = setting(
            self.default_ttl.map(Duration::from_secs),
            &[&s.default_ttl],
            defaults::DEFAULT_TTL,
        )?;
        let poll_interval = setting(
            self.poll_interval.map(Duration::from_millis),
            &[&s.poll_interval],
            defaults::POLL_INTERVAL,
        )?;
        let header_timeout = positive_setting(
            "header_timeout",
            setting(
                self.header_timeout.map(Duration::from_secs_f64),
                &[&s.header_timeout],
                defaults::HEADER_TIMEOUT,
            )?,
        )?;
        let body_timeout = positive_setting(
            "body_timeout",
            setting(
                self.body_timeout.map(Duration::from_secs_f64),
                &[&s.body_timeout],
                defaults::BODY_TIMEOUT,
            )?,
        )?;
        let idle_timeout = positive_setting(
            "idle_timeout",
            setting(
                self.idle_timeout.map(Duration::from_secs_f64),
                &[&s.idle_timeout],
                defaults::IDLE_TIMEOUT,
            )?,
        )?;
        let linger_time = positive_setting(
            "linger_time",
            setting(
                self.linger_time.map(Duration::from_secs_f64),
                &[&s.linger_time],
                defaults::LINGER_TIME,
            )?,
        )?;
        let mut allowed_origins = s.allowed_origins.clone().unwrap_or_default();
        allowed_origins.extend(self.allowed_origins);
        Ok(ServeConfig {
            db: self
                .db
                .or(s.db.clone())
                .unwrap_or_else(|| defaults::DB.into()),
            listen: self.listen.or(s.listen).unwrap_or(defaults::LISTEN),
            workers: self.workers.or(s.workers).unwrap_or(defaults::CONCURRENCY),
            lease,
            grace,
            durability: durability(self.durability, &s.durability)?,
            broker: BrokerConfig {
                default_ttl_ms: Some(ms(default_ttl.min(max_ttl))),
                max_ttl_ms: ms(max_ttl),
                poll_interval_ms: ms(poll_interval).max(1),
                page_size: i64::try_from(
                    self.page_size
                        .or(s.page_size)
                        .unwrap_or(defaults::PAGE_SIZE)
                        .clamp(1, 1000),
                )
                .unwrap_or(1000),
                max_open_tasks: self
                    .max_open_tasks
                    .or(s.max_open_tasks)
                    .unwrap_or(defaults::MAX_OPEN_TASKS),
                max_argument_bytes: self
                    .max_argument_bytes
                    .or(s.max_argument_bytes)
                    .unwrap_or(defaults::MAX_ARGUMENT_BYTES),
            },
            server: ServerConfig {
                max_body_bytes: self.max_body.or(s.max_body).unwrap_or(defaults::MAX_BODY),
                allowed_origins,
                rate_per_sec: self.rate.or(s.rate).unwrap_or(defaults::RATE).max(0.0),
                rate_burst: self
                    .rate_burst
                    .or(s.rate_burst)
                    .unwrap_or(defaults::RATE_BURST)
                    .max(1.0),
                initialize_rate_per_sec: self
                    .initialize_rate
                    .or(s.initialize_rate)
                    .unwrap_or(defaults::INITIALIZE_RATE)
                    .max(0.0),
                initialize_burst: self
                    .initialize_burst
                    .or(s.initialize_burst)
                    .unwrap_or(defaults::INITIALIZE_BURST)
                    .max(1.0),
                max_sessions: self
                    .max_sessions
                    .or(s.max_sessions)
                    .unwrap_or(defaults::MAX_SESSIONS),
                session_idle,
                max_sse_streams: self
                    .max_sse_streams
                    .or(s.max_sse_streams)
                    .unwrap_or(defaults::MAX_SSE_STREAMS),
                header_timeout,
                body_timeout,
                idle_timeout,
                max_connections: self
                    .max_connections
                    .or(s.max_connections)
                    .unwrap_or(defaults::MAX_CONNECTIONS)
                    .max(1),
                linger_time,
                linger_bytes: self
                    .linger_bytes
                    .or(s.linger_bytes)
                    .unwrap_or(defaults::LINGER_BYTES),
                header_presence: if self.strict_headers || s.strict_headers.unwrap_or(false) {
                    HeaderPresence::Strict
                } else {
                    HeaderPresence::Lenient
                },
                ..ServerConfig::default()
            },
            shutdown_grace: Duration::from_secs(5),
            tools: tools(&config, self.no_demo_tools, self.conformance_tools)?,
        })
    }
}

impl WorkerArgs {
    fn into_config(self) -> anyhow::Result<WorkConfig> {
        let config = load_config(self.config.as_ref())?;
        let (s, w) = (&config.file.server, &config.file.worker);
        let setting = |flag: Option<Duration>, keys: &[&FileDuration], default: Duration| {
            duration_setting(&config, flag, keys, default)
        };
        // [worker] first, then [server].
        let lease = lease_setting(setting(
            self.lease.map(Duration::from_secs_f64),
            &[&w.lease, &s.lease],
            defaults::LEASE,
        )?)?;
        let grace = setting(
            self.grace.map(Duration::from_secs_f64),
            &[&w.grace, &s.grace],
            defaults::GRACE,
        )?;
        Ok(WorkConfig {
            db: self
                .db
                .or(s.db.clone())
                .unwrap_or_else(|| defaults::DB.into()),
            concurrency: self
                .concurrency
                .map(|c| c as usize)
                .or(w.concurrency)
                .unwrap_or(defaults::CONCURRENCY),
            lease,
            grace,
            durability: durability(self.durability, &s.durability)?,
            tools: tools(&config, self.no_demo_tools, false)?,
            metrics_listen: self.metrics_listen,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The client commands print their own output; logs only for warnings.
    logging::init(match cli.command {
        Command::Call(_) | Command::Tasks(_) => "warn",
        // A token command's output is its answer: no migration notes, no
        // slow-statement warnings (a first migration on a busy server is
        // slow); failures are its error line.
        Command::Token(_) => "warn,sqlx=error",
        // A backup (VACUUM INTO) is one long statement by nature: no
        // slow-statement warnings from sqlx.
        Command::Stats(_) | Command::Workers(_) | Command::Backup(_) => "warn,sqlx=error",
        _ => logging::DEFAULT_FILTER,
    });
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}

/// A failure is one line on stderr, `taskbroker: <what>: <why> (<hint>)`,
/// and exit status 1: no `Caused by:` list and no backtrace, whatever
/// `RUST_BACKTRACE` says (backtraces are for panics).
fn fail(e: &anyhow::Error) -> ExitCode {
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

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => app::serve(args.into_config()?).await?,
        Command::Worker(args) => app::work(args.into_config()?).await?,
        Command::Migrate { db } => {
            let applied = app::migrate(&db).await?;
            println!("{}: {applied} migration(s) applied", db.display());
        }
        Command::Call(args) => std::process::exit(client::call(args).await.into()),
        Command::Tasks(args) => std::process::exit(client::tasks(args).await.into()),
        Command::Token(cmd) => taskbroker::ops::token(cmd).await?,
        Command::Bench(args) => std::process::exit(client::bench(args).await.into()),
        Command::Stats(args) => return Ok(taskbroker::ops::stats(args).await.into()),
        Command::Workers(args) => return Ok(taskbroker::ops::workers(args).await.into()),
        Command::Backup(args) => return Ok(taskbroker::ops::backup(args).await.into()),
    }
    Ok(ExitCode::SUCCESS)
}
