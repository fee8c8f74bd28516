//! An MCP session with one upstream server, on a stdio or HTTP
//! connection: the start (the 2025-11-25 handshake, or 2026-07-28's
//! `server/discover`, whose differences live in `stateless.rs`), what the
//! server declared, `tools/list`, tool calls, cancellation and the
//! server's own tasks.
//!
//! What the server says during a call reaches that call's [`CallHandler`]:
//! - `notifications/progress`, by the call's own `progressToken`;
//! - `elicitation/create` and `sampling/createMessage` (requests): to the
//!   call following the task named by the related-task `_meta` when the
//!   request carries one, else to the only open call; with no open call,
//!   or several and no way to tell, the request is refused (-32603, and a
//!   warning in the log says why). The handler answers when it likes (a
//!   person may take minutes); the answer goes back with the request's id
//!   exactly as received. A `notifications/cancelled` from the server for
//!   that request withdraws it ([`ServerRequest::withdrawn`]) and nothing is
//!   answered;
//! - `notifications/message` (logs): MCP ties them to no request, so each
//!   goes to the connection's log (tracing, naming the upstream) and, by
//!   the same rule as requests, to the call it names or the only open call;
//!   with several open and none named, to the connection's log only, never
//!   copied into every call (2026-07-28: only when the request asked for a
//!   log level, which this client does);
//! - `notifications/tasks/status`: to the call following that task.
//!
//! The session answers `ping` (`{}`) and `roots/list` (`{"roots": []}`:
//! the broker exposes no files) itself, and -32601 to anything else.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::http::{HttpProtocol, HttpSpec};
use super::spec::Transport;
use super::stateless::Directed;
use super::stdio::StdioSpec;
use super::wire::{Connection, Inbound, Outgoing};
use super::{BadInputLog, CallError, StartError, quote};
use crate::mcp::{
    ErrorCode, LogLevel, RELATED_TASK_META, RequestId, RpcError, error_response, modern,
    notification, success_response,
};
use crate::traces::TraceContext;

/// The protocol version offered in `initialize`.
pub const OFFERED_PROTOCOL_VERSION: &str = "2025-11-25";
/// Versions accepted in the server's answer: 2025-11-25 and the session
/// revisions before it, whose messages this client reads the same way.
pub const KNOWN_PROTOCOL_VERSIONS: &[&str] =
    &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// Pages of `tools/list` read at most (a server whose cursor never ends
/// must not loop the broker forever).
const TOOLS_LIST_PAGES_MAX: usize = 1000;

/// How a session behaves.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Timeout of the requests that have one: `initialize`, `tools/list`,
    /// `tasks/get`, `tasks/cancel`, task creation and [`Session::request`]
    /// (a plain tool call and `tasks/result` have none: they take as long
    /// as the tool, and their owner bounds them with its cancel token).
    pub request_timeout: Duration,
    /// The client capabilities declared in `initialize`. Servers register
    /// some tools only for clients that declare what those tools need.
    pub capabilities: Value,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            request_timeout: crate::defaults::UPSTREAM_REQUEST_TIMEOUT,
            // What the broker can pass on to its own clients: questions
            // (elicitation, sampling) as input requests; roots as an empty
            // list. Not `tasks`: the broker does not run requests of the
            // server as tasks.
            capabilities: json!({
                "roots": {},
                "sampling": {},
                "elicitation": { "form": {} },
            }),
        }
    }
}

/// A request of the server to the client, made during a call.
#[derive(Debug)]
pub struct ServerRequest {
    /// `elicitation/create` or `sampling/createMessage`.
    pub method: String,
    /// Its params, without the related-task `_meta` (the call knows its
    /// task).
    pub params: Value,
    /// Cancelled when the server withdraws the request
    /// (`notifications/cancelled`, e.g. its own timeout ran out) or the
    /// connection ends; the answer future is then dropped and nothing is
    /// sent.
    pub withdrawn: CancellationToken,
}

/// The answer to a [`ServerRequest`]: the `result`, or a JSON-RPC error.
pub type AnswerFuture = Pin<Box<dyn Future<Output = Result<Value, RpcError>> + Send>>;

/// Receives what the server says about one call. Every method has a
/// default that ignores it (and refuses requests), so a handler implements
/// what it uses.
pub trait CallHandler: Send + Sync {
    /// `notifications/progress` of this call.
    fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        let _ = (progress, total, message);
    }
    /// A `notifications/message` routed to this call.
    fn log(&self, level: LogLevel, logger: Option<String>, data: Value) {
        let _ = (level, logger, data);
    }
    /// `notifications/tasks/status` of the upstream task this call follows
    /// (its params: the task).
    fn task_status(&self, task: Value) {
        let _ = task;
    }
    /// A question of the server during this call; runs in a task of its
    /// own, so it may take as long as it needs.
    fn request(&self, request: ServerRequest) -> AnswerFuture {
        let method = request.method;
        Box::pin(async move { Err(RpcError::method_not_found(&method)) })
    }
}

