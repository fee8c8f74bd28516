//! One process's connection to one upstream server, kept up: started at
//! once, its tools listed and served (and listed again when the server says
//! they changed), started again with backoff when it ends, its state in the
//! log, in `/metrics` and in the database (`upstreams` rows, read by
//! `taskbroker upstreams` and the console).
//!
//! An upstream that cannot be reached is a state, not a failure of the
//! broker: its tools stay served from the last successful `tools/list` kept
//! in the database, and calls wait for it (up to their tool's timeout).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::spec::UpstreamSpec;
use super::tool::UpstreamTool;
use super::{Session, SessionOptions};
use crate::clock::now_ms;
use crate::metrics::UpstreamStates;
use crate::store::Store;
use crate::tools::{Refused, Tool, ToolCatalog, ToolOutcome};

/// First wait before starting a connection again.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest wait between starts.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A connection that lived this long starts again without backoff.
const BACKOFF_RESET: Duration = Duration::from_secs(60);

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Being started (the process, the handshake, the first listing).
    Starting,
    /// Serving calls.
    Ready,
    /// Ended or never started; starting again after a backoff.
    Down,
}

impl LinkState {
    /// The stored and displayed name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Down => "down",
        }
    }
}

/// What this process knows of one upstream now.
#[derive(Debug, Clone)]
pub struct LinkStatus {
    /// Where the connection stands.
    pub state: LinkState,
    /// Why it last ended or failed to start (None once ready again).
    pub last_error: Option<String>,
    /// Connections started again after the first.
    pub restarts: u64,
    /// The names its tools are served under (those no earlier source
    /// took).
    pub served: Vec<String>,
    /// Its tools that cannot be served as listed, and why (those that lose
    /// to another source's are the catalog's to say).
    pub unusable: Vec<Refused>,
}

/// One upstream's connection in this process.
pub struct Link {
    spec: Arc<UpstreamSpec>,
    session: watch::Sender<Option<Session>>,
    status: Mutex<LinkStatus>,
    in_flight: AtomicUsize,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("upstream", &self.spec.name)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl Link {
    fn new(spec: UpstreamSpec) -> Self {
        Self {
            spec: Arc::new(spec),
            session: watch::Sender::new(None),
            status: Mutex::new(LinkStatus {
                state: LinkState::Starting,
                last_error: None,
                restarts: 0,
                served: Vec::new(),
                unusable: Vec::new(),
            }),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The upstream as the config file declared it.
    pub fn spec(&self) -> &UpstreamSpec {
        &self.spec
    }

    /// Its state now.
    pub fn status(&self) -> LinkStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Calls open on it now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The session, once ready (waits while the upstream is starting or
    /// down); None if `cancel` fires first.
    pub async fn session(&self, cancel: &CancellationToken) -> Option<Session> {
        let mut ready = self.session.subscribe();
        loop {
            if let Some(session) = ready.borrow_and_update().clone() {
                return Some(session);
            }
            tokio::select! {
                changed = ready.changed() => if changed.is_err() { return None },
                _ = cancel.cancelled() => return None,
            }
        }
    }

    /// The session if ready now.
    pub fn current(&self) -> Option<Session> {
        self.session.borrow().clone()
    }

    /// Count a call for the metrics; the guard counts it in flight.
    pub(crate) fn call_started(self: &Arc<Self>) -> CallGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        CallGuard {
            link: self.clone(),
            started: Instant::now(),
        }
    }

    fn set_state(&self, store: &Store, state: LinkState, error: Option<String>, restarted: bool) {
        {
            let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
            status.state = state;
            status.last_error = error.clone();
            if restarted {
                status.restarts += 1;
            }
        }
        let m = crate::metrics::get();
        m.upstream_up(&self.spec.name, state == LinkState::Ready);
        if restarted {
            m.upstream_restarted(&self.spec.name);
        }
        let (store, name) = (store.clone(), self.spec.name.clone());
        tokio::spawn(async move {
            if let Err(e) = store
                .upstream_set_state(&name, state.as_str(), error.as_deref(), restarted, now_ms())
                .await
            {
                tracing::debug!(upstream = %name, error = %e, "upstream state not stored");
            }
        });
    }

    /// Serve the tools of a `tools/list` (or of the kept one); returns the
    /// names served. The catalog says which lose to another source's.
    fn publish(self: &Arc<Self>, catalog: &ToolCatalog, listed: &[Value]) -> Vec<String> {
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        let mut unusable = Vec::new();
        for entry in listed {
            match UpstreamTool::from_listed(&self.spec, entry, self.clone()) {
                Ok(Some(tool)) => tools.push(Arc::new(tool)),
                Ok(None) => {}
                Err(u) => unusable.push(Refused {
                    tool: self.spec.served_name(&u.tool),
                    reason: u.reason,
                }),
            }
        }
        let offered: Vec<String> = tools.iter().map(|t| t.definition().name.clone()).collect();
        let lost = catalog.set_group(&self.spec.name, tools);
        let served: Vec<String> = offered
            .into_iter()
            .filter(|n| !lost.iter().any(|r| &r.tool == n))
            .collect();
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        for r in &unusable {
            if !status.unusable.contains(r) {
                tracing::warn!(upstream = %self.spec.name, tool = %r.tool, reason = %r.reason,
                               "an upstream tool is not served");
            }
        }
        status.served.clone_from(&served);
        status.unusable = unusable;
        served
    }

    /// List the tools, serve them and keep the listing.
    async fn list_and_publish(
        self: &Arc<Self>,
        session: &Session,
        catalog: &ToolCatalog,
        store: &Store,
    ) {
        let listed = match session.list_tools().await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(upstream = %self.spec.name, error = %e, "tools/list failed; the tools served stay as they were");
                return;
            }
        };
        let served = self.publish(catalog, &listed);
        tracing::info!(upstream = %self.spec.name, tools = served.len(), listed = listed.len(), "upstream tools served");
        let (tools, served) = (
            Value::Array(listed).to_string(),
            Value::from(served).to_string(),
        );
        if let Err(e) = store
            .upstream_save_tools(&self.spec.name, &tools, &served, now_ms())
            .await
        {
            tracing::warn!(upstream = %self.spec.name, error = %e, "the tool list was not kept in the database");
        }
    }

    /// Serve the listing kept by an earlier run, if any, until the upstream
    /// answers.
    async fn publish_kept(self: &Arc<Self>, catalog: &ToolCatalog, store: &Store) {
        match store.upstream_tools_saved(&self.spec.name).await {
            Ok(Some((tools, listed_at))) => match serde_json::from_str::<Vec<Value>>(&tools) {
                Ok(listed) => {
                    let served = self.publish(catalog, &listed);
                    tracing::info!(upstream = %self.spec.name, tools = served.len(), listed_at,
                                   "serving the upstream's tools as last listed, until it answers");
                }
                Err(e) => {
                    tracing::warn!(upstream = %self.spec.name, error = %e, "the kept tool list is not JSON; ignored")
                }
            },
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(upstream = %self.spec.name, error = %e, "reading the kept tool list failed")
            }
        }
    }

