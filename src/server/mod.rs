//! The MCP endpoint over Streamable HTTP: axum routes, origin checks,
//! sessions, JSON and SSE responses, and the dispatch of methods to the
//! broker. No SQL here.

mod calls;
mod dispatch;
mod notify;
mod origin;
mod sessions;
mod sse;
mod streams;
mod transport;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{any, get};

use crate::broker::Broker;

pub use calls::ClientRequests;
pub use notify::{SessionStreams, spawn_status_notifier};
pub use sessions::{Session, Sessions};
pub use streams::Streams;

/// HTTP-level settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest accepted POST body (413 beyond).
    pub max_body_bytes: usize,
    /// Origins allowed besides localhost and the listen address (H-2).
    pub allowed_origins: Vec<String>,
    /// Interval of SSE keep-alive comments.
    pub keep_alive: Duration,
    /// `retry` (ms) announced in priming events: how long a client waits
    /// to reconnect after the server closes a stream.
    pub retry_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 * 1024 * 1024,
            allowed_origins: Vec::new(),
            keep_alive: Duration::from_secs(15),
            retry_ms: 1000,
        }
    }
}

/// Shared state of every request.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Task rules and tools.
    pub broker: Broker,
    /// MCP sessions.
    pub sessions: Arc<Sessions>,
    /// Resumable SSE streams of requests in flight.
    pub streams: Arc<Streams>,
    /// Requests sent to clients, awaiting answers.
    pub client_requests: Arc<ClientRequests>,
    /// Open GET streams, for task status notifications.
    pub session_streams: Arc<SessionStreams>,
    /// HTTP settings.
    pub config: Arc<ServerConfig>,
    /// Where we listen (for origin checks).
    pub local_addr: SocketAddr,
}

/// The router: `/mcp` (POST, GET, DELETE) and `/healthz`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/mcp", any(transport::mcp))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}
