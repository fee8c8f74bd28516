//! Broker processes: `serve` (store, change feed, maintenance, embedded
//! workers, HTTP) and `worker` (store, change feed, maintenance, workers),
//! each stopping cleanly on SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, BrokerConfig, Feed, Writer, maintenance};
use crate::defaults;
use crate::server::connections::{Deadlines, Linger};
use crate::server::{
    AppState, Audit, ClientRequests, RateLimiter, RequestLimits, ServerConfig, SessionStreams,
    Sessions, StreamCounter, Streams, spawn_status_notifier, spawn_tools_notifier,
};
use crate::store::{self, Database, Durability, FeedInterest, Store, WorkerKind};
use crate::tools::{TaskSupport, Tool, ToolCatalog};
use crate::upstream::{UpstreamSpec, Upstreams};
use crate::worker::{WorkerConfig, WorkerPool};

/// Everything `taskbroker serve` is told.
#[derive(Clone)]
pub struct ServeConfig {
    /// The SQLite file.
    pub db: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Embedded workers (0 = leave jobs to `taskbroker worker` processes).
    pub workers: usize,
    /// Job lease.
    pub lease: Duration,
    /// On shutdown, how long running jobs may finish before their leases
    /// are released.
    pub grace: Duration,
    /// Commit durability.
    pub durability: Durability,
    /// Task rules.
    pub broker: BrokerConfig,
    /// HTTP settings.
    pub server: ServerConfig,
    /// How long shutdown waits for open requests and streams.
    pub shutdown_grace: Duration,
    /// The tools served.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Upstream MCP servers whose tools are served too.
    pub upstreams: Vec<UpstreamSpec>,
}

impl ServeConfig {
    /// A broker on `db` serving `tools`, with every other setting at its
    /// default (127.0.0.1:8808, one worker per core, 30 s lease, ...): the
    /// start of a custom server built on this library.
    pub fn new(db: impl Into<PathBuf>, tools: Vec<Arc<dyn Tool>>) -> Self {
        Self {
            db: db.into(),
            listen: defaults::LISTEN,
            workers: std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(1),
            lease: defaults::LEASE,
            grace: defaults::GRACE,
            durability: Durability::default(),
            broker: BrokerConfig::default(),
            server: ServerConfig::default(),
            shutdown_grace: Duration::from_secs(5),
            tools,
            upstreams: Vec::new(),
        }
    }
}

/// Everything `taskbroker worker` is told.
#[derive(Clone)]
pub struct WorkConfig {
    /// The SQLite file (must exist, with the current schema).
    pub db: PathBuf,
    /// Jobs run at once.
    pub concurrency: usize,
    /// Job lease.
    pub lease: Duration,
    /// On shutdown, how long running jobs may finish before their leases
    /// are released.
    pub grace: Duration,
    /// Commit durability.
    pub durability: Durability,
    /// The tools this worker can run.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Upstream MCP servers whose tools this worker can run.
    pub upstreams: Vec<UpstreamSpec>,
    /// Where to serve this process's `/metrics` (None: nowhere).
    pub metrics_listen: Option<SocketAddr>,
}

/// How often the change-feed tailer checks for commits by other processes.
const FEED_TICK: Duration = Duration::from_millis(10);
/// How often a worker process's change feed catches up on what it was not
/// woken for (cancellations and answers wake it at once; the lease
/// heartbeat is the fallback).
const WORKER_FEED_CATCH_UP: Duration = Duration::from_secs(1);

/// Store-side services every broker process runs: the change feed and
/// maintenance (ttl purge, lease rescue).
struct Core {
    store: Store,
    broker: Broker,
    shutdown: CancellationToken,
    tailer: tokio::task::JoinHandle<()>,
    maintenance: tokio::task::JoinHandle<()>,
    upstreams: Upstreams,
}