    /// Keep the connection up until `shutdown`. `first` is told once the
    /// first start has succeeded or failed.
    async fn supervise(
        self: Arc<Self>,
        catalog: Arc<ToolCatalog>,
        store: Store,
        shutdown: CancellationToken,
        first: tokio::sync::oneshot::Sender<()>,
    ) {
        let mut first = Some(first);
        let mut backoff = BACKOFF_MIN;
        let mut restarted = false;
        loop {
            self.set_state(&store, LinkState::Starting, None, restarted);
            let started = Instant::now();
            let start = tokio::select! {
                start = Session::start(&self.spec.transport, SessionOptions::default()) => start,
                _ = shutdown.cancelled() => return,
            };
            match start {
                Ok(session) => {
                    self.list_and_publish(&session, &catalog, &store).await;
                    self.session.send_replace(Some(session.clone()));
                    self.set_state(&store, LinkState::Ready, None, false);
                    tracing::info!(upstream = %self.spec.name, pid = ?session.pid(),
                                   protocol = session.protocol_version(), "upstream ready");
                    if let Some(first) = first.take() {
                        let _ = first.send(());
                    }
                    let reason = tokio::select! {
                        reason = self.follow(&session, &catalog, &store) => reason,
                        _ = shutdown.cancelled() => {
                            self.session.send_replace(None);
                            return;
                        }
                    };
                    self.session.send_replace(None);
                    drop(session);
                    tracing::warn!(upstream = %self.spec.name, %reason, "upstream connection ended; starting it again");
                    self.set_state(&store, LinkState::Down, Some(reason), false);
                    if started.elapsed() >= BACKOFF_RESET {
                        backoff = BACKOFF_MIN;
                    }
                }
                Err(e) => {
                    let reason = format!("upstream '{}': {e}", self.spec.name);
                    tracing::warn!(upstream = %self.spec.name, error = %reason, retry_in = ?backoff,
                                   "upstream not started; its calls wait for it");
                    self.set_state(&store, LinkState::Down, Some(reason), false);
                    if let Some(first) = first.take() {
                        let _ = first.send(());
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
            restarted = true;
        }
    }

    /// While the connection lives: list the tools again when the server
    /// says they changed. Returns why it ended.
    async fn follow(
        self: &Arc<Self>,
        session: &Session,
        catalog: &ToolCatalog,
        store: &Store,
    ) -> String {
        let mut changed = session.tools_changed();
        loop {
            tokio::select! {
                reason = session.closed() => return reason.to_string(),
                seen = changed.changed() => {
                    if seen.is_err() {
                        return session.closed().await.to_string();
                    }
                    tracing::info!(upstream = %self.spec.name, "the upstream's tools changed; listing them again");
                    self.list_and_publish(session, catalog, store).await;
                }
            }
        }
    }
}

/// Counts one call while it is open, and its outcome when it ends.
pub(crate) struct CallGuard {
    link: Arc<Link>,
    started: Instant,
}

impl CallGuard {
    /// The call ended with `outcome`.
    pub(crate) fn finished(self, outcome: &ToolOutcome) {
        let kind = match outcome {
            ToolOutcome::Result(r) if r.get("isError") == Some(&Value::Bool(true)) => "tool_error",
            ToolOutcome::Result(_) => "ok",
            ToolOutcome::Error(_) => "error",
        };
        crate::metrics::get().upstream_call(&self.link.spec.name, kind, self.started.elapsed());
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.link.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Keep each upstream's served names (its `upstreams` row, its status)
/// current when another upstream changes them: an upstream declared
/// earlier that comes up takes a name a later one served, and one that
/// stops offering it gives it back. Until `shutdown`.
async fn keep_served_current(
    links: Vec<Arc<Link>>,
    catalog: Arc<ToolCatalog>,
    mut changed: watch::Receiver<u64>,
    store: Store,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            next = changed.changed() => if next.is_err() { return },
        }
        for link in &links {
            let served = catalog.served(link.name());
            let moved = {
                let mut status = link.status.lock().unwrap_or_else(PoisonError::into_inner);
                let moved = status.served != served;
                status.served.clone_from(&served);
                moved
            };
            if moved
                && let Err(e) = store
                    .upstream_set_served(link.name(), &Value::from(served).to_string())
                    .await
            {
                tracing::warn!(upstream = %link.name(), error = %e, "the tools served were not kept in the database");
            }
        }
    }
}

/// The links, read by `/readyz`.
#[derive(Debug)]
struct LinkStates(Vec<Arc<Link>>);

impl UpstreamStates for LinkStates {
    fn states(&self) -> Vec<(String, String)> {
        self.0
            .iter()
            .map(|link| {
                let status = link.status();
                let state = match (status.state, status.last_error) {
                    (LinkState::Down, Some(why)) => format!("down: {why}"),
                    (state, _) => state.as_str().to_owned(),
                };
                (link.name().to_owned(), state)
            })
            .collect()
    }
}

/// Every upstream of this process, kept up.
pub struct Upstreams {
    links: Vec<Arc<Link>>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.links.iter()).finish()
    }
}

impl Upstreams {
    /// Start every upstream: serve the tools each one listed last time
    /// (kept in the database), start its connection, and wait up to
    /// `first_wait` for the first attempts (ready or failed: an upstream
    /// that cannot be reached is a warning, never a refusal to start).
    pub async fn start(
        specs: Vec<UpstreamSpec>,
        catalog: Arc<ToolCatalog>,
        store: Store,
        first_wait: Duration,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let mut links = Vec::new();
        let mut tasks = Vec::new();
        let mut firsts = Vec::new();
        // With two upstreams or more, one can take a name from another:
        // subscribed before any starts, so no change is missed.
        let served_changed = (specs.len() > 1).then(|| catalog.changed());
        for spec in specs {
            crate::metrics::get().zero_upstream(&spec.name);
            let link = Arc::new(Link::new(spec));
            link.publish_kept(&catalog, &store).await;
            let (tx, rx) = tokio::sync::oneshot::channel();
            firsts.push(rx);
            tasks.push(tokio::spawn(link.clone().supervise(
                catalog.clone(),
                store.clone(),
                shutdown.clone(),
                tx,
            )));
            links.push(link);
        }
        if let Some(changed) = served_changed {
            tasks.push(tokio::spawn(keep_served_current(
                links.clone(),
                catalog.clone(),
                changed,
                store.clone(),
                shutdown.clone(),
            )));
        }
        let _ = tokio::time::timeout(first_wait, futures_util::future::join_all(firsts)).await;
        Self {
            links,
            shutdown,
            tasks,
        }
    }

    /// No upstreams.
    pub fn none() -> Self {
        Self {
            links: Vec::new(),
            shutdown: CancellationToken::new(),
            tasks: Vec::new(),
        }
    }

    /// Each upstream's connection.
    pub fn links(&self) -> &[Arc<Link>] {
        &self.links
    }

    /// How each one stands, for `/readyz`; None without upstreams.
    pub fn states(&self) -> Option<Arc<dyn UpstreamStates>> {
        (!self.links.is_empty())
            .then(|| Arc::new(LinkStates(self.links.clone())) as Arc<dyn UpstreamStates>)
    }

    /// Stop every connection (stdio servers are stopped with them).
    pub async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
