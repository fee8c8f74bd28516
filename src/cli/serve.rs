//! `taskbroker serve`: its flags, and the server's settings they make
//! with the config file and the defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;

use super::settings::{
    FileDuration, durability, duration_setting, lease_setting, load_config, ms, positive_secs,
    positive_setting, secs, tools,
};
use crate::app::ServeConfig;
use crate::broker::BrokerConfig;
use crate::defaults;
use crate::server::{HeaderPresence, ServerConfig};
use crate::store::Durability;

/// The flags of `taskbroker serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file (taskbroker.toml): settings and command tools.
    #[arg(long, env = "TASKBROKER_CONFIG")]
    config: Option<PathBuf>,
    /// Where spans of every task's life go.
    #[command(flatten)]
    pub(super) traces: super::TraceArgs,
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

impl ServeArgs {
    /// The server's settings: each flag, else the config file, else the default.
    pub fn into_config(self) -> anyhow::Result<ServeConfig> {
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
        config.check_retention(max_ttl)?;
        let retention = config.server_retention()?;
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
                retention,
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
            upstreams: config.upstreams.clone(),
        })
    }
}
