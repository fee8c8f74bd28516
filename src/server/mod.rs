//! The MCP endpoint over Streamable HTTP: axum routes, origin checks,
//! sessions, JSON and SSE responses, and the dispatch of methods to the
//! broker. No SQL here. [`connections`] accepts connections and holds
//! them to their deadlines and cap. Two front ends share `/mcp`: 2025-11-25
//! sessions ([`dispatch`]) and stateless 2026-07-28 requests ([`modern`]).

mod audit;
pub mod auth;
mod calls;
mod checks;
pub mod connections;
mod dispatch;
mod limits;
mod modern;
mod notify;
pub mod origin;
mod posted;
mod refusals;
mod reply;
mod responses;
mod session_http;
mod sessions;
mod sse;
mod streams;
mod transport;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{any, get};

use crate::broker::Broker;
use crate::defaults;

pub use audit::{Actor, Audit};
pub use calls::ClientRequests;
pub use limits::{
    RateLimiter, Refusal, RequestLimits, Requestor, StreamCounter, hold_while_streaming,
};
pub use modern::headers::Presence as HeaderPresence;
pub use notify::{SessionStreams, spawn_status_notifier, spawn_tools_notifier};
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
    /// Requests per second per principal (per session without
    /// authentication); 0 = unlimited.
    pub rate_per_sec: f64,
    /// Burst of requests allowed above the rate.
    pub rate_burst: f64,
    /// Without authentication, requests per second per client address
    /// that name no live session (initialize, mostly); 0 = unlimited.
    pub initialize_rate_per_sec: f64,
    /// Burst allowed above the initialize rate.
    pub initialize_burst: f64,
    /// Live sessions at most (initialize beyond: 503).
    pub max_sessions: i64,
    /// A session unused this long expires (404, the client initializes
    /// again), unless it owns a task whose ttl has not run out.
    pub session_idle: Duration,
    /// Open SSE streams at most (beyond: 503).
    pub max_sse_streams: usize,
    /// From accept, or a reused connection's first byte, to the end of the
    /// request head (the connection is closed beyond).
    pub header_timeout: Duration,
    /// From a request's head to the end of its body (408 beyond).
    pub body_timeout: Duration,
    /// A kept-alive connection with no request in flight is closed after
    /// this.
    pub idle_timeout: Duration,
    /// Open connections at most (beyond: refused at once).
    pub max_connections: u32,
    /// After the last answer on a connection, what the client still sends
    /// is read and thrown away for at most this long ...
    pub linger_time: Duration,
    /// ... and at most this many bytes (then the connection is closed).
    pub linger_bytes: u64,
    /// Which absent MCP 2026-07-28 headers are refused (`--strict-headers`).
    pub header_presence: HeaderPresence,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: defaults::MAX_BODY,
            allowed_origins: Vec::new(),
            keep_alive: Duration::from_secs(15),
            retry_ms: 1000,
            rate_per_sec: defaults::RATE,
            rate_burst: defaults::RATE_BURST,
            initialize_rate_per_sec: defaults::INITIALIZE_RATE,
            initialize_burst: defaults::INITIALIZE_BURST,
            max_sessions: defaults::MAX_SESSIONS,
            session_idle: defaults::SESSION_IDLE,
            max_sse_streams: defaults::MAX_SSE_STREAMS,
            header_timeout: defaults::HEADER_TIMEOUT,
            body_timeout: defaults::BODY_TIMEOUT,
            idle_timeout: defaults::IDLE_TIMEOUT,
            max_connections: defaults::MAX_CONNECTIONS,
            linger_time: defaults::LINGER_TIME,
            linger_bytes: defaults::LINGER_BYTES,
            header_presence: HeaderPresence::default(),
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
    /// Request rates per requestor, and of initialize per address.
    pub limiter: Arc<RequestLimits>,
    /// Open SSE streams.
    pub open_streams: Arc<StreamCounter>,
    /// The audit trail.
    pub audit: Arc<Audit>,
    /// Whether tokens exist, as last read.
    pub token_presence: Arc<auth::TokenPresence>,
    /// HTTP settings.
    pub config: Arc<ServerConfig>,
    /// Where we listen (for origin checks).
    pub local_addr: SocketAddr,
}

/// The router: `/mcp` (POST, GET, DELETE) and `/healthz`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/mcp",
            // The last layer runs first: origin, then token, then rate.
            any(transport::mcp)
                .layer(from_fn_with_state(state.clone(), checks::rate))
                .layer(from_fn_with_state(state.clone(), checks::authenticate))
                .layer(from_fn_with_state(state.clone(), checks::origin)),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}