/// A handler that ignores everything (and refuses the server's questions).
#[derive(Debug, Default)]
pub struct IgnoreAll;
impl CallHandler for IgnoreAll {}

/// One call open on the session, as the router sees it.
struct Route {
    /// The `progressToken` sent with it.
    progress_token: Option<Value>,
    /// The upstream task it follows (`tasks/result`).
    task_id: Option<String>,
    /// Who gets what the server says.
    handler: Arc<dyn CallHandler>,
}

/// The calls open on the session, by a local key.
#[derive(Default)]
struct Routes {
    open: HashMap<u64, Route>,
    next: u64,
}

/// Removes its route when the call ends (however it ends).
struct RouteGuard {
    routes: Arc<Mutex<Routes>>,
    key: u64,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        lock(&self.routes).open.remove(&self.key);
    }
}

/// A request in flight: if dropped before its answer (timeout, cancel, the
/// caller's future dropped), it is forgotten and `notifications/cancelled`
/// is sent for it.
struct InFlight<'a> {
    conn: &'a Connection,
    id: u64,
    /// The server session it was sent in (HTTP; None: the connection's).
    session: Option<Arc<str>>,
    /// `Some(reason)` while the request is open.
    cancel_reason: Option<String>,
}

impl InFlight<'_> {
    fn answered(mut self) {
        self.cancel_reason = None;
    }
    fn cancel(mut self, reason: String) {
        self.cancel_reason = Some(reason);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let Some(reason) = self.cancel_reason.take() else {
            return;
        };
        self.conn.forget(self.id);
        self.conn.send_in(
            &notification(
                "notifications/cancelled",
                json!({ "requestId": self.id, "reason": reason }),
            ),
            self.session.take(),
        );
    }
}

