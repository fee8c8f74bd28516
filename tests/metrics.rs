//! Issue 17 (Operations): `/metrics`, `/readyz` and `taskbroker worker
//! --metrics-listen`, through the real binary over HTTP, on both drivers.
//! Scrapes are read with a Prometheus text parser (`prometheus-parse`) and
//! checked against the database.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Driver, Server, WorkerProc};
use serde_json::{Value, json};

/// One scrape: every sample, by metric name and labels.
struct Metrics(Vec<prometheus_parse::Sample>);

impl Metrics {
    async fn scrape(base: &str) -> Self {
        let response = reqwest::get(format!("{base}/metrics")).await.unwrap();
        assert_eq!(response.status(), 200);
        let text = response.text().await.unwrap();
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let parsed = prometheus_parse::Scrape::parse(lines).expect("a Prometheus text exposition");
        Self(parsed.samples)
    }

    /// The value of `metric` with exactly these labels (0 when absent).
    fn get(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(metric, labels).unwrap_or(0.0)
    }

    fn find(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                other => panic!("{metric}: not a number: {other:?}"),
            })
    }

    /// Every `(label value, value)` of `metric` by the label `key`.
    fn by(&self, metric: &str, key: &str) -> HashMap<String, f64> {
        self.0
            .iter()
            .filter(|s| s.metric == metric)
            .filter_map(|s| {
                let v = match &s.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => *v,
                    _ => return None,
                };
                Some((s.labels.get(key)?.to_owned(), v))
            })
            .collect()
    }
}

/// The entries of a [`Metrics::by`] map whose value is not 0.
fn nonzero(map: HashMap<String, f64>) -> HashMap<String, f64> {
    map.into_iter().filter(|(_, v)| *v != 0.0).collect()
}