impl Core {
    async fn start(
        store: Store,
        tools: Vec<Arc<dyn Tool>>,
        upstreams: Vec<UpstreamSpec>,
        broker: BrokerConfig,
        lease: Duration,
        session_idle: Option<Duration>,
        interest: FeedInterest,
    ) -> anyhow::Result<Self> {
        let tick = match interest {
            FeedInterest::Everything => FEED_TICK,
            FeedInterest::Control => WORKER_FEED_CATCH_UP,
        };
        let groups = upstreams.iter().map(|u| u.name.clone()).collect();
        let tools = Arc::new(ToolCatalog::new(tools, groups)?);
        crate::metrics::get().zero_known_series(
            tools
                .current()
                .definitions()
                .filter(|d| d.task_support != TaskSupport::Forbidden)
                .map(|d| d.name.as_str()),
        );
        let feed = Feed::new();
        let shutdown = CancellationToken::new();
        let tailer = feed
            .spawn_tailer(store.clone(), interest, tick, shutdown.clone())
            .await?;
        let job_queued = Arc::new(tokio::sync::Notify::new());
        let writer = Writer::spawn(store.clone(), feed.clone(), job_queued.clone());
        let broker = Broker::new(store.clone(), tools, broker, feed, writer, job_queued);
        // Before serving: each upstream's tools are listed (or taken from
        // the database) by the time the first client asks.
        let upstreams = Upstreams::start(
            upstreams,
            broker.catalog().clone(),
            store.clone(),
            defaults::UPSTREAM_START_WAIT,
        )
        .await;
        let maintenance = tokio::spawn(maintenance::run(
            broker.clone(),
            maintenance::MaintenanceConfig::for_lease(lease, session_idle),
            shutdown.clone(),
        ));
        Ok(Self {
            store,
            broker,
            shutdown,
            tailer,
            maintenance,
            upstreams,
        })
    }

    fn pool(
        &self,
        concurrency: usize,
        lease: Duration,
        grace: Duration,
        kind: WorkerKind,
    ) -> WorkerPool {
        WorkerPool::new(
            self.broker.pool_records(),
            self.broker.catalog().clone(),
            self.broker.feed().clone(),
            WorkerConfig {
                concurrency,
                lease,
                idle_max: Duration::from_secs(1),
                grace,
                kind,
            },
            self.broker.job_queued(),
            self.broker.writer().clone(),
        )
    }

    /// `scrape`, whose `/readyz` also says how this process's upstreams
    /// stand.
    fn scrape(&self, scrape: crate::metrics::Scrape) -> crate::metrics::Scrape {
        match self.upstreams.states() {
            Some(states) => scrape.with_upstreams(states),
            None => scrape,
        }
    }

    async fn stop(self) {
        self.upstreams.stop().await;
        self.shutdown.cancel();
        let _ = self.maintenance.await;
        let _ = self.tailer.await;
        self.store.close().await;
    }
}

