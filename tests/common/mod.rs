//! Helpers for end-to-end tests: start the real `taskbroker` binary on a free
//! port with a temporary database, and speak MCP over HTTP to it.
#![allow(dead_code, clippy::unwrap_used)]

pub mod pg;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

/// The storage driver a test server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// A temporary SQLite file, `<dir>/broker.db`.
    Sqlite,
    /// A fresh database of its own on the local PostgreSQL server
    /// ([`pg::PgDb`]).
    Postgres,
}

/// A server's database: the SQLite file in its directory, or a PostgreSQL
/// database kept alive (dropped with its last server) by the servers on it.
#[derive(Clone)]
pub enum Db {
    Sqlite,
    Postgres(Arc<pg::PgDb>),
}

/// Make two tests of an `async fn name(driver: Driver)` test body:
/// `name::sqlite` and `name::postgres`, the PostgreSQL one skipped (one
/// line on stderr, see [`pg::available`]) where no PostgreSQL server
/// answers. Arguments after `;` go to `#[tokio::test(...)]`.
///
/// ```ignore
/// /// Covers T-1.
/// async fn t1_something(driver: Driver) {
///     let server = Server::start_on(driver, &[]);
/// }
/// both_drivers!(t1_something);
/// both_drivers!(t2_busy; flavor = "multi_thread", worker_threads = 2);
/// ```
#[macro_export]
macro_rules! both_drivers {
    ($name:ident $(; $($test:tt)*)?) => {
        mod $name {
            #[tokio::test$(($($test)*))?]
            async fn sqlite() {
                super::$name($crate::common::Driver::Sqlite).await
            }

            #[tokio::test$(($($test)*))?]
            async fn postgres() {
                if !$crate::common::pg::available() {
                    return;
                }
                super::$name($crate::common::Driver::Postgres).await
            }
        }
    };
}

/// A running broker process. Killed (SIGKILL) when dropped; its temporary
/// directory (database and log) is kept when the test fails.
pub struct Server {
    child: Option<Child>,
    pub url: String,
    pub dir: PathBuf,
    keep: Option<tempfile::TempDir>,
    args: Vec<String>,
    /// Environment variables added to the broker's (every start).
    env: Vec<(String, String)>,
    // Dropped after the process is killed (see Drop).
    database: Db,
}