/// A request that opens a session (`initialize`, `server/discover`): its
/// answer within `timeout`, else forgotten, never cancelled (the spec
/// forbids cancelling `initialize`, and there is nothing to cancel yet).
pub(super) async fn opening_request(
    conn: &Connection,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Value, CallError> {
    let (id, rx) = conn.begin_request(method, params)?;
    match tokio::time::timeout(timeout, rx).await {
        Ok(received) => conn.answer_of(received),
        Err(_) => {
            conn.forget(id);
            Err(CallError::TimedOut {
                upstream: conn.upstream().clone(),
                method: method.to_owned(),
                after: timeout,
            })
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Which generation of MCP the session speaks.
#[derive(Debug)]
pub(super) enum Era {
    /// 2025-11-25 and the revisions before it: `initialize`, then (HTTP)
    /// the server's session. The `initialize` result as sent
    /// (capabilities, serverInfo, instructions), raw: nothing the server
    /// declared is lost to a typed parse.
    Handshake(Value),
    /// 2026-07-28: no handshake; every request carries the version and
    /// the client's capabilities in `_meta`. The `server/discover` result
    /// as sent.
    Stateless(Value),
}

/// A live MCP session with one upstream. Clones share it; the process is
/// stopped when the last clone is dropped.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    conn: Connection,
    options: SessionOptions,
    routes: Arc<Mutex<Routes>>,
    /// The version spoken.
    protocol_version: String,
    /// How: with a handshake and a server session, or stateless.
    era: Era,
    /// Counts `notifications/tools/list_changed`.
    tools_changed: watch::Receiver<u64>,
    /// Progress tokens, `taskbroker-1`, `taskbroker-2`, ...
    next_token: AtomicU64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("upstream", self.inner.conn.upstream())
            .field("protocol_version", &self.inner.protocol_version)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Start the server and run the handshake: `initialize` offering
    /// 2025-11-25 (any version of [`KNOWN_PROTOCOL_VERSIONS`] answered is
    /// accepted), then `notifications/initialized`.
    pub async fn start_stdio(
        spec: &StdioSpec,
        options: SessionOptions,
    ) -> Result<Self, StartError> {
        let bad_input = Arc::new(BadInputLog::new(Arc::from(spec.name.as_str())));
        let (conn, inbound) = super::stdio::start(spec, bad_input.clone())?;
        Self::open(conn, inbound, bad_input, options, HttpProtocol::Handshake).await
    }

    /// Connect to a Streamable HTTP server and run the handshake, as
    /// [`Session::start_stdio`] does.
    /// With [`HttpProtocol::Discover`] (the default) `server/discover`
    /// is asked first: a server that lists 2026-07-28 is spoken to
    /// statelessly, any other answer (or none) leads to the handshake.
    pub async fn start_http(spec: &HttpSpec, options: SessionOptions) -> Result<Self, StartError> {
        let bad_input = Arc::new(BadInputLog::new(Arc::from(spec.name.as_str())));
        let (conn, inbound) = super::http::start(spec, bad_input.clone())?;
        Self::open(conn, inbound, bad_input, options, spec.protocol).await
    }

    /// Connect through `transport` and run the handshake.
    pub async fn start(transport: &Transport, options: SessionOptions) -> Result<Self, StartError> {
        match transport {
            Transport::Stdio(spec) => Self::start_stdio(spec, options).await,
            Transport::Http(spec) => Self::start_http(spec, options).await,
        }
    }

    /// Route what the server sends, then speak to it in the generation
    /// `protocol` says (or it answers to `server/discover`).
    async fn open(
        conn: Connection,
        inbound: tokio::sync::mpsc::UnboundedReceiver<Inbound>,
        bad_input: Arc<BadInputLog>,
        options: SessionOptions,
        protocol: HttpProtocol,
    ) -> Result<Self, StartError> {
        let routes = Arc::new(Mutex::new(Routes::default()));
        let (tools_changed_tx, tools_changed) = watch::channel(0);
        let dispatcher = Dispatcher {
            upstream: conn.upstream().clone(),
            outgoing: conn.outgoing(),
            routes: routes.clone(),
            withdrawable: Arc::new(Mutex::new(HashMap::new())),
            tools_changed: tools_changed_tx,
            bad_input,
        };
        tokio::spawn(dispatcher.run(inbound));

        let (protocol_version, era) = match protocol {
            HttpProtocol::Handshake => Self::initialize(&conn, &options).await?,
            HttpProtocol::Stateless => Self::discover(&conn, &options).await?,
            HttpProtocol::Discover => match Self::discover(&conn, &options).await {
                Ok(stateless) => stateless,
                Err(e) => {
                    tracing::info!(upstream = %conn.upstream(), answer = %e,
                                   "no 2026-07-28 in the answer to server/discover: speaking 2025-11-25");
                    Self::initialize(&conn, &options).await?
                }
            },
        };
        let inner = Arc::new(Inner {
            conn,
            options,
            routes,
            protocol_version,
            era,
            tools_changed,
            next_token: AtomicU64::new(1),
        });
        let session = Self { inner };
        if session.is_stateless() {
            session.keep_listening();
        }
        Ok(session)
    }

    /// The 2025-11-25 handshake: `initialize` offering 2025-11-25 (any
    /// version of [`KNOWN_PROTOCOL_VERSIONS`] answered is accepted), then
    /// `notifications/initialized`.
    async fn initialize(
        conn: &Connection,
        options: &SessionOptions,
    ) -> Result<(String, Era), StartError> {
        let params = json!({
            "protocolVersion": OFFERED_PROTOCOL_VERSION,
            "capabilities": options.capabilities,
            "clientInfo": { "name": "taskbroker", "version": env!("CARGO_PKG_VERSION") },
        });
        let handshake = opening_request(conn, "initialize", params, options.request_timeout);
        let result = match handshake.await {
            Ok(result) => result,
            Err(error) => {
                let noticed = conn
                    .bad_input()
                    .first()
                    .map(|first| format!("; it wrote {first}"))
                    .unwrap_or_default();
                return Err(StartError::Initialize { error, noticed });
            }
        };
        let Some(version) = result.get("protocolVersion").and_then(Value::as_str) else {
            return Err(StartError::Initialize {
                error: CallError::Malformed {
                    upstream: conn.upstream().clone(),
                    method: "initialize".to_owned(),
                    what: "no protocolVersion".to_owned(),
                },
                noticed: String::new(),
            });
        };
        if !KNOWN_PROTOCOL_VERSIONS.contains(&version) {
            return Err(StartError::Version {
                upstream: conn.upstream().clone(),
                answered: version.to_owned(),
            });
        }
        let protocol_version = version.to_owned();
        conn.send(&notification("notifications/initialized", json!({})));
        let server_info = result.get("serverInfo").cloned().unwrap_or_default();
        tracing::info!(
            upstream = %conn.upstream(),
            protocol_version,
            server = %server_info,
            "upstream initialized"
        );
        Ok((protocol_version, Era::Handshake(result)))
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        self.inner.conn.upstream()
    }

    /// The server process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.inner.conn.pid()
    }

    /// The protocol version the server answered.
    pub fn protocol_version(&self) -> &str {
        &self.inner.protocol_version
    }

    /// The server's capabilities, as it sent them.
    pub fn capabilities(&self) -> &Value {
        self.declared().get("capabilities").unwrap_or(&Value::Null)
    }

    /// The server's `serverInfo`, as it sent it.
    pub fn server_info(&self) -> &Value {
        match &self.inner.era {
            Era::Handshake(result) => result.get("serverInfo"),
            Era::Stateless(result) => result
                .get("_meta")
                .and_then(|meta| meta.get(modern::META_SERVER_INFO)),
        }
        .unwrap_or(&Value::Null)
    }

    /// The server's `instructions`, if any.
    pub fn instructions(&self) -> Option<&str> {
        self.declared().get("instructions").and_then(Value::as_str)
    }

    /// What the server declared: its `initialize` or `server/discover`
    /// result.
    fn declared(&self) -> &Value {
        match &self.inner.era {
            Era::Handshake(result) | Era::Stateless(result) => result,
        }
    }

    /// Whether the session is 2026-07-28's (no handshake, no server
    /// session).
    pub fn is_stateless(&self) -> bool {
        matches!(self.inner.era, Era::Stateless(_))
    }

    /// `params` as this session sends them: with the 2026-07-28 `_meta`
    /// envelope when stateless (declaring the tasks extension when the
    /// server offers it).
    pub(super) fn outgoing_params(&self, params: Value) -> Value {
        if self.is_stateless() {
            super::stateless::enveloped(
                params,
                &self.inner.options.capabilities,
                self.declares_tasks_extension(),
            )
        } else {
            params
        }
    }

    /// The connection under the session.
    pub(super) fn connection(&self) -> &Connection {
        &self.inner.conn
    }

    /// A handle that does not keep the session (and its connection) alive.
    pub(super) fn downgrade(&self) -> std::sync::Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// The session of a [`Session::downgrade`] handle, while it lives.
    pub(super) fn upgrade(weak: &std::sync::Weak<Inner>) -> Option<Self> {
        weak.upgrade().map(|inner| Self { inner })
    }

    /// Whether the server runs `tools/call` as a task: 2025-11-25
    /// `tasks.requests.tools.call` (when asked), or 2026-07-28's tasks
    /// extension (when it decides to).
    pub fn runs_tool_calls_as_tasks(&self) -> bool {
        match &self.inner.era {
            Era::Handshake(_) => self
                .capabilities()
                .pointer("/tasks/requests/tools/call")
                .is_some(),
            Era::Stateless(_) => self.declares_tasks_extension(),
        }
    }

    /// Changes at each `notifications/tools/list_changed` (a count): the
    /// owner waits on it and lists the tools again.
    pub fn tools_changed(&self) -> watch::Receiver<u64> {
        self.inner.tools_changed.clone()
    }

    /// Resolves, with the reason, once the connection has ended (the
    /// process exited or closed its stdout).
    pub async fn closed(&self) -> Arc<str> {
        let mut closed = self.inner.conn.closed();
        loop {
            if let Some(reason) = closed.borrow_and_update().clone() {
                return reason;
            }
            if closed.changed().await.is_err() {
                return closed
                    .borrow()
                    .clone()
                    .unwrap_or_else(|| Arc::from("the connection ended"));
            }
        }
    }

    /// Any request, with the session's request timeout: its `result`.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, CallError> {
        self.request_in(method, params, None).await
    }

    /// [`Session::request`] in the server session `in_session` (an HTTP
    /// server's session id of an earlier connection; None: this one's).
    async fn request_in(
        &self,
        method: &str,
        params: Value,
        in_session: Option<&str>,
    ) -> Result<Value, CallError> {
        let conn = &self.inner.conn;
        let session: Option<Arc<str>> = in_session.map(Arc::from);
        let params = self.outgoing_params(params);
        let (id, rx) = conn.begin_request_in(method, params, session.clone())?;
        let in_flight = InFlight {
            conn,
            id,
            session,
            cancel_reason: Some("the broker stopped waiting".to_owned()),
        };
        let after = self.inner.options.request_timeout;
        match tokio::time::timeout(after, rx).await {
            Ok(received) => {
                in_flight.answered();
                conn.answer_of(received)
            }
            Err(_) => {
                in_flight.cancel(format!(
                    "timed out after {}",
                    humantime::format_duration(after)
                ));
                Err(CallError::TimedOut {
                    upstream: conn.upstream().clone(),
                    method: method.to_owned(),
                    after,
                })
            }
        }
    }

    /// Every tool the server lists (`tools/list`, all pages), as sent.
    pub async fn list_tools(&self) -> Result<Vec<Value>, CallError> {
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..TOOLS_LIST_PAGES_MAX {
            let params = match &cursor {
                Some(cursor) => json!({ "cursor": cursor }),
                None => json!({}),
            };
            let page = self.request("tools/list", params).await?;
            let Some(listed) = page.get("tools").and_then(Value::as_array) else {
                return Err(self.malformed("tools/list", "no tools array"));
            };
            tools.extend(listed.iter().cloned());
            match page.get("nextCursor") {
                Some(next @ Value::String(_)) => cursor = Some(next.clone()),
                _ => return Ok(tools),
            }
        }
        Err(self.malformed(
            "tools/list",
            &format!("a cursor still after {TOOLS_LIST_PAGES_MAX} pages"),
        ))
    }

    /// Call a tool: its `CallToolResult` (a result with `isError` is a
    /// result: the tool failed, the call did not). What the server says
    /// about the call reaches `handler`. No timeout: `cancel` (or dropping
    /// the future) sends `notifications/cancelled` (2026-07-28: closes the
    /// call's stream) and ends the call at once with
    /// [`CallError::Cancelled`]; a late answer is dropped. A 2026-07-28
    /// server's input requests are answered through `handler`, and a task
    /// it makes of the call is followed to its end (and cancelled with
    /// `cancel`).
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        handler: Arc<dyn CallHandler>,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        self.call_tool_traced(name, arguments, None, handler, cancel)
            .await
    }

    /// [`Session::call_tool`] as part of the trace `trace` (its
    /// `traceparent` and `tracestate` in the request's `_meta`, SEP-414).
    pub async fn call_tool_traced(
        &self,
        name: &str,
        arguments: Value,
        trace: Option<&TraceContext>,
        handler: Arc<dyn CallHandler>,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        if self.is_stateless() {
            let task_id = match self
                .call_tool_directed(name, arguments, trace, handler.clone(), cancel)
                .await?
            {
                Directed::Result(result) => return Ok(result),
                Directed::Task(task_id) => task_id,
            };
            let followed = self.poll_task(&task_id, handler, cancel).await;
            if let Err(CallError::Cancelled { .. }) = &followed {
                let session = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = session.task_cancel(&task_id).await {
                        tracing::warn!(upstream = %session.name(), upstream_task = %task_id, error = %e,
                                       "cancelling the upstream's task failed");
                    }
                });
            }
            return followed;
        }
        let params = traced(json!({ "name": name, "arguments": arguments }), trace);
        let result = self
            .call_with_progress("tools/call", params, handler, cancel)
            .await?;
        self.call_tool_result("tools/call", result)
    }

    /// `method` with `params` and a fresh `progressToken`, open (no
    /// timeout) until answered or `cancel`: what the server says about it
    /// reaches `handler`.
    pub(super) async fn call_with_progress(
        &self,
        method: &str,
        mut params: Value,
        handler: Arc<dyn CallHandler>,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        let token = json!(format!(
            "taskbroker-{}",
            self.inner.next_token.fetch_add(1, Ordering::Relaxed)
        ));
        if let Some(meta) = meta_of(&mut params) {
            meta.insert("progressToken".into(), token.clone());
        }
        let route = Route {
            progress_token: Some(token),
            task_id: None,
            handler,
        };
        self.open_call(method, params, route, cancel).await
    }

    /// `tools/call` as an upstream task (`task: {ttl}`, ttl in ms): the
    /// server's `CreateTaskResult` (`{"task": {...}}`). The task's status
    /// notifications reach a handler only while [`Self::task_result`] is
    /// open for it; [`Self::task_get`] reads the status at any time.
    pub async fn call_tool_as_task(
        &self,
        name: &str,
        arguments: Value,
        ttl_ms: u64,
    ) -> Result<Value, CallError> {
        self.call_tool_as_task_traced(name, arguments, ttl_ms, None)
            .await
    }

    /// [`Session::call_tool_as_task`] as part of the trace `trace`.
    pub async fn call_tool_as_task_traced(
        &self,
        name: &str,
        arguments: Value,
        ttl_ms: u64,
        trace: Option<&TraceContext>,
    ) -> Result<Value, CallError> {
        let params = traced(
            json!({ "name": name, "arguments": arguments, "task": { "ttl": ttl_ms } }),
            trace,
        );
        let created = self.request("tools/call", params).await?;
        if created
            .pointer("/task/taskId")
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(self.malformed("tools/call with task", "no task.taskId"));
        }
        Ok(created)
    }

    /// `tasks/get`: the upstream task as the server sends it.
    pub async fn task_get(&self, task_id: &str) -> Result<Value, CallError> {
        self.request("tasks/get", json!({ "taskId": task_id }))
            .await
    }

    /// `tasks/cancel`: the upstream task as the server sends it.
    pub async fn task_cancel(&self, task_id: &str) -> Result<Value, CallError> {
        self.task_cancel_in(task_id, None).await
    }

    /// [`Session::task_cancel`] of a task created in the server session
    /// `in_session` (HTTP; None: this connection's).
    pub async fn task_cancel_in(
        &self,
        task_id: &str,
        in_session: Option<&str>,
    ) -> Result<Value, CallError> {
        self.request_in("tasks/cancel", json!({ "taskId": task_id }), in_session)
            .await
    }

    /// The server's session id (HTTP), which tasks it created belong to.
    pub fn upstream_session_id(&self) -> Option<String> {
        self.inner.conn.session_id().map(|s| s.to_string())
    }

    /// `tasks/result`: waits until the upstream task ends and gives its
    /// result. The server's questions about the task (delivered while this
    /// is open) and its status notifications reach `handler`. No timeout;
    /// `cancel` ends the wait (the task goes on: `task_cancel` stops it).
    pub async fn task_result(
        &self,
        task_id: &str,
        handler: Arc<dyn CallHandler>,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        self.task_result_in(task_id, None, handler, cancel).await
    }

    /// [`Session::task_result`] of a task created in the server session
    /// `in_session` (HTTP; None: this connection's).
    pub async fn task_result_in(
        &self,
        task_id: &str,
        in_session: Option<&str>,
        handler: Arc<dyn CallHandler>,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        if self.is_stateless() {
            return self.poll_task(task_id, handler, cancel).await;
        }
        let route = Route {
            progress_token: None,
            task_id: Some(task_id.to_owned()),
            handler,
        };
        let result = self
            .open_call_in(
                "tasks/result",
                json!({ "taskId": task_id }),
                route,
                cancel,
                in_session,
            )
            .await?;
        self.call_tool_result("tasks/result", result)
    }

    /// `result` if it can be a `CallToolResult` (an object).
    fn call_tool_result(&self, method: &str, result: Value) -> Result<Value, CallError> {
        if result.is_object() {
            Ok(result)
        } else {
            Err(self.malformed(
                method,
                &format!(
                    "a result that is not an object: {}",
                    quote(result.to_string().as_bytes())
                ),
            ))
        }
    }

    /// A request whose server messages are routed to `route` while open.
    async fn open_call(
        &self,
        method: &str,
        params: Value,
        route: Route,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        self.open_call_in(method, params, route, cancel, None).await
    }

    /// [`Session::open_call`] in the server session `in_session`.
    async fn open_call_in(
        &self,
        method: &str,
        params: Value,
        route: Route,
        cancel: &CancellationToken,
        in_session: Option<&str>,
    ) -> Result<Value, CallError> {
        if cancel.is_cancelled() {
            return Err(CallError::Cancelled {
                upstream: self.inner.conn.upstream().clone(),
            });
        }
        let _route = {
            let mut routes = lock(&self.inner.routes);
            routes.next += 1;
            let key = routes.next;
            routes.open.insert(key, route);
            RouteGuard {
                routes: self.inner.routes.clone(),
                key,
            }
        };
        let conn = &self.inner.conn;
        let session: Option<Arc<str>> = in_session.map(Arc::from);
        let params = self.outgoing_params(params);
        let (id, rx) = conn.begin_request_in(method, params, session.clone())?;
        let in_flight = InFlight {
            conn,
            id,
            session,
            cancel_reason: Some("the broker stopped waiting".to_owned()),
        };
        tokio::select! {
            received = rx => {
                in_flight.answered();
                conn.answer_of(received)
            }
            () = cancel.cancelled() => {
                in_flight.cancel("cancelled by the broker".to_owned());
                Err(CallError::Cancelled { upstream: conn.upstream().clone() })
            }
        }
    }

    fn malformed(&self, method: &str, what: &str) -> CallError {
        CallError::Malformed {
            upstream: self.inner.conn.upstream().clone(),
            method: method.to_owned(),
            what: what.to_owned(),
        }
    }
}

