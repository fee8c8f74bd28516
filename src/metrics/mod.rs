//! Prometheus metrics of one process (`GET /metrics`) and its readiness
//! (`GET /readyz`).
//!
//! The instruments are process-wide ([`get`]): the writer, the worker pool,
//! the rescuer and the HTTP layer count into them where things happen. The
//! gauges that describe the database (queue depth, workers, size) are read
//! from it when scraped, by a few cheap queries ([`MetricsStore`]), at most
//! once per scrape. Encoding is `prometheus-client`'s text exposition.
//!
//! [`MetricsStore`]: crate::store::MetricsStore

mod http;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{LazyLock, RwLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::clock::now_ms;
use crate::store::{PurgeReport, TaskStatus};

pub use http::{OpenStreams, Scrape, UpstreamStates, http_layer, routes, serve_worker_metrics};

/// Label set of the families: `(name, value)` pairs.
type Labels = Vec<(&'static str, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Every instrument of the process.
#[derive(Debug)]
pub struct Metrics {
    tasks_created: Family<Labels, Counter>,
    tasks_finished: Family<Labels, Counter>,
    queue_depth: Family<Labels, Gauge>,
    queue_oldest_age: Family<Labels, Gauge<f64, AtomicU64>>,
    queue_time: HistogramFamily,
    run_time: HistogramFamily,
    job_attempts: Counter,
    job_retries: Counter,
    lease_expiries: Family<Labels, Counter>,
    job_rescues: Counter,
    expired_tasks: Family<Labels, Counter>,
    workers: Family<Labels, Gauge>,
    http_requests: Family<Labels, Counter>,
    http_latency: HistogramFamily,
    sse_streams: Gauge,
    sessions_live: Gauge,
    batch_size: Histogram,
    commit_latency: Histogram,
    database_size: Gauge,
    scrape_errors: Counter,
    upstream_calls: Family<Labels, Counter>,
    upstream_latency: HistogramFamily,
    upstream_restarts: Family<Labels, Counter>,
    upstream_up: Family<Labels, Gauge>,
    /// When the writer's current commit started (ms), 0 when idle.
    commit_started_ms: AtomicI64,
    /// The tools this process serves: the per-tool database gauges show
    /// each of them, 0 when none of its jobs is queued.
    served_tools: RwLock<Vec<String>>,
}

/// The terminal statuses `tasks_finished` counts.
const FINISHED: [TaskStatus; 3] = [
    TaskStatus::Completed,
    TaskStatus::Failed,
    TaskStatus::Cancelled,
];

/// What becomes of a job whose lease expired (`lease_expiries`).
const LEASE_OUTCOMES: [&str; 3] = ["requeued", "failed", "closed"];

/// What the purge does with a task past its ttl (`expired_tasks`).
const EXPIRED_FATES: [&str; 3] = ["deleted", "archived", "kept"];

/// The answers of the probe and scrape endpoints every listener serves
/// (`method`, `path`, `status`): zero from the start, as Prometheus's own
/// client libraries do for their handler's codes.
const PROBE_ANSWERS: [(&str, &str, u16); 4] = [
    ("GET", "/metrics", 200),
    ("GET", "/healthz", 200),
    ("GET", "/readyz", 200),
    ("GET", "/readyz", 503),
];

fn seconds_histogram() -> Histogram {
    // 1 ms .. ~4.4 min.
    Histogram::new(exponential_buckets(0.001, 4.0, 10))
}

fn latency_histogram() -> Histogram {
    // 0.25 ms .. ~33 s.
    Histogram::new(exponential_buckets(0.000_25, 2.7, 13))
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    tasks_created: Family::default(),
    tasks_finished: Family::default(),
    queue_depth: Family::default(),
    queue_oldest_age: Family::default(),
    queue_time: Family::new_with_constructor(seconds_histogram),
    run_time: Family::new_with_constructor(seconds_histogram),
    job_attempts: Counter::default(),
    job_retries: Counter::default(),
    lease_expiries: Family::default(),
    job_rescues: Counter::default(),
    expired_tasks: Family::default(),
    workers: Family::default(),
    http_requests: Family::default(),
    http_latency: Family::new_with_constructor(latency_histogram),
    sse_streams: Gauge::default(),
    sessions_live: Gauge::default(),
    batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
    commit_latency: latency_histogram(),
    database_size: Gauge::default(),
    scrape_errors: Counter::default(),
    upstream_calls: Family::default(),
    upstream_latency: Family::new_with_constructor(seconds_histogram),
    upstream_restarts: Family::default(),
    upstream_up: Family::default(),
    commit_started_ms: AtomicI64::new(0),
    served_tools: RwLock::new(Vec::new()),
});

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let m = get();
    let mut r = Registry::with_prefix("taskbroker");
    r.register(
        "tasks_created",
        "Tasks created by this process, by tool",
        m.tasks_created.clone(),
    );
    r.register(
        "tasks_finished",
        "Tasks this process brought to a terminal status (completed, failed, cancelled), by tool and status",
        m.tasks_finished.clone(),
    );
    r.register(
        "queue_depth",
        "Jobs queued in the database (waiting for a worker or for their retry backoff), by tool; read at scrape",
        m.queue_depth.clone(),
    );
    r.register(
        "queue_oldest_age_seconds",
        "Age of the task of the oldest queued job that is due (not waiting for its start), by tool; read at scrape",
        m.queue_oldest_age.clone(),
    );
    r.register(
        "job_queue_seconds",
        "Time a job waited in the queue, from runnable (created, or requeued) to claimed by this process, by tool",
        m.queue_time.clone(),
    );
    r.register(
        "job_run_seconds",
        "Run time of the jobs this process ran to an outcome, from start to recorded outcome, by tool",
        m.run_time.clone(),
    );
    r.register(
        "job_attempts",
        "Job runs started by this process (each claim of a job is an attempt)",
        m.job_attempts.clone(),
    );
    r.register(
        "job_retries",
        "Job runs started by this process that were not the job's first attempt (its earlier worker was lost)",
        m.job_retries.clone(),
    );
    r.register(
        "lease_expiries",
        "Expired job leases this process took back, by what became of the job (requeued, failed: no attempts left, closed: task cancelled)",
        m.lease_expiries.clone(),
    );
    r.register(
        "expired_tasks",
        "Tasks past their ttl this process's purge handled, by what became of them (deleted, archived, kept: by a retention rule, until it is due)",
        m.expired_tasks.clone(),
    );
    r.register(
        "job_rescues",
        "Jobs this process rescued from a lost worker and queued again for another attempt",
        m.job_rescues.clone(),
    );
    r.register(
        "workers",
        "Worker pools on the database by state (live, stopping, dead); read at scrape",
        m.workers.clone(),
    );
    r.register(
        "http_requests",
        "HTTP requests answered by this process, by method, path and status",
        m.http_requests.clone(),
    );
    r.register(
        "http_request_duration_seconds",
        "Time from request to response head (an SSE body may stream longer), by method and path",
        m.http_latency.clone(),
    );
    r.register(
        "sse_streams_open",
        "SSE streams open on this process now",
        m.sse_streams.clone(),
    );
    r.register(
        "sessions_live",
        "Live MCP 2025-11-25 sessions on the database (neither ended nor expired); read at scrape",
        m.sessions_live.clone(),
    );
    r.register(
        "commit_batch_size",
        "Writes per group commit of this process's writer (creations, completions, claims in one transaction)",
        m.batch_size.clone(),
    );
    r.register(
        "commit_duration_seconds",
        "Time of one group commit of this process's writer (one transaction)",
        m.commit_latency.clone(),
    );
    r.register(
        "database_size_bytes",
        "Size of the database (SQLite: page_count * page_size of the main file; PostgreSQL: pg_database_size); read at scrape",
        m.database_size.clone(),
    );
    r.register(
        "scrape_errors",
        "Scrapes whose database reads failed (the database gauges then keep their last values)",
        m.scrape_errors.clone(),
    );
    r.register(
        "upstream_calls",
        "Calls this process made to upstream MCP servers, by upstream and outcome (ok, tool_error: a result with isError, error: no result)",
        m.upstream_calls.clone(),
    );
    r.register(
        "upstream_call_duration_seconds",
        "Time of the calls this process made to upstream MCP servers, waiting for a down upstream included, by upstream",
        m.upstream_latency.clone(),
    );
    r.register(
        "upstream_restarts",
        "Connections to upstream MCP servers this process started again after the last one ended (a stdio server's exit included), by upstream",
        m.upstream_restarts.clone(),
    );
    r.register(
        "upstream_up",
        "1 while this process's connection to the upstream MCP server is ready, else 0, by upstream",
        m.upstream_up.clone(),
    );
    r
});