impl Server {
    /// Start `taskbroker serve` with a fresh SQLite database and `extra`
    /// flags.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_on(Driver::Sqlite, extra)
    }

    /// Start `taskbroker serve` with a fresh database of `driver` and
    /// `extra` flags. Panics for PostgreSQL where no server answers: check
    /// [`pg::available`] first (as [`both_drivers!`] does).
    pub fn start_on(driver: Driver, extra: &[&str]) -> Self {
        let (keep, path) = temp_dir();
        Self::start_in(Some(keep), path, Db::fresh(driver), extra)
    }

    /// Start another `taskbroker serve` on the database of `other` (a
    /// directory and log of its own), with `extra` flags.
    pub fn start_sharing(other: &Server, extra: &[&str]) -> Self {
        Self::start_sharing_env(other, extra, &[])
    }

    /// [`Server::start_sharing`], with `env` added to the broker's
    /// environment.
    pub fn start_sharing_env(other: &Server, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let (keep, path) = temp_dir();
        assert!(
            matches!(other.database, Db::Postgres(_)),
            "only a PostgreSQL database is shared between servers here"
        );
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::start_in_env(Some(keep), path, other.database.clone(), extra, env)
    }

    fn start_in(
        keep: Option<tempfile::TempDir>,
        dir: PathBuf,
        database: Db,
        extra: &[&str],
    ) -> Self {
        Self::start_in_env(keep, dir, database, extra, Vec::new())
    }

    fn start_in_env(
        keep: Option<tempfile::TempDir>,
        dir: PathBuf,
        database: Db,
        extra: &[&str],
        env: Vec<(String, String)>,
    ) -> Self {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let db_arg = database.arg(&dir);
        let (child, url) = spawn(&dir, &db_arg, &args, &env);
        Self {
            child: Some(child),
            url,
            dir,
            keep,
            args,
            env,
            database,
        }
    }

    /// The SQLite database file (panics on PostgreSQL: see [`Self::db_arg`]).
    pub fn db(&self) -> PathBuf {
        assert!(
            self.driver() == Driver::Sqlite,
            "Server::db() is the SQLite file; this server runs on PostgreSQL (use db_arg())"
        );
        self.dir.join("broker.db")
    }

    /// The broker's process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the broker runs").id()
    }

    /// What `--db` takes for this server's database: the SQLite file's path
    /// or the PostgreSQL URL.
    pub fn db_arg(&self) -> String {
        self.database.arg(&self.dir)
    }

    /// The driver this server runs on.
    pub fn driver(&self) -> Driver {
        match self.database {
            Db::Sqlite => Driver::Sqlite,
            Db::Postgres(_) => Driver::Postgres,
        }
    }

    /// The PostgreSQL database, on that driver (to run `psql`).
    pub fn pg(&self) -> Option<&pg::PgDb> {
        match &self.database {
            Db::Sqlite => None,
            Db::Postgres(pg) => Some(pg),
        }
    }

    /// kill -9 the server, then start it again on the same database and
    /// port, with the same flags.
    pub fn kill_and_restart(&mut self) {
        self.kill9();
        let port = self
            .url
            .rsplit(':')
            .next()
            .unwrap()
            .trim_end_matches("/mcp")
            .to_owned();
        let mut args = self.args.clone();
        args.push("--listen".into());
        args.push(format!("127.0.0.1:{port}"));
        let db_arg = self.db_arg();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // The old socket may linger for a moment after SIGKILL.
            match try_spawn(&self.dir, &db_arg, &args, &self.env) {
                Ok((child, url)) => {
                    self.child = Some(child);
                    self.url = url;
                    return;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("restart retry: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("restart failed: {e}"),
            }
        }
    }

    /// SIGKILL, no goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The broker's process, to signal it or wait for it.
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the broker is running")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Wait until the server's log holds `needle` (the broker writes it at
    /// the machine's pace) and return the log then; fail after `timeout`.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "{needle:?} not in the log after {timeout:?}: {log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A client with an initialized session.
    pub async fn client(&self) -> Client {
        let mut c = Client::new(&self.url);
        c.initialize().await;
        c
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking()
            && let Some(dir) = self.keep.take()
        {
            let kept = dir.keep();
            eprintln!("test failed: broker files kept in {}", kept.display());
        }
    }
}

fn temp_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("taskbroker-test-")
        .tempdir()
        .expect("tempdir");
    let path = dir.path().to_path_buf();
    (dir, path)
}

impl Db {
    /// A fresh database of `driver`.
    pub fn fresh(driver: Driver) -> Self {
        match driver {
            Driver::Sqlite => Db::Sqlite,
            Driver::Postgres => Db::Postgres(Arc::new(
                pg::PgDb::create().expect("PostgreSQL is not available here"),
            )),
        }
    }

    /// What `--db` takes, for a server whose directory is `dir`.
    pub fn arg(&self, dir: &Path) -> String {
        match self {
            Db::Sqlite => dir.join("broker.db").display().to_string(),
            Db::Postgres(pg) => pg.url.clone(),
        }
    }
}

fn spawn(dir: &Path, db_arg: &str, args: &[String], env: &[(String, String)]) -> (Child, String) {
    let mut args = args.to_vec();
    if !args.iter().any(|a| a == "--listen") {
        args.push("--listen".into());
        args.push("127.0.0.1:0".into());
    }
    try_spawn(dir, db_arg, &args, env).expect("broker did not start")
}

fn try_spawn(
    dir: &Path,
    db_arg: &str,
    args: &[String],
    env: &[(String, String)],
) -> Result<(Child, String), String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .map_err(|e| e.to_string())?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .arg("serve")
        .arg("--db")
        .arg(db_arg)
        .args(args)
        .env("RUST_LOG", "info,sqlx=warn")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut reader = BufReader::new(stdout);
        let _ = reader.read_line(&mut line);
        let _ = tx.send(line);
        // Keep draining so the child never blocks on a full pipe.
        let mut sink = String::new();
        while reader.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(line) if line.starts_with("taskbroker listening on ") => {
            let url = line
                .trim()
                .trim_start_matches("taskbroker listening on ")
                .to_owned();
            Ok((child, url))
        }
        other => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!("unexpected first line: {other:?}"))
        }
    }
}