/// Routes the server's requests and notifications.
struct Dispatcher {
    upstream: Arc<str>,
    outgoing: Outgoing,
    routes: Arc<Mutex<Routes>>,
    /// The server's requests being answered by a handler, by id: cancelled
    /// when the server withdraws one.
    withdrawable: Arc<Mutex<HashMap<RequestId, CancellationToken>>>,
    tools_changed: watch::Sender<u64>,
    bad_input: Arc<BadInputLog>,
}

/// Where a message of the server about a call goes.
enum RouteFor {
    /// This call's handler.
    Call(Arc<dyn CallHandler>),
    /// None: why.
    Nowhere(String),
}

impl Dispatcher {
    /// Until the server's stdout ends (the dispatcher holds no session
    /// handle, so it never keeps the process alive).
    async fn run(self, mut inbound: mpsc::UnboundedReceiver<Inbound>) {
        while let Some(message) = inbound.recv().await {
            self.dispatch(message);
        }
        // The connection ended: nobody is left to take an answer, so no
        // handler should go on waiting (for a person, say).
        for (_, withdrawn) in lock(&self.withdrawable).drain() {
            withdrawn.cancel();
        }
    }

    fn dispatch(&self, message: Inbound) {
        match message {
            Inbound::Request {
                id,
                method,
                params,
                session,
            } => self.on_request(id, method, params, session),
            Inbound::Notification { method, params } => self.on_notification(&method, params),
        }
    }

