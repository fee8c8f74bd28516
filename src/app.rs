//! One broker process: open the store, start the change feed, maintenance
//! and the embedded workers, serve HTTP, and stop cleanly on SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, BrokerConfig, Feed, maintenance};
use crate::server::{AppState, ClientRequests, ServerConfig, Sessions, Streams};
use crate::store::{Durability, Store};
use crate::tools::{Registry, conformance_tools, demo_tools};
use crate::worker::{WorkerConfig, WorkerPool};

/// Everything `taskbroker serve` is told.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The SQLite file.
    pub db: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Embedded workers (0 = leave jobs to `taskbroker worker` processes).
    pub workers: usize,
    /// Job lease.
    pub lease: Duration,
    /// Commit durability.
    pub durability: Durability,
    /// Task rules.
    pub broker: BrokerConfig,
    /// HTTP settings.
    pub server: ServerConfig,
    /// How long shutdown waits for open requests and streams.
    pub shutdown_grace: Duration,
    /// Also serve the conformance suite's fixture tools.
    pub conformance_tools: bool,
}

/// How often the change-feed tailer checks for commits by other processes.
const FEED_TICK: Duration = Duration::from_millis(20);

/// Run a broker until SIGINT/SIGTERM.
pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let store = Store::open(&config.db, config.durability)
        .await
        .with_context(|| format!("opening database {}", config.db.display()))?;
    let mut tools = demo_tools();
    if config.conformance_tools {
        tools.extend(conformance_tools());
    }
    let tools = Arc::new(Registry::new(tools)?);
    let feed = Feed::new();
    let shutdown = CancellationToken::new();
    let tailer = feed
        .spawn_tailer(store.clone(), FEED_TICK, shutdown.clone())
        .await?;
    let broker = Broker::new(
        store.clone(),
        tools.clone(),
        config.broker.clone(),
        feed.clone(),
    );

    let maintenance = tokio::spawn(maintenance::run(
        broker.clone(),
        maintenance::MaintenanceConfig::for_lease(config.lease),
        shutdown.clone(),
    ));
    let pool = (config.workers > 0).then(|| {
        let pool = WorkerPool::new(
            store.clone(),
            tools.clone(),
            feed.clone(),
            WorkerConfig {
                concurrency: config.workers,
                lease: config.lease,
                idle_tick: Duration::from_millis(250),
            },
            broker.job_queued(),
        );
        tokio::spawn(pool.run(shutdown.clone()))
    });

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let local_addr = listener.local_addr()?;
    let state = AppState {
        broker,
        sessions: Arc::new(Sessions::new(store.clone())),
        streams: Arc::new(Streams::new(
            config.server.retry_ms,
            config.server.keep_alive,
        )),
        client_requests: Arc::new(ClientRequests::default()),
        config: Arc::new(config.server.clone()),
        local_addr,
    };
    let app = crate::server::router(state);
    // Scripts and tests read this line to learn the port.
    println!("taskbroker listening on http://{local_addr}/mcp");
    tracing::info!(%local_addr, db = %config.db.display(), workers = config.workers,
                   lease_s = config.lease.as_secs_f64(), "broker started");

    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested");
        signal.cancel();
    });
    let graceful = shutdown.clone();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move { graceful.cancelled().await });
    let grace = config.shutdown_grace;
    let stopped = shutdown.clone();
    tokio::select! {
        result = server => result.context("HTTP server failed")?,
        // Long-lived streams (tasks/result waits) would hold graceful
        // shutdown open forever: give them a bounded grace period.
        _ = async move { stopped.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::info!("grace period over: closing open streams");
        }
    }
    shutdown.cancel();
    if let Some(pool) = pool {
        let _ = pool.await;
    }
    let _ = maintenance.await;
    let _ = tailer.await;
    store.close().await;
    tracing::info!("broker stopped");
    Ok(())
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
    Store::migrate(db)
        .await
        .with_context(|| format!("migrating {}", db.display()))
}