/// A raw HTTP answer.
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Raw {
    /// The body as JSON (panics with the body when it is not). For HTTP
    /// refusals and answers that are JSON by rule; a POST that the broker
    /// may answer either way is read with [`Raw::messages`] or
    /// [`Raw::response`].
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// Whether the answer is an SSE stream.
    pub fn is_sse(&self) -> bool {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"))
    }

    /// Every JSON-RPC message of the answer, in order: the JSON body, or
    /// the data of each event of an SSE stream (Streamable HTTP lets the
    /// server answer a POST either way, e.g. SSE for `tasks/result` of a
    /// task not yet done, or for a call whose tool says something first).
    #[track_caller]
    pub fn messages(&self) -> Vec<Value> {
        if !self.is_sse() {
            return vec![self.json()];
        }
        parse_sse(&self.body)
            .into_iter()
            .filter(|e| !e.data.trim().is_empty())
            .map(|e| {
                serde_json::from_str(&e.data)
                    .unwrap_or_else(|err| panic!("SSE data not JSON ({err}): {}", e.data))
            })
            .collect()
    }

    /// The JSON-RPC response of the answer, JSON or SSE: the one message
    /// with a result or an error (not a notification, nor a request to the
    /// client). Panics when there is none, or more than one.
    #[track_caller]
    pub fn response(&self) -> Value {
        let mut responses: Vec<Value> = self
            .messages()
            .into_iter()
            .filter(|m| {
                m.get("method").is_none() && (m.get("result").is_some() || m.get("error").is_some())
            })
            .collect();
        assert_eq!(responses.len(), 1, "one response wanted: {}", self.body);
        responses.pop().unwrap()
    }

    /// [`Raw::response`], which must answer the request `id`.
    #[track_caller]
    pub fn response_to(&self, id: &Value) -> Value {
        let response = self.response();
        assert_eq!(&response["id"], id, "response id matches request id");
        response
    }
}

/// An MCP client over reqwest.
pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
    pub session: Option<String>,
    pub protocol_version: String,
    /// A bearer token, sent as `Authorization: Bearer <token>` (H-13).
    pub token: Option<String>,
    next_id: i64,
}