    /// A request of the server, answered in the server session it came in
    /// (`session`, HTTP: a task's question asked on the stream of an
    /// earlier connection's session goes back there).
    fn on_request(&self, id: RequestId, method: String, params: Value, session: Option<Arc<str>>) {
        let reply = |message: &Value| self.outgoing.send_in(message, session.clone());
        match method.as_str() {
            "ping" => reply(&success_response(&id, json!({}))),
            "roots/list" => reply(&success_response(&id, json!({ "roots": [] }))),
            "elicitation/create" | "sampling/createMessage" => {
                let handler = match self.route_for(&params) {
                    RouteFor::Call(handler) => handler,
                    RouteFor::Nowhere(why) => {
                        tracing::warn!(upstream = %self.upstream, method, %id, why, "upstream request refused");
                        let error = RpcError::new(
                            ErrorCode::InternalError,
                            format!("taskbroker cannot route this {method}: {why}"),
                        );
                        reply(&error_response(Some(&id), &error));
                        return;
                    }
                };
                self.ask(handler, id, method, params, session);
            }
            _ => reply(&error_response(
                Some(&id),
                &RpcError::method_not_found(&method),
            )),
        }
    }

    /// Hand a question to a call's handler, in a task of its own, and send
    /// its answer unless the server withdraws the question first.
    fn ask(
        &self,
        handler: Arc<dyn CallHandler>,
        id: RequestId,
        method: String,
        params: Value,
        session: Option<Arc<str>>,
    ) {
        let withdrawn = CancellationToken::new();
        lock(&self.withdrawable).insert(id.clone(), withdrawn.clone());
        let answer = handler.request(ServerRequest {
            method,
            params: without_related_task(params),
            withdrawn: withdrawn.clone(),
        });
        let withdrawable = self.withdrawable.clone();
        let outgoing = self.outgoing.clone();
        tokio::spawn(async move {
            let answer = tokio::select! {
                answer = answer => Some(answer),
                () = withdrawn.cancelled() => None,
            };
            lock(&withdrawable).remove(&id);
            match answer {
                Some(Ok(result)) => outgoing.send_in(&success_response(&id, result), session),
                Some(Err(error)) => outgoing.send_in(&error_response(Some(&id), &error), session),
                None => {}
            }
        });
    }