/// Run a broker until SIGINT/SIGTERM.
pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    // The address first: a broker that cannot listen must not have started
    // claiming jobs it would then abandon.
    let listener = bind(config.listen).await?;
    let store = store::open_for_broker(&config.db, config.durability).await?;
    let core = Core::start(
        store.clone(),
        config.tools.clone(),
        config.upstreams.clone(),
        config.broker.clone(),
        config.lease,
        Some(config.server.session_idle),
        FeedInterest::Everything,
    )
    .await?;
    // Cancelled by SIGINT/SIGTERM: HTTP drains, workers stop claiming and
    // finish or release their jobs.
    let stopping = CancellationToken::new();
    // Started (registered, taking the writer's hand-off) before the first
    // request is answered, so that the first tasks are claimed as they are
    // created.
    let pool = match config.workers {
        0 => None,
        workers => {
            let pool = core
                .pool(workers, config.lease, config.grace, WorkerKind::Embedded)
                .start()
                .await;
            Some(tokio::spawn(pool.run(stopping.clone())))
        }
    };

    let local_addr = listener.local_addr()?;
    let open_streams = Arc::new(StreamCounter::new(config.server.max_sse_streams));
    let scrape = core.scrape(crate::metrics::Scrape::new(
        store.clone(),
        Some(open_streams.clone()),
        Some(config.server.session_idle),
    ));
    let session_streams = Arc::new(SessionStreams::default());
    let notifier = spawn_status_notifier(
        core.broker.clone(),
        session_streams.clone(),
        core.shutdown.clone(),
    );
    // The tools change only with upstream servers.
    let tools_notifier = (!core.broker.catalog().groups().is_empty()).then(|| {
        spawn_tools_notifier(
            core.broker.catalog().clone(),
            session_streams.clone(),
            core.shutdown.clone(),
        )
    });
    let state = app_state(
        &config,
        core.broker.clone(),
        local_addr,
        open_streams,
        session_streams,
    );
    let console = crate::console::Console {
        app: state.clone(),
        store: store.clone(),
        upstreams: store.clone(),
        database: match Database::parse(&config.db) {
            Database::Sqlite(_) => "sqlite",
            Database::Postgres(_) => "postgres",
        },
        stopping: stopping.clone(),
    };
    let app = crate::metrics::http_layer(
        crate::server::router(state)
            .merge(crate::metrics::routes(scrape))
            .merge(crate::console::routes(console)),
    );
    // Scripts and tests read this line to learn the port.
    crate::logging::stdout_line(&format!("taskbroker listening on http://{local_addr}/mcp"));
    tracing::info!(%local_addr, db = %config.db.display(), workers = config.workers,
                   lease_s = config.lease.as_secs_f64(), "broker started");
    tracing::info!(url = %format!("http://{local_addr}/ui"),
                   "web console (loopback without tokens, else an operator token)");

    {
        let stopping = stopping.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested");
            stopping.cancel();
        });
    }
    let server = crate::server::connections::serve(
        listener,
        app,
        config.server.max_connections,
        Deadlines {
            header: config.server.header_timeout,
            idle: config.server.idle_timeout,
        },
        Linger {
            time: config.server.linger_time,
            bytes: config.server.linger_bytes,
        },
        stopping.clone(),
    );
    let grace = config.shutdown_grace;
    let stopped = stopping.clone();
    tokio::select! {
        () = server => {}
        // Long-lived streams (tasks/result waits) would hold graceful
        // shutdown open forever: give them a bounded grace period.
        _ = async move { stopped.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::info!("grace period over: closing open streams");
        }
    }
    stopping.cancel();
    if let Some(pool) = pool {
        let _ = pool.await;
    }
    core.stop().await;
    let _ = notifier.await;
    if let Some(tools_notifier) = tools_notifier {
        let _ = tools_notifier.await;
    }
    tracing::info!("broker stopped");
    Ok(())
}

/// The shared state of the HTTP front end of a broker on `config`
/// answering as `local_addr`.
fn app_state(
    config: &ServeConfig,
    broker: Broker,
    local_addr: SocketAddr,
    open_streams: Arc<StreamCounter>,
    session_streams: Arc<SessionStreams>,
) -> AppState {
    AppState {
        limiter: Arc::new(RequestLimits::new(
            RateLimiter::new(config.server.rate_per_sec, config.server.rate_burst),
            RateLimiter::new(
                config.server.initialize_rate_per_sec,
                config.server.initialize_burst,
            ),
        )),
        open_streams,
        audit: Arc::new(Audit::default()),
        token_presence: Arc::default(),
        session_streams,
        broker: broker.clone(),
        sessions: Arc::new(Sessions::new(broker.sessions(), config.server.session_idle)),
        streams: Arc::new(Streams::new(
            config.server.retry_ms,
            config.server.keep_alive,
        )),
        client_requests: Arc::new(ClientRequests::default()),
        config: Arc::new(config.server.clone()),
        local_addr,
    }
}

/// A broker's `/mcp` endpoint in this process, without a listener, a
/// worker pool or signal handling: for callers that drive the router
/// themselves (tower's `oneshot`, or an axum app of their own).
pub struct McpEndpoint {
    /// `/mcp` and `/healthz`, answering as if listening on the address
    /// given to [`McpEndpoint::start`].
    pub router: axum::Router,
    core: Core,
}