impl Client {
    pub fn new(url: &str) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            url: url.to_owned(),
            session: None,
            protocol_version: "2025-11-25".into(),
            token: None,
            next_id: 1,
        }
    }

    /// Point at a restarted server: new connections, same session.
    pub fn reconnect(&mut self, url: &str) {
        let session = self.session.take();
        let token = self.token.take();
        let next_id = self.next_id;
        *self = Self::new(url);
        self.session = session;
        self.token = token;
        self.next_id = next_id;
    }

    pub fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert(
            "accept",
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(s) = &self.session {
            h.insert("mcp-session-id", HeaderValue::from_str(s).unwrap());
            h.insert(
                "mcp-protocol-version",
                HeaderValue::from_str(&self.protocol_version).unwrap(),
            );
        }
        if let Some(t) = &self.token {
            h.insert(
                "authorization",
                HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
            );
        }
        h
    }

    /// POST a raw body with the given headers.
    pub async fn post_raw(&self, headers: HeaderMap, body: impl Into<reqwest::Body>) -> Raw {
        let r = self
            .http
            .post(&self.url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .expect("POST failed");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.text().await.unwrap_or_default();
        Raw {
            status,
            headers,
            body,
        }
    }

    /// initialize + notifications/initialized; returns the initialize result.
    pub async fn initialize(&mut self) -> Value {
        let body = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": { "name": "taskbroker-tests", "version": "0" }
            }
        });
        let raw = self.post_raw(self.headers(), body.to_string()).await;
        assert_eq!(raw.status, 200, "initialize: {}", raw.body);
        let session = raw
            .headers
            .get("mcp-session-id")
            .expect("initialize sets Mcp-Session-Id")
            .to_str()
            .unwrap()
            .to_owned();
        self.session = Some(session);
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let ack = self.post_raw(self.headers(), note.to_string()).await;
        assert_eq!(ack.status, 202, "initialized notification: {}", ack.body);
        raw.json()["result"].clone()
    }

    /// Send a request; return every JSON-RPC message of the answer (one for a
    /// JSON answer, notifications then the response for SSE).
    pub async fn request_messages(&mut self, method: &str, params: Value) -> Vec<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let raw = self.post_raw(self.headers(), body.to_string()).await;
        assert_eq!(
            raw.status, 200,
            "{method}: HTTP {} {}",
            raw.status, raw.body
        );
        // JSON or SSE: the response ends the stream.
        let messages = raw.messages();
        let last = messages.last().expect("an answer");
        assert_eq!(
            last,
            &raw.response_to(&json!(id)),
            "the response comes last"
        );
        messages
    }

    /// Send a request; return the whole response message (result or error).
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.request_messages(method, params).await.pop().unwrap()
    }

    /// Send a request that must succeed; return its result.
    pub async fn ok(&mut self, method: &str, params: Value) -> Value {
        let msg = self.request(method, params).await;
        assert!(msg.get("error").is_none(), "{method} failed: {msg}");
        msg["result"].clone()
    }

    /// Send a request that must fail; return its error object.
    pub async fn err(&mut self, method: &str, params: Value) -> Value {
        let msg = self.request(method, params).await;
        assert!(msg.get("result").is_none(), "{method} should fail: {msg}");
        msg["error"].clone()
    }

    /// tools/call as a task; returns the Task.
    pub async fn call_task(&mut self, tool: &str, arguments: Value) -> Value {
        let r = self
            .ok(
                "tools/call",
                json!({ "name": tool, "arguments": arguments, "task": {} }),
            )
            .await;
        r["task"].clone()
    }

    /// Poll tasks/get until the task is terminal (or `timeout`).
    pub async fn wait_terminal(&mut self, task_id: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let task = self.ok("tasks/get", json!({ "taskId": task_id })).await;
            let status = task["status"].as_str().unwrap_or_default().to_owned();
            if matches!(status.as_str(), "completed" | "failed" | "cancelled") {
                return task;
            }
            assert!(
                Instant::now() < deadline,
                "task {task_id} still {status} after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One SSE event.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
    pub has_data_field: bool,
}

/// Parse an SSE body into events (comments skipped).
pub fn parse_sse(body: &str) -> Vec<SseEvent> {
    let mut events = Vec::new();
    let mut current = SseEvent::default();
    let mut touched = false;
    for line in body.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if touched {
                events.push(std::mem::take(&mut current));
                touched = false;
            }
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        touched = true;
        match field {
            "id" => current.id = Some(value.to_owned()),
            "event" => current.event = Some(value.to_owned()),
            "data" => {
                if current.has_data_field {
                    current.data.push('\n');
                }
                current.data.push_str(value);
                current.has_data_field = true;
            }
            _ => {}
        }
    }
    if touched {
        events.push(current);
    }
    events
}

/// Seconds since the epoch of an RFC 3339 timestamp, for ordering checks.
pub fn parse_time_ms(s: &str) -> i128 {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("bad timestamp {s}: {e}"));
    t.unix_timestamp_nanos() / 1_000_000
}

/// Reads SSE events from a live response, one at a time.
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (comments skipped); None when the server closed the
    /// stream.
    pub async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse_sse(&block).into_iter().next() {
                    return Some(event);
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.response.chunk())
                .await
                .expect("no SSE data within 30 s")
                .expect("SSE read failed")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// The next event that carries a JSON message.
    pub async fn next_message(&mut self) -> Option<(SseEvent, Value)> {
        loop {
            let event = self.next_event().await?;
            if !event.data.trim().is_empty() {
                let v = serde_json::from_str(&event.data).expect("SSE data is JSON");
                return Some((event, v));
            }
        }
    }
}

impl Client {
    /// POST a request and return the raw streaming response.
    pub async fn post_stream(&mut self, method: &str, params: Value) -> (i64, reqwest::Response) {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let r = self
            .http
            .post(&self.url)
            .headers(self.headers())
            .body(body.to_string())
            .send()
            .await
            .expect("POST failed");
        (id, r)
    }

    /// initialize with the given client capabilities.
    pub async fn initialize_with(&mut self, capabilities: Value) -> Value {
        let body = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": capabilities,
                "clientInfo": { "name": "taskbroker-tests", "version": "0" }
            }
        });
        let raw = self.post_raw(self.headers(), body.to_string()).await;
        assert_eq!(raw.status, 200, "initialize: {}", raw.body);
        self.session = Some(raw.headers["mcp-session-id"].to_str().unwrap().to_owned());
        raw.json()["result"].clone()
    }
}

