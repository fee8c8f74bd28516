//! The HTTP side of metrics: `/metrics`, `/readyz`, the request-counting
//! layer, and the small listener of `taskbroker worker --metrics-listen`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::get as metrics;
use crate::clock::now_ms;
use crate::store::{Store, StoreError};

/// How long `/readyz` waits for the database's answer.
const READY_TIMEOUT: Duration = Duration::from_secs(2);
/// A commit of the writer taking longer than this makes `/readyz` fail.
pub const WRITER_STALL: Duration = Duration::from_secs(10);
/// How long a scrape waits for the database gauges.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// A count of open SSE streams, kept by the HTTP front end.
pub trait OpenStreams: std::fmt::Debug + Send + Sync {
    /// Streams open now.
    fn open(&self) -> usize;
}

/// What a scrape reads besides the instruments: the database, and this
/// process's open streams and session settings.
#[derive(Debug, Clone)]
pub struct Scrape {
    store: Store,
    streams: Option<Arc<dyn OpenStreams>>,
    upstreams: Option<Arc<dyn UpstreamStates>>,
    session_idle_ms: Option<i64>,
    /// One set of database reads at a time, whoever scrapes.
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl Scrape {
    /// Scrapes of a process on `store`; a server also reports its SSE
    /// streams and live sessions (sessions unused for `session_idle`
    /// expire).
    pub fn new(
        store: Store,
        streams: Option<Arc<dyn OpenStreams>>,
        session_idle: Option<Duration>,
    ) -> Self {
        Self {
            store,
            streams,
            session_idle_ms: session_idle.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            gate: Arc::default(),
            upstreams: None,
        }
    }

    /// `/readyz` also says how each upstream of the process stands.
    pub fn with_upstreams(mut self, upstreams: Arc<dyn UpstreamStates>) -> Self {
        self.upstreams = Some(upstreams);
        self
    }

    /// Read the database gauges: a handful of indexed queries.
    async fn refresh(&self) {
        let m = metrics();
        if let Some(streams) = &self.streams {
            m.sse_streams.set(streams.open() as i64);
        }
        let _one_at_a_time = self.gate.lock().await;
        let now = now_ms();
        let store = &self.store;
        let reads = async {
            let queue = store.metrics_queue_by_tool(now).await?;
            let workers = store.metrics_worker_counts().await?;
            let size = store.metrics_database_size().await?;
            let sessions = match self.session_idle_ms {
                Some(idle) => Some(store.session_count_live(idle, now).await?),
                None => None,
            };
            Ok::<_, StoreError>((queue, workers, size, sessions))
        };
        match tokio::time::timeout(SCRAPE_TIMEOUT, reads).await {
            Ok(Ok((queue, workers, size, sessions))) => {
                m.queue_depth.clear();
                m.queue_oldest_age.clear();
                for served in m.served_tools() {
                    let labels = vec![("tool", served)];
                    m.queue_depth.get_or_create(&labels).set(0);
                    m.queue_oldest_age.get_or_create(&labels).set(0.0);
                }
                for q in queue {
                    let labels = vec![("tool", q.tool)];
                    m.queue_depth.get_or_create(&labels).set(q.depth);
                    m.queue_oldest_age
                        .get_or_create(&labels)
                        .set(now.saturating_sub(q.oldest_created_at).max(0) as f64 / 1000.0);
                }
                for (state, n) in [
                    ("live", workers.live),
                    ("stopping", workers.stopping),
                    ("dead", workers.dead),
                ] {
                    m.workers
                        .get_or_create(&vec![("state", state.to_owned())])
                        .set(n);
                }
                m.database_size.set(size);
                if let Some(n) = sessions {
                    m.sessions_live.set(n);
                }
            }
            Ok(Err(e)) => {
                m.scrape_errors.inc();
                tracing::warn!(error = %e, "metrics: reading the database failed");
            }
            Err(_) => {
                m.scrape_errors.inc();
                tracing::warn!("metrics: the database did not answer within {SCRAPE_TIMEOUT:?}");
            }
        }
    }
}

/// How each upstream MCP server of a process stands, for `/readyz`.
pub trait UpstreamStates: std::fmt::Debug + Send + Sync {
    /// Per upstream, by name: `ready`, `starting`, or `down: <why>`.
    fn states(&self) -> Vec<(String, String)>;
}

/// `/metrics` and `/readyz` over `scrape`.
pub fn routes(scrape: Scrape) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/readyz", get(readyz))
        .with_state(scrape)
}