    fn on_notification(&self, method: &str, params: Value) {
        match method {
            "notifications/progress" => {
                let Some(token) = params.get("progressToken") else {
                    self.bad_input
                        .report("progress without a token", &params.to_string());
                    return;
                };
                let Some(progress) = params.get("progress").and_then(Value::as_f64) else {
                    self.bad_input
                        .report("progress without a number", &params.to_string());
                    return;
                };
                let handler = lock(&self.routes)
                    .open
                    .values()
                    .find(|route| route.progress_token.as_ref() == Some(token))
                    .map(|route| route.handler.clone());
                match handler {
                    Some(handler) => handler.progress(
                        progress,
                        params.get("total").and_then(Value::as_f64),
                        params
                            .get("message")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    ),
                    // A call that was cancelled or timed out: the server
                    // may go on reporting.
                    None => {
                        tracing::debug!(upstream = %self.upstream, %token, "progress of no open call")
                    }
                }
            }
            "notifications/message" => self.on_log(params),
            "notifications/tasks/status" => {
                let task_id = params.get("taskId").and_then(Value::as_str);
                let handler = lock(&self.routes)
                    .open
                    .values()
                    .find(|route| route.task_id.as_deref() == task_id && task_id.is_some())
                    .map(|route| route.handler.clone());
                match handler {
                    Some(handler) => handler.task_status(params),
                    None => {
                        tracing::debug!(upstream = %self.upstream, task_id, "status of a task no call follows")
                    }
                }
            }
            // A `subscriptions/listen` stream (2026-07-28) opened: what
            // changed while none was open is listed again.
            "notifications/tools/list_changed" | "notifications/subscriptions/acknowledged" => {
                self.tools_changed.send_modify(|count| *count += 1);
            }
            "notifications/cancelled" => {
                let Some(id) = params.get("requestId").cloned() else {
                    self.bad_input
                        .report("cancelled without a requestId", &params.to_string());
                    return;
                };
                if let Some(withdrawn) = lock(&self.withdrawable).remove(&RequestId(id)) {
                    let reason = params.get("reason").and_then(Value::as_str);
                    tracing::info!(upstream = %self.upstream, reason, "upstream withdrew its request");
                    withdrawn.cancel();
                }
            }
            _ => {
                tracing::debug!(upstream = %self.upstream, method, "upstream notification ignored")
            }
        }
    }