impl McpEndpoint {
    /// Open (and migrate) `config.db`, start the broker's change feed and
    /// maintenance, and build the router; origin checks take `local_addr`
    /// as the listening address. `config.listen` and `config.workers` are
    /// not used: jobs wait for a `taskbroker worker` on the same database.
    pub async fn start(config: ServeConfig, local_addr: SocketAddr) -> anyhow::Result<Self> {
        let store = store::open_for_broker(&config.db, config.durability).await?;
        let core = Core::start(
            store,
            config.tools.clone(),
            config.upstreams.clone(),
            config.broker.clone(),
            config.lease,
            Some(config.server.session_idle),
            FeedInterest::Everything,
        )
        .await?;
        let state = app_state(
            &config,
            core.broker.clone(),
            local_addr,
            Arc::new(StreamCounter::new(config.server.max_sse_streams)),
            Arc::new(SessionStreams::default()),
        );
        Ok(Self {
            router: crate::server::router(state),
            core,
        })
    }

    /// Stop the change feed and maintenance, and close the database.
    pub async fn stop(self) {
        self.core.stop().await;
    }
}

/// The database of a worker process, once its schema is this build's: a
/// worker started together with a broker (or `taskbroker migrate`) on a
/// new database waits for it to be created and migrated. It gives up, with
/// the same error as without waiting, once the answer has stayed the same
/// for [`defaults::SCHEMA_WAIT`] (nobody is migrating: a database left
/// old), and in any case after [`defaults::SCHEMA_WAIT_LONGEST`]. A
/// migration under way changes the answer (the applied version, or the
/// file locked by the migrator), and so keeps the worker waiting.
async fn open_when_migrated(
    db: &std::path::Path,
    durability: store::Durability,
) -> Result<store::Store, store::StoreError> {
    use tokio::time::Instant;
    let longest = Instant::now() + defaults::SCHEMA_WAIT_LONGEST;
    let mut still = Instant::now() + defaults::SCHEMA_WAIT;
    let mut last = String::new();
    loop {
        match store::open_existing(db, durability).await {
            Err(store::StoreError::NotMigrated(reason)) if Instant::now() < still.min(longest) => {
                if reason != last {
                    tracing::debug!(%reason, "waiting for the database schema");
                    still = Instant::now() + defaults::SCHEMA_WAIT;
                    last = reason;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// Run a worker process until SIGINT/SIGTERM: claims jobs from the
/// database, runs their tools, records their outcomes. Never migrates.
pub async fn work(config: WorkConfig) -> anyhow::Result<()> {
    let store = open_when_migrated(&config.db, config.durability).await?;
    let core = Core::start(
        store.clone(),
        config.tools.clone(),
        config.upstreams.clone(),
        BrokerConfig::default(),
        config.lease,
        None,
        FeedInterest::Control,
    )
    .await?;
    let scrape = core.scrape(crate::metrics::Scrape::new(store, None, None));
    let pool = core.pool(
        config.concurrency,
        config.lease,
        config.grace,
        WorkerKind::Process,
    );
    tracing::info!(worker = %pool.id(), db = %config.db.display(), concurrency = config.concurrency,
                   lease_s = config.lease.as_secs_f64(), "worker started");
    let stop = CancellationToken::new();
    let metrics_stop = CancellationToken::new();
    let metrics = match config.metrics_listen {
        Some(addr) => {
            Some(crate::metrics::serve_worker_metrics(addr, scrape, metrics_stop.clone()).await?)
        }
        None => None,
    };
    let running = tokio::spawn(pool.run(stop.clone()));
    wait_for_signal().await;
    tracing::info!("shutdown requested: no new claims");
    stop.cancel();
    let _ = running.await;
    metrics_stop.cancel();
    if let Some(metrics) = metrics {
        let _ = metrics.await;
    }
    core.stop().await;
    tracing::info!("worker stopped");
    Ok(())
}

/// Listen on `addr`, or say why not and what to do.
async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                " (is another taskbroker running there? choose another address with --listen)"
            }
            std::io::ErrorKind::AddrNotAvailable => {
                " (no interface of this machine has that address: check --listen)"
            }
            std::io::ErrorKind::PermissionDenied => {
                " (ports below 1024 need privileges: choose another with --listen)"
            }
            _ => "",
        };
        anyhow::anyhow!("cannot listen on {addr}: {e}{hint}")
    })
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Apply migrations to `db` and report how many ran.
pub async fn migrate(db: &std::path::Path) -> anyhow::Result<usize> {
    Ok(store::migrate(db).await?)
}