/// Count every request of `router` by method, path and status, with its
/// latency.
pub fn http_layer(router: Router) -> Router {
    router.layer(middleware::from_fn(track))
}

async fn track(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = match request.uri().path() {
        "/mcp" => "/mcp",
        "/metrics" => "/metrics",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        p if p == "/ui" || p.starts_with("/ui/") => "/ui",
        _ => "other",
    };
    let started = Instant::now();
    let response = next.run(request).await;
    metrics().http_request(
        method.as_str(),
        path,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

async fn serve_metrics(State(scrape): State<Scrape>) -> Response {
    scrape.refresh().await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        super::encode(),
    )
        .into_response()
}

/// 200 when the database answers, its schema is the one this build
/// knows, and the writer is not stuck in a commit; else 503 naming the
/// failed checks.
async fn readyz(State(scrape): State<Scrape>) -> Response {
    let store = &scrape.store;
    let mut failed = Vec::new();
    let database = match tokio::time::timeout(READY_TIMEOUT, store.metrics_ping()).await {
        Ok(Ok(())) => "ok".to_owned(),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => format!("no answer within {} s", READY_TIMEOUT.as_secs()),
    };
    if database != "ok" {
        failed.push("database");
    }
    let schema = match tokio::time::timeout(READY_TIMEOUT, store.metrics_schema_versions()).await {
        Ok(Ok(v)) if v.applied == Some(v.known) => "ok".to_owned(),
        Ok(Ok(v)) => match v.applied {
            Some(applied) => format!(
                "the database's schema is version {applied}, this taskbroker's is {}",
                v.known
            ),
            None => "the database has no taskbroker schema".to_owned(),
        },
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => format!("no answer within {} s", READY_TIMEOUT.as_secs()),
    };
    if schema != "ok" {
        failed.push("schema");
    }
    let writer = match metrics().writer_busy_for() {
        Some(busy) if busy > WRITER_STALL => format!(
            "one group commit has taken {:.1} s (more than {} s)",
            busy.as_secs_f64(),
            WRITER_STALL.as_secs()
        ),
        _ => "ok".to_owned(),
    };
    if writer != "ok" {
        failed.push("writer");
    }
    let status = if failed.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = json!({
        "status": if failed.is_empty() { "ready" } else { "not ready" },
        "failed": failed,
        "checks": { "database": database, "schema": schema, "writer": writer },
    });
    // Detail, never a failure: the broker serves its other tools, and the
    // calls of a down upstream wait for it (or end at their timeout).
    if let Some(upstreams) = &scrape.upstreams {
        let states: serde_json::Map<String, Value> = upstreams
            .states()
            .into_iter()
            .map(|(name, state)| (name, Value::String(state)))
            .collect();
        body["upstreams"] = Value::Object(states);
    }
    (status, axum::Json(body)).into_response()
}

/// `taskbroker worker --metrics-listen`: `/metrics`, `/readyz` and
/// `/healthz` of the worker process on `addr`, until `shutdown`.
pub async fn serve_worker_metrics(
    addr: SocketAddr,
    scrape: Scrape,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--metrics-listen): {e}"))?;
    let local = listener.local_addr()?;
    let app = http_layer(routes(scrape).route("/healthz", get(|| async { "ok" })));
    crate::logging::stdout_line(&format!("taskbroker metrics on http://{local}/metrics"));
    tracing::info!(%local, "metrics listener started");
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "metrics listener failed");
        }
    }))
}