    /// `notifications/message`: into the log, and to the call it belongs
    /// to when that can be told.
    fn on_log(&self, params: Value) {
        let level = params
            .get("level")
            .and_then(Value::as_str)
            .and_then(LogLevel::parse)
            .unwrap_or(LogLevel::Info);
        let logger = params
            .get("logger")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let data = params.get("data").cloned().unwrap_or(Value::Null);
        let upstream = &self.upstream;
        match level {
            LogLevel::Debug => tracing::debug!(upstream = %upstream, logger, %data, "upstream log"),
            LogLevel::Info | LogLevel::Notice => {
                tracing::info!(upstream = %upstream, logger, %data, "upstream log");
            }
            LogLevel::Warning => {
                tracing::warn!(upstream = %upstream, logger, %data, "upstream log")
            }
            _ => tracing::error!(upstream = %upstream, logger, %data, "upstream log"),
        }
        if let RouteFor::Call(handler) = self.route_for(&params) {
            handler.log(level, logger, data);
        }
    }

    /// The call a message of the server belongs to: the one following the
    /// task its related-task `_meta` names, else the only open call.
    fn route_for(&self, params: &Value) -> RouteFor {
        let routes = lock(&self.routes);
        let named = params
            .get("_meta")
            .and_then(|meta| meta.get(RELATED_TASK_META))
            .and_then(|related| related.get("taskId"))
            .and_then(Value::as_str);
        if let Some(task_id) = named {
            return match routes
                .open
                .values()
                .find(|route| route.task_id.as_deref() == Some(task_id))
            {
                Some(route) => RouteFor::Call(route.handler.clone()),
                None => RouteFor::Nowhere(format!("no open call follows task {task_id}")),
            };
        }
        let mut open = routes.open.values();
        match (open.next(), open.next()) {
            (Some(only), None) => RouteFor::Call(only.handler.clone()),
            (None, _) => RouteFor::Nowhere("no call is open".to_owned()),
            (Some(_), Some(_)) => RouteFor::Nowhere(format!(
                "{} calls are open and the request names no task",
                routes.open.len()
            )),
        }
    }
}