/// The process's instruments.
pub fn get() -> &'static Metrics {
    &METRICS
}

fn tool(name: &str) -> Labels {
    vec![("tool", name.to_owned())]
}

/// `method` and `path`, and `status` for the request counter.
fn http_labels(method: &str, path: &str, status: Option<u16>) -> Labels {
    let mut labels = vec![("method", method.to_owned()), ("path", path.to_owned())];
    if let Some(status) = status {
        labels.push(("status", status.to_string()));
    }
    labels
}

fn tool_and_status(name: &str, status: &str) -> Labels {
    vec![("tool", name.to_owned()), ("status", status.to_owned())]
}

impl Metrics {
    /// Give every series whose labels are known before anything happens a
    /// zero sample, so that a fresh process already exports every family
    /// README documents (dashboards and alerts see 0, not nothing; an
    /// empty family is not exported at all): per tool that may run as a
    /// task, tasks created and finished by status, queue and run times,
    /// queue depth and age (see [`Metrics::served_tools`]); per outcome,
    /// lease expiries; the probe and scrape endpoints' requests. Called
    /// once per process with its tools.
    pub fn zero_known_series<'a>(&self, tools: impl IntoIterator<Item = &'a str>) {
        let mut served = self
            .served_tools
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for name in tools {
            let labels = tool(name);
            // get_or_create makes the series; its guard is not needed.
            drop(self.tasks_created.get_or_create(&labels));
            for status in FINISHED {
                drop(
                    self.tasks_finished
                        .get_or_create(&tool_and_status(name, status.as_str())),
                );
            }
            drop(self.queue_time.get_or_create(&labels));
            drop(self.run_time.get_or_create(&labels));
            if !served.iter().any(|t| t == name) {
                served.push(name.to_owned());
            }
        }
        for outcome in LEASE_OUTCOMES {
            drop(
                self.lease_expiries
                    .get_or_create(&vec![("outcome", outcome.to_owned())]),
            );
        }
        for fate in EXPIRED_FATES {
            drop(
                self.expired_tasks
                    .get_or_create(&vec![("fate", fate.to_owned())]),
            );
        }
        for (method, path, status) in PROBE_ANSWERS {
            drop(
                self.http_requests
                    .get_or_create(&http_labels(method, path, Some(status))),
            );
            drop(
                self.http_latency
                    .get_or_create(&http_labels(method, path, None)),
            );
        }
    }

    /// The tools this process serves (given to [`Metrics::zero_known_series`]).
    fn served_tools(&self) -> Vec<String> {
        self.served_tools
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Zero samples for the upstream `name`'s series, so they are exported
    /// before its first call.
    pub fn zero_upstream(&self, name: &str) {
        let labels = vec![("upstream", name.to_owned())];
        for outcome in ["ok", "tool_error", "error"] {
            drop(self.upstream_calls.get_or_create(&vec![
                ("upstream", name.to_owned()),
                ("outcome", outcome.to_owned()),
            ]));
        }
        drop(self.upstream_latency.get_or_create(&labels));
        drop(self.upstream_restarts.get_or_create(&labels));
        drop(self.upstream_up.get_or_create(&labels));
    }

    /// A call to the upstream `name` ended with `outcome` (ok, tool_error,
    /// error) after `took`.
    pub fn upstream_call(&self, name: &str, outcome: &str, took: Duration) {
        self.upstream_calls
            .get_or_create(&vec![
                ("upstream", name.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
            .inc();
        self.upstream_latency
            .get_or_create(&vec![("upstream", name.to_owned())])
            .observe(took.as_secs_f64());
    }

    /// The connection to the upstream `name` is ready (`up`) or not.
    pub fn upstream_up(&self, name: &str, up: bool) {
        self.upstream_up
            .get_or_create(&vec![("upstream", name.to_owned())])
            .set(i64::from(up));
    }

    /// The connection to the upstream `name` was started again.
    pub fn upstream_restarted(&self, name: &str) {
        self.upstream_restarts
            .get_or_create(&vec![("upstream", name.to_owned())])
            .inc();
    }

    /// A task was created (already terminal when its arguments were
    /// refused: `finished` is then its status too).
    pub fn task_created(&self, tool_name: &str, finished: Option<&str>) {
        self.tasks_created.get_or_create(&tool(tool_name)).inc();
        if let Some(status) = finished {
            self.task_finished(tool_name, status);
        }
    }

    /// A task reached `status` (completed, failed, cancelled) here.
    pub fn task_finished(&self, tool_name: &str, status: &str) {
        self.tasks_finished
            .get_or_create(&tool_and_status(tool_name, status))
            .inc();
    }

    /// A job of `tool_name` was claimed after waiting `waited_ms`.
    pub fn job_claimed(&self, tool_name: &str, waited_ms: i64) {
        self.queue_time
            .get_or_create(&tool(tool_name))
            .observe(waited_ms.max(0) as f64 / 1000.0);
    }

    /// A run started (`attempt` 1 for the first).
    pub fn job_started(&self, attempt: i64) {
        self.job_attempts.inc();
        if attempt > 1 {
            self.job_retries.inc();
        }
    }

    /// A run ended with its outcome recorded.
    pub fn job_ran(&self, tool_name: &str, took: Duration) {
        self.run_time
            .get_or_create(&tool(tool_name))
            .observe(took.as_secs_f64());
    }

    /// The rescuer took back expired leases.
    pub fn leases_expired(&self, requeued: u64, failed: u64, closed: u64) {
        for (outcome, n) in LEASE_OUTCOMES.into_iter().zip([requeued, failed, closed]) {
            if n > 0 {
                self.lease_expiries
                    .get_or_create(&vec![("outcome", outcome.to_owned())])
                    .inc_by(n);
            }
        }
        self.job_rescues.inc_by(requeued);
    }

    /// A purge pass deleted, archived and kept these many tasks past their
    /// ttl.
    pub fn tasks_expired(&self, report: &PurgeReport) {
        for (fate, n) in
            EXPIRED_FATES
                .into_iter()
                .zip([report.deleted, report.archived, report.kept])
        {
            if n > 0 {
                self.expired_tasks
                    .get_or_create(&vec![("fate", fate.to_owned())])
                    .inc_by(n);
            }
        }
    }

    /// The writer starts a commit of `writes` writes.
    pub fn commit_started(&self, writes: usize) {
        self.batch_size.observe(writes as f64);
        self.commit_started_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// The writer's transaction is over, after `took`.
    pub fn commit_done(&self, took: Duration) {
        self.commit_latency.observe(took.as_secs_f64());
    }

    /// The writer is done with the batch (answers and hand-off too).
    pub fn writer_idle(&self) {
        self.commit_started_ms.store(0, Ordering::Relaxed);
    }

    /// How long the writer has been busy with one commit, if it is.
    pub fn writer_busy_for(&self) -> Option<Duration> {
        let started = self.commit_started_ms.load(Ordering::Relaxed);
        (started > 0).then(|| Duration::from_millis(now_ms().saturating_sub(started).max(0) as u64))
    }

    fn http_request(&self, method: &str, path: &'static str, status: u16, took: Duration) {
        self.http_requests
            .get_or_create(&http_labels(method, path, Some(status)))
            .inc();
        self.http_latency
            .get_or_create(&http_labels(method, path, None))
            .observe(took.as_secs_f64());
    }
}

/// The text exposition of every instrument.
pub fn encode() -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &REGISTRY);
    out
}