fn base(server: &Server) -> String {
    server.url.trim_end_matches("/mcp").to_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_for_http(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while reqwest::get(url).await.is_err() {
        assert!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 17: after a known workload (N tasks completed and M failed by a
/// `taskbroker worker` process, K left queued by `serve --workers 0`), the
/// broker's and the worker's scrapes agree with the database: tasks created
/// and finished by tool and status, queue depth by tool, workers live.
async fn metrics_agree_with_the_database(driver: Driver) {
    const N: usize = 5;
    const M: usize = 3;
    const K: usize = 4;
    let server = Server::start_on(driver, &["--workers", "0"]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut worker = WorkerProc::start(&server, 1, &["--metrics-listen", &listen]);
    let worker_base = format!("http://{listen}");
    wait_for_http(&format!("{worker_base}/healthz")).await;

    let mut client = server.client().await;
    let mut ids = Vec::new();
    for _ in 0..N {
        ids.push(client.call_task("sleep", json!({ "seconds": 0 })).await["taskId"].clone());
    }
    for _ in 0..M {
        ids.push(client.call_task("fail", json!({})).await["taskId"].clone());
    }
    for id in &ids {
        client
            .wait_terminal(id.as_str().unwrap(), Duration::from_secs(30))
            .await;
    }

    let db = server.db_reader().await;
    let finished: Vec<(String, String, i64)> = db
        .all(
            "SELECT tool, status, count(*) FROM tasks
              WHERE status IN ('completed', 'failed', 'cancelled') GROUP BY tool, status",
            &[],
        )
        .await;
    assert_eq!(finished.len(), 2, "{finished:?}");
    let w = Metrics::scrape(&worker_base).await;
    for (tool, status, n) in &finished {
        assert_eq!(
            w.get(
                "taskbroker_tasks_finished_total",
                &[("tool", tool), ("status", status)]
            ),
            *n as f64,
            "worker: finished {tool} {status}"
        );
    }
    assert_eq!(
        w.get(
            "taskbroker_tasks_finished_total",
            &[("tool", "sleep"), ("status", "completed")]
        ),
        N as f64
    );
    assert_eq!(
        w.get(
            "taskbroker_tasks_finished_total",
            &[("tool", "fail"), ("status", "failed")]
        ),
        M as f64
    );
    assert_eq!(w.get("taskbroker_job_attempts_total", &[]), (N + M) as f64);
    assert_eq!(w.get("taskbroker_job_retries_total", &[]), 0.0);
    assert_eq!(
        w.get("taskbroker_job_run_seconds_count", &[("tool", "sleep")]),
        N as f64
    );
    assert_eq!(
        w.get("taskbroker_job_queue_seconds_count", &[("tool", "fail")]),
        M as f64
    );
    let live: i64 = db
        .scalar("SELECT count(*) FROM workers WHERE state = 'live'", &[])
        .await;
    assert_eq!(live, 1);
    assert_eq!(
        w.get("taskbroker_workers", &[("state", "live")]),
        live as f64
    );
    // The worker commits its completions in its own group commits.
    assert!(w.get("taskbroker_commit_batch_size_count", &[]) >= 1.0);

    // The worker goes; K more tasks stay queued.
    worker.term();
    let _ = worker.child.wait();
    for _ in 0..K {
        client.call_task("sleep", json!({ "seconds": 0 })).await;
    }

    let b = Metrics::scrape(&base(&server)).await;
    let created: Vec<(String, i64)> = db
        .all("SELECT tool, count(*) FROM tasks GROUP BY tool", &[])
        .await;
    let scraped = nonzero(b.by("taskbroker_tasks_created_total", "tool"));
    assert_eq!(scraped.len(), created.len(), "{scraped:?} vs {created:?}");
    for (tool, n) in &created {
        assert_eq!(scraped.get(tool), Some(&(*n as f64)), "created {tool}");
    }
    assert_eq!(scraped.get("sleep"), Some(&((N + K) as f64)));
    // This broker ran nothing: every finish was the worker's.
    let finished_here = b.by("taskbroker_tasks_finished_total", "tool");
    assert!(nonzero(finished_here).is_empty());

    let queued: Vec<(String, i64)> = db
        .all(
            "SELECT tool, count(*) FROM jobs WHERE state = 'queued' GROUP BY tool",
            &[],
        )
        .await;
    assert_eq!(queued, vec![("sleep".to_owned(), K as i64)]);
    assert_eq!(
        nonzero(b.by("taskbroker_queue_depth", "tool")),
        HashMap::from([("sleep".to_owned(), K as f64)])
    );
    assert_eq!(b.get("taskbroker_queue_depth", &[("tool", "fail")]), 0.0);
    let age = b.get("taskbroker_queue_oldest_age_seconds", &[("tool", "sleep")]);
    assert!((0.0..60.0).contains(&age), "oldest queued age {age}");
    let live: i64 = db
        .scalar("SELECT count(*) FROM workers WHERE state = 'live'", &[])
        .await;
    assert_eq!(live, 0, "the worker stopped");
    assert_eq!(b.get("taskbroker_workers", &[("state", "live")]), 0.0);
    assert_eq!(b.get("taskbroker_sessions_live", &[]), 1.0);
    assert!(b.get("taskbroker_database_size_bytes", &[]) > 0.0);
    assert!(
        b.get(
            "taskbroker_http_requests_total",
            &[("method", "POST"), ("path", "/mcp"), ("status", "200")]
        ) >= (N + M + K) as f64
    );
    assert_eq!(b.get("taskbroker_sse_streams_open", &[]), 0.0);
    assert_eq!(b.get("taskbroker_scrape_errors_total", &[]), 0.0);
    db.close().await;
}
both_drivers!(metrics_agree_with_the_database);

async fn readyz(base: &str) -> (u16, Value) {
    let response = reqwest::get(format!("{base}/readyz")).await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Issue 17: `/readyz` is 200 on a healthy broker, and 503 naming the
/// schema check once the database has a migration this build does not
/// know (as after a newer taskbroker migrated it); `/healthz` stays 200.
async fn readyz_names_a_schema_it_does_not_know(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let base = base(&server);
    let (status, body) = readyz(&base).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    assert_eq!(body["failed"], json!([]));

    let insert = "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
                  VALUES (9999, 'from_the_future', '2026-12-01T00:00:00Z', '0')";
    match driver {
        Driver::Sqlite => {
            let pool = sqlx::SqlitePool::connect_with(
                sqlx::sqlite::SqliteConnectOptions::new().filename(server.db()),
            )
            .await
            .unwrap();
            sqlx::query(insert).execute(&pool).await.unwrap();
            pool.close().await;
        }
        Driver::Postgres => {
            server.pg().unwrap().psql(insert).unwrap();
        }
    }
    let (status, body) = readyz(&base).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["failed"], json!(["schema"]), "{body}");
    assert!(
        body["checks"]["schema"]
            .as_str()
            .unwrap()
            .contains("version 9999"),
        "{body}"
    );
    let health = reqwest::get(format!("{base}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
}
both_drivers!(readyz_names_a_schema_it_does_not_know);

/// Issue 17: `/readyz` is 503 naming the database when the database is
/// gone (PostgreSQL: dropped under the broker, its connections ended).
#[tokio::test]
async fn readyz_is_503_when_the_database_is_gone() {
    if !common::pg::available() {
        return;
    }
    let server = Server::start_on(Driver::Postgres, &[]);
    let base = base(&server);
    assert_eq!(readyz(&base).await.0, 200);
    let url = &server.pg().unwrap().url;
    let name = url.rsplit('/').next().unwrap();
    let dropped = std::process::Command::new("psql")
        .arg(format!("{}/postgres", common::pg::server_url()))
        .args(["-v", "ON_ERROR_STOP=1", "-qc"])
        .arg(format!("DROP DATABASE {name} WITH (FORCE)"))
        .status()
        .unwrap();
    assert!(dropped.success());
    let (status, body) = readyz(&base).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["failed"]
            .as_array()
            .unwrap()
            .contains(&json!("database")),
        "{body}"
    );
    assert_ne!(body["checks"]["database"], "ok", "{body}");
    // The process is up all the same.
    let health = reqwest::get(format!("{base}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
}

/// The queue-depth query of `/metrics`, as in the drivers' `metrics.rs`.
const QUEUE_BY_TOOL: &str = "SELECT q.tool, q.depth, COALESCE(t.created_at, 0)
     FROM (SELECT tool, count(*) AS depth, min(task_seq) FILTER (WHERE run_after <= 0) AS oldest
             FROM jobs WHERE state = 'queued' GROUP BY tool) AS q
     LEFT JOIN tasks AS t ON t.seq = q.oldest";

/// Issue 17: the database gauges of a scrape read no table that grows with
/// the tasks in full: the queue is read through the partial index of
/// queued jobs (finished jobs are not in it) and one task row per tool by
/// its key. (The workers table, one row per pool ever started, is read
/// whole: it does not grow with tasks.)
async fn scrape_queries_use_indexes(driver: Driver) {
    let server = Server::start_on(driver, &["--workers", "0"]);
    match driver {
        Driver::Sqlite => {
            let pool = server.read_db().await;
            let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "EXPLAIN QUERY PLAN {QUEUE_BY_TOOL}"
            )))
            .fetch_all(&pool)
            .await
            .unwrap();
            let details: Vec<&str> = plan.iter().map(|r| r.3.as_str()).collect();
            eprintln!("{details:#?}");
            assert!(
                details
                    .iter()
                    .any(|d| d.contains("jobs USING COVERING INDEX jobs_queued")),
                "{details:?}"
            );
            assert!(
                !details
                    .iter()
                    .any(|d| *d == "SCAN jobs" || *d == "SCAN tasks" || *d == "SCAN t"),
                "a full table scan: {details:?}"
            );
            assert!(
                details
                    .iter()
                    .any(|d| d.starts_with("SEARCH t USING INTEGER PRIMARY KEY")),
                "{details:?}"
            );
            pool.close().await;
        }
        Driver::Postgres => {
            let pg = server.pg().unwrap();
            let plan = pg
                .psql(&format!(
                    "SET enable_seqscan = off; EXPLAIN {QUEUE_BY_TOOL}"
                ))
                .unwrap();
            eprintln!("{plan}");
            // An index (only) scan, or a bitmap scan that visits the heap
            // pages of queued rows only.
            assert!(
                plan.contains("using jobs_queued")
                    || plan.contains("Bitmap Index Scan on jobs_queued"),
                "{plan}"
            );
            assert!(plan.contains("using tasks_pkey on tasks"), "{plan}");
            assert!(!plan.contains("Seq Scan on jobs"), "{plan}");
            assert!(!plan.contains("Seq Scan on tasks"), "{plan}");
        }
    }
}
both_drivers!(scrape_queries_use_indexes);

/// Issue 17: a task the rescuer fails (its worker was killed with no
/// attempts left) counts in `tasks_finished{status="failed"}` under its
/// tool, as well as in `lease_expiries{outcome="failed"}`.
async fn issue17_rescued_failures_count_as_finished(driver: Driver) {
    let config = r#"
[[tool]]
name = "stuck"
description = "Sleeps a minute; one attempt only."
command = ["sleep", "60"]
task_support = "required"
max_attempts = 1
"#;
    let server = Server::start_with_config_on(driver, config, &["--workers", "0", "--lease", "1"]);
    let mut worker = WorkerProc::start(
        &server,
        1,
        &["--config", &server.config_path(), "--lease", "1"],
    );
    let mut client = server.client().await;
    let id = client.call_task("stuck", json!({})).await["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let task = client.ok("tasks/get", json!({ "taskId": id })).await;
        if task["statusMessage"] != "queued" {
            break;
        }
        assert!(Instant::now() < deadline, "never claimed: {task}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.kill9();
    let task = client.wait_terminal(&id, Duration::from_secs(30)).await;
    assert_eq!(task["status"], "failed", "{task}");
    let m = Metrics::scrape(&base(&server)).await;
    assert_eq!(
        m.get(
            "taskbroker_tasks_finished_total",
            &[("tool", "stuck"), ("status", "failed")]
        ),
        1.0
    );
    assert_eq!(
        m.get("taskbroker_lease_expiries_total", &[("outcome", "failed")]),
        1.0
    );
}
both_drivers!(issue17_rescued_failures_count_as_finished);

/// The metric names of README's metrics table (`taskbroker_...`).
fn readme_metric_families() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `taskbroker_"))
        .map(|rest| format!("taskbroker_{}", rest.split('`').next().unwrap()))
        .collect()
}

/// The sample lines of a family in a text exposition (a counter's
/// `_total`, a histogram's `_bucket`, `_sum` and `_count`).
fn samples_of<'a>(text: &'a str, family: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or("");
            name == family
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| name.strip_suffix(suffix) == Some(family))
        })
        .collect()
}

/// Issue item 5: a fresh broker's first `/metrics` lists every family
/// README documents (its HELP and TYPE) with samples (prometheus-client
/// leaves out a family with none): per tool that may run as a task, tasks
/// created, finished by status, queue depth, oldest queued age, queue and
/// run times, all 0; lease expiries by outcome, 0; workers by state; the
/// probe and scrape endpoints' requests, 0; the process-wide ones. The next
/// scrape counts the first.
async fn item5_a_fresh_broker_exports_every_documented_family(driver: Driver) {
    let server = Server::start_on(driver, &[]);
    let text = reqwest::get(format!("{}/metrics", base(&server)))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The upstream families have series only per configured upstream
    // (tests/upstreams.rs reads them).
    let families: Vec<String> = readme_metric_families()
        .into_iter()
        .filter(|f| !f.starts_with("taskbroker_upstream_"))
        .collect();
    assert!(families.len() >= 19, "{families:?}");
    let mut client = server.client().await;
    let tools: Vec<String> = client.ok("tools/list", json!({})).await["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["execution"]["taskSupport"]
                .as_str()
                .unwrap_or("forbidden")
                != "forbidden"
        })
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(tools.contains(&"sleep".to_owned()), "{tools:?}");
    assert!(!tools.contains(&"echo".to_owned()), "{tools:?}");
    for family in &families {
        let base_name = family.strip_suffix("_total").unwrap_or(family);
        assert!(
            text.contains(&format!("# TYPE {base_name} ")),
            "{family} is not listed:\n{text}"
        );
        let samples = samples_of(&text, family);
        assert!(!samples.is_empty(), "{family} has no sample:\n{text}");
        let per_tool = [
            "taskbroker_tasks_created_total",
            "taskbroker_tasks_finished_total",
            "taskbroker_queue_depth",
            "taskbroker_queue_oldest_age_seconds",
            "taskbroker_job_queue_seconds",
            "taskbroker_job_run_seconds",
        ];
        if per_tool.contains(&family.as_str()) {
            for tool in &tools {
                let label = format!("tool=\"{tool}\"");
                let of_tool: Vec<&&str> = samples.iter().filter(|l| l.contains(&label)).collect();
                assert!(!of_tool.is_empty(), "{family} has no {label}:\n{text}");
                for line in of_tool {
                    let value = line.rsplit(' ').next().unwrap();
                    if !line.contains("_bucket") {
                        assert_eq!(value.parse::<f64>().unwrap(), 0.0, "{line}");
                    }
                }
            }
        }
    }
    let m = Metrics::scrape(&base(&server)).await;
    for status in ["completed", "failed", "cancelled"] {
        assert_eq!(
            m.find(
                "taskbroker_tasks_finished_total",
                &[("tool", "sleep"), ("status", status)]
            ),
            Some(0.0),
            "{status}"
        );
    }
    for outcome in ["requeued", "failed", "closed"] {
        assert_eq!(
            m.find("taskbroker_lease_expiries_total", &[("outcome", outcome)]),
            Some(0.0),
            "{outcome}"
        );
    }
    for fate in ["deleted", "archived", "kept"] {
        assert_eq!(
            m.find("taskbroker_expired_tasks_total", &[("fate", fate)]),
            Some(0.0),
            "{fate}"
        );
    }
    assert!(
        text.contains(
            r#"taskbroker_http_requests_total{method="GET",path="/metrics",status="200"} 0"#
        ),
        "{text}"
    );
    assert_eq!(
        m.find(
            "taskbroker_http_requests_total",
            &[("method", "GET"), ("path", "/metrics"), ("status", "200")]
        ),
        Some(1.0),
        "the first scrape is counted"
    );
}
both_drivers!(item5_a_fresh_broker_exports_every_documented_family);