/// `params` without the related-task `_meta` key (and without `_meta` if
/// nothing else was in it).
fn without_related_task(mut params: Value) -> Value {
    if let Some(object) = params.as_object_mut() {
        let emptied = match object.get_mut("_meta").and_then(Value::as_object_mut) {
            Some(meta) => {
                meta.remove(RELATED_TASK_META);
                meta.is_empty()
            }
            None => false,
        };
        if emptied {
            object.remove("_meta");
        }
    }
    params
}

/// `params` with `trace` in their `_meta` (nothing added without one).
pub(super) fn traced(mut params: Value, trace: Option<&TraceContext>) -> Value {
    if let Some(trace) = trace
        && let Some(meta) = meta_of(&mut params)
    {
        trace.insert_into(meta);
    }
    params
}

/// The `_meta` object of request `params`, made if missing (None if the
/// params or their `_meta` are not objects).
fn meta_of(params: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    params
        .as_object_mut()?
        .entry("_meta")
        .or_insert_with(|| json!({}))
        .as_object_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn related_task_meta_is_taken_off_questions() {
        let params = json!({ "message": "m", "_meta": { RELATED_TASK_META: { "taskId": "t" } } });
        assert_eq!(without_related_task(params), json!({ "message": "m" }));
        let params = json!({ "_meta": { RELATED_TASK_META: {}, "other": 1 } });
        assert_eq!(
            without_related_task(params),
            json!({ "_meta": { "other": 1 } })
        );
    }
}