/// A `taskbroker worker` process on a server's database. SIGKILLed when
/// dropped.
pub struct WorkerProc {
    pub child: Child,
    pub log: PathBuf,
}

impl WorkerProc {
    /// Start `taskbroker worker --db <server db>` with `extra` flags; its
    /// log goes to `<server dir>/worker-<n>.log`. On either driver.
    pub fn start(server: &Server, n: usize, extra: &[&str]) -> Self {
        Self::start_logging(server, n, extra, "info,sqlx=warn")
    }

    /// [`WorkerProc::start`] with `RUST_LOG=<filter>` (say, the sqlx
    /// statement log, to count statements).
    pub fn start_logging(server: &Server, n: usize, extra: &[&str], filter: &str) -> Self {
        let log = server.dir.join(format!("worker-{n}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
            .arg("worker")
            .arg("--db")
            .arg(server.db_arg())
            .args(extra)
            .env("RUST_LOG", filter)
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("worker starts");
        Self { child, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (graceful stop); does not wait.
    pub fn term(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl Server {
    /// Start a server whose config file (written into its directory) holds
    /// `config`; `extra` flags as in [`Server::start`].
    pub fn start_with_config(config: &str, extra: &[&str]) -> Self {
        Self::start_with_config_on(Driver::Sqlite, config, extra)
    }

    /// [`Server::start_with_config`] on `driver`.
    pub fn start_with_config_on(driver: Driver, config: &str, extra: &[&str]) -> Self {
        let (dir, path) = temp_dir();
        let config = config.replace("@DIR@", &path.display().to_string());
        std::fs::write(path.join("taskbroker.toml"), config).unwrap();
        let cfg = path.join("taskbroker.toml").display().to_string();
        let mut args: Vec<&str> = vec!["--config", &cfg];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::start_in(Some(dir), path, Db::fresh(driver), &refs)
    }

    /// [`Server::start_with_config_on`], with `env` added to the broker's
    /// environment (on every start).
    pub fn start_with_config_on_env(
        driver: Driver,
        config: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let (dir, path) = temp_dir();
        std::fs::write(path.join("taskbroker.toml"), config).unwrap();
        let cfg = path.join("taskbroker.toml").display().to_string();
        let mut args: Vec<&str> = vec!["--config", &cfg];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::start_in_env(Some(dir), path, Db::fresh(driver), &refs, env)
    }

    /// The config file written by [`Server::start_with_config`].
    pub fn config_path(&self) -> String {
        self.dir.join("taskbroker.toml").display().to_string()
    }

    /// A read-only pool on the database, on either driver, as an
    /// operator's sqlite3 or psql would be.
    pub async fn db_reader(&self) -> DbReader {
        match &self.database {
            Db::Sqlite => DbReader::Sqlite(self.read_db().await),
            Db::Postgres(pg) => {
                let options: sqlx::postgres::PgConnectOptions =
                    pg.url.parse().expect("a PostgreSQL URL");
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .connect_with(options.options([("default_transaction_read_only", "on")]))
                    .await
                    .expect("connect to the PostgreSQL database");
                DbReader::Postgres(pool)
            }
        }
    }

    /// A read-only pool on the SQLite database, as an operator's sqlite3
    /// would be (SQLite only: see [`Self::db_reader`] for both drivers).
    pub async fn read_db(&self) -> sqlx::SqlitePool {
        sqlx::SqlitePool::connect_with(
            sqlx::sqlite::SqliteConnectOptions::new()
                .filename(self.db())
                .read_only(true),
        )
        .await
        .expect("open database read-only")
    }
}

/// Whether a process is alive (and not a zombie).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

impl Server {
    /// Start a server with a fresh database of its own on `port` (e.g. the
    /// port of a server just killed: a new database behind the same URL),
    /// retrying while the old socket lingers.
    pub fn start_fresh_on(port: u16, extra: &[&str]) -> Self {
        let (dir, path) = temp_dir();
        let db_arg = Db::Sqlite.arg(&path);
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.push("--listen".into());
        args.push(format!("127.0.0.1:{port}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match try_spawn(&path, &db_arg, &args, &[]) {
                Ok((child, url)) => {
                    return Self {
                        child: Some(child),
                        url,
                        dir: path,
                        keep: Some(dir),
                        args,
                        env: Vec::new(),
                        database: Db::Sqlite,
                    };
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("start retry: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("start on port {port} failed: {e}"),
            }
        }
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches("/mcp").parse().ok())
            .expect("a port in the URL")
    }
}

/// A value bound to a `$n` parameter of a [`DbReader`] query.
#[derive(Debug, Clone)]
pub enum Arg {
    Text(String),
    Int(i64),
}

impl From<&str> for Arg {
    fn from(s: &str) -> Self {
        Arg::Text(s.to_owned())
    }
}

impl From<String> for Arg {
    fn from(s: String) -> Self {
        Arg::Text(s)
    }
}

impl From<&String> for Arg {
    fn from(s: &String) -> Self {
        Arg::Text(s.clone())
    }
}

impl From<i64> for Arg {
    fn from(n: i64) -> Self {
        Arg::Int(n)
    }
}

impl From<i32> for Arg {
    fn from(n: i32) -> Self {
        Arg::Int(n.into())
    }
}

/// A read-only pool on a server's database, on either driver
/// ([`Server::db_reader`]). Queries are plain SQL both databases accept,
/// with `$1`, `$2`, ... parameters (SQLite reads `$n` as the n-th
/// argument too); rows decode into tuples.
#[derive(Clone)]
pub enum DbReader {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

/// A row type both drivers decode (tuples of i64, String, Option<_>, ...).
pub trait Row:
    for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
    + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
    + Send
    + Unpin
{
}

impl<T> Row for T where
    T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
        + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
        + Send
        + Unpin
{
}

/// `query_as` on the pool of either driver, with `args` bound in order,
/// then `$fetch` (fetch_all, fetch_one, fetch_optional).
macro_rules! reader_query {
    ($reader:expr, $sql:expr, $args:expr, $fetch:ident) => {
        match $reader {
            DbReader::Sqlite(pool) => {
                let mut q = sqlx::query_as(sqlx::AssertSqlSafe($sql.to_owned()));
                for a in $args {
                    q = match a {
                        Arg::Text(s) => q.bind(s.clone()),
                        Arg::Int(n) => q.bind(*n),
                    };
                }
                q.$fetch(pool).await
            }
            DbReader::Postgres(pool) => {
                let mut q = sqlx::query_as(sqlx::AssertSqlSafe($sql.to_owned()));
                for a in $args {
                    q = match a {
                        Arg::Text(s) => q.bind(s.clone()),
                        Arg::Int(n) => q.bind(*n),
                    };
                }
                q.$fetch(pool).await
            }
        }
        .unwrap_or_else(|e| panic!("{}: {e}", $sql))
    };
}

impl DbReader {
    /// Every row.
    pub async fn all<T: Row>(&self, sql: &str, args: &[Arg]) -> Vec<T> {
        reader_query!(self, sql, args, fetch_all)
    }

    /// The one row (panics without one).
    pub async fn one<T: Row>(&self, sql: &str, args: &[Arg]) -> T {
        reader_query!(self, sql, args, fetch_one)
    }

    /// The row, if any.
    pub async fn optional<T: Row>(&self, sql: &str, args: &[Arg]) -> Option<T> {
        reader_query!(self, sql, args, fetch_optional)
    }

    /// The first column of the one row.
    pub async fn scalar<T>(&self, sql: &str, args: &[Arg]) -> T
    where
        (T,): Row,
    {
        self.one::<(T,)>(sql, args).await.0
    }

    /// The first column of every row.
    pub async fn scalars<T>(&self, sql: &str, args: &[Arg]) -> Vec<T>
    where
        (T,): Row,
    {
        self.all::<(T,)>(sql, args)
            .await
            .into_iter()
            .map(|(v,)| v)
            .collect()
    }

    /// The first column of the row, if any.
    pub async fn scalar_optional<T>(&self, sql: &str, args: &[Arg]) -> Option<T>
    where
        (T,): Row,
    {
        self.optional::<(T,)>(sql, args).await.map(|(v,)| v)
    }

    pub async fn close(&self) {
        match self {
            DbReader::Sqlite(pool) => pool.close().await,
            DbReader::Postgres(pool) => pool.close().await,
        }
    }
}

/// `taskbroker token create --principal <principal> [extra]` on the
/// server's database: the token (the last stdout line).
pub fn create_token(server: &Server, principal: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_taskbroker"))
        .args(["token", "create", "--principal", principal])
        .args(extra)
        .arg("--db")
        .arg(server.db_arg())
        .env_remove("TASKBROKER_DB")
        .env("RUST_LOG", "warn")
        .output()
        .expect("taskbroker token runs");
    assert!(
        out.status.success(),
        "token create failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let token = text.lines().last().expect("a line").trim().to_owned();
    assert!(token.starts_with("tbk_"), "last stdout line: {text:?}");
    token
}

// Upstream MCP servers -------------------------------------------------------

/// `dist/index.js` of server-everything, or why the tests cannot run.
pub fn server_everything() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/upstream/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let why = if !node {
        "no node on PATH"
    } else if !script.exists() {
        "tests/upstream/node_modules is missing (run npm ci in tests/upstream)"
    } else {
        return Some(script);
    };
    if std::env::var_os("TASKBROKER_REQUIRE_UPSTREAMS").is_some() {
        panic!("upstream servers are required (TASKBROKER_REQUIRE_UPSTREAMS) but {why}");
    }
    eprintln!("skipping the upstream test: {why}");
    None
}

/// A `[[upstream]]` for server-everything over stdio named `name`, its
/// tools served with `prefix`, and `more` lines of settings.
pub fn everything_section(script: &Path, name: &str, prefix: Option<&str>, more: &str) -> String {
    let prefix = prefix
        .map(|p| format!("prefix = \"{p}\"\n"))
        .unwrap_or_default();
    format!(
        "[[upstream]]\nname = \"{name}\"\ncommand = [\"node\", \"{}\", \"stdio\"]\n{prefix}{more}\n",
        script.display()
    )
}

/// server-everything over Streamable HTTP on a free loopback port, as its
/// users start it (`node dist/index.js streamableHttp`, `PORT`); killed
/// when dropped.
pub struct EverythingHttp {
    child: Child,
    /// Its MCP endpoint.
    pub url: String,
}

impl EverythingHttp {
    /// Start it and wait until it listens.
    pub fn start(script: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new("node")
            .arg(script)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains("listening on port") => break,
                Some(Ok(_)) => {}
                _ => panic!("server-everything (HTTP) did not start"),
            }
        }
        // Keep reading, so that the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for EverythingHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The MCP 2026-07-28 server of tests/interop/python2/upstream_server.py
/// (FastMCP 4.1 on the Python SDK 2.3, with the tasks extension) over
/// Streamable HTTP on a free loopback port, started with the venv that
/// `python3 -m venv .cache/venv-interop2 && pip install -r
/// tests/interop/python2/requirements.txt` makes (CI and `scripts/interop`
/// make it); killed when dropped. `RUN_LOG` and `STEP_LOG` are files in
/// `dir` the server appends to (see the script).
pub struct Python2026 {
    child: Child,
    /// Its MCP endpoint.
    pub url: String,
    /// One line per run of its `long_task`.
    pub run_log: PathBuf,
    /// One line per step of its `slow`.
    pub step_log: PathBuf,
}

impl Python2026 {
    /// Start it and wait until it accepts connections; None (the test is
    /// skipped, one line on stderr) without the venv, unless
    /// `TASKBROKER_REQUIRE_UPSTREAMS` is set.
    pub fn start(dir: &Path) -> Option<Self> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = root.join(".cache/venv-interop2/bin/python");
        let script = root.join("tests/interop/python2/upstream_server.py");
        if !python.exists() {
            let why = "no .cache/venv-interop2 (python3 -m venv .cache/venv-interop2, then pip install -r tests/interop/python2/requirements.txt)";
            if std::env::var_os("TASKBROKER_REQUIRE_UPSTREAMS").is_some() {
                panic!("upstream servers are required (TASKBROKER_REQUIRE_UPSTREAMS) but {why}");
            }
            eprintln!("skipping the upstream test: {why}");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let run_log = dir.join("runs.log");
        let step_log = dir.join("steps.log");
        let child = Command::new(&python)
            .arg(&script)
            .arg(port.to_string())
            .env("RUN_LOG", &run_log)
            .env("STEP_LOG", &step_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the Python 2026 server did not listen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            run_log,
            step_log,
        })
    }

    /// The lines of one of its logs (none when it does not exist yet).
    pub fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Python2026 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
