//! The command-line MCP client: `taskbroker call` and `taskbroker tasks`.
//!
//! [`McpClient`] is a small Streamable HTTP client: it initializes a session
//! (or reuses one), sends requests and accepts either a JSON or an SSE
//! answer, hands notifications seen on an SSE answer to a callback, resumes
//! a dropped SSE stream with `Last-Event-ID`, and can end its session with
//! DELETE. The subcommands on top of it are [`call()`] and [`tasks()`]; they
//! keep one session per broker in the user's state folder ([`state`],
//! [`session`]), so `tasks` sees what `call --task` started. A tool's
//! questions (elicitation) are answered by [`input`]: `--input`, or the
//! terminal.

mod bench;
mod call;
mod cli;
mod error;
pub mod input;
mod interrupt;
mod output;
mod progress;
mod session;
pub mod sse;
mod state;
mod stateless;
mod tasks;

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};

pub use bench::{BenchArgs, run as bench};
pub use call::run as call;
pub use cli::{CallArgs, Connection, Protocol, TaskListArgs, TasksArgs, TasksCommand};
pub use error::{EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, McpError};
pub use output::table;
pub use tasks::run as tasks;

use crate::mcp::{LATEST_PROTOCOL_VERSION, RpcError, SESSION_HEADER, VERSION_HEADER};
use input::Answerer;
use sse::SseParser;

/// `clientInfo.name` sent in initialize.
pub const CLIENT_NAME: &str = "taskbroker-cli";
/// The endpoint used when neither `--url` nor `TASKBROKER_URL` says otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8808/mcp";

/// Reconnections tried in a row when an SSE stream ends without the response.
const MAX_RESUMES: u32 = 5;

/// A notification the server sent on a request's SSE stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// e.g. `notifications/progress`.
    pub method: String,
    /// Its params (`null` when it had none).
    pub params: Value,
}

/// An MCP client over Streamable HTTP, bound to one session.
#[derive(Debug)]
pub struct McpClient {
    /// The HTTP client (connection pool).
    http: reqwest::Client,
    /// The MCP endpoint.
    url: Url,
    /// `Mcp-Session-Id`, once initialized (or given).
    session: Option<String>,
    /// Sent as `MCP-Protocol-Version` once a session exists.
    protocol_version: String,
    /// Whether [`McpClient::close`] ends the session with DELETE.
    owns_session: bool,
    /// The next JSON-RPC request id.
    next_id: AtomicI64,
    /// `Authorization: Bearer ...`, when the broker needs a token.
    token: Option<String>,
    /// Answers the tool's questions (elicitation); with one, initialize
    /// declares the elicitation capability.
    answerer: Option<Answerer>,
}

impl McpClient {
    /// A client for `url` with no session yet.
    pub fn new(url: Url) -> Result<Self, McpError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            // taskbroker sends SSE keep-alives every 15 s; silence this
            // long means the connection is dead.
            .read_timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| McpError::Protocol(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            http,
            url,
            session: None,
            protocol_version: LATEST_PROTOCOL_VERSION.to_owned(),
            owns_session: false,
            next_id: AtomicI64::new(1),
            token: None,
            answerer: None,
        })
    }

    /// Answer elicitation requests with `answerer` (declared at initialize).
    pub fn set_answerer(&mut self, answerer: Answerer) {
        self.answerer = Some(answerer);
    }

    /// A client with a new, initialized session.
    pub async fn connect(url: Url) -> Result<Self, McpError> {
        let mut client = Self::new(url)?;
        client.initialize().await?;
        Ok(client)
    }

    /// A client that reuses an existing session (made by another process):
    /// no initialize, and [`McpClient::close`] leaves the session alone.
    pub fn with_session(url: Url, session_id: &str) -> Result<Self, McpError> {
        let mut client = Self::new(url)?;
        client.session = Some(session_id.to_owned());
        Ok(client)
    }

    /// A client for a command line's [`Connection`]: the given session, or a
    /// new one.
    pub async fn open(conn: &Connection) -> Result<Self, McpError> {
        let mut client = Self::new(conn.url.clone())?;
        client.token = conn.token.clone();
        match &conn.session {
            Some(id) => client.session = Some(id.clone()),
            None => {
                client.initialize().await?;
            }
        }
        Ok(client)
    }

    /// The endpoint.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The session id, once there is one.
    pub fn session_id(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// Send `Authorization: Bearer <token>` with every request.
    pub fn set_token(&mut self, token: Option<String>) {
        self.token = token;
    }

    /// Use an existing session (made by another process, or an earlier
    /// invocation): [`McpClient::close`] leaves it alone.
    pub fn use_session(&mut self, session_id: &str) {
        self.session = Some(session_id.to_owned());
        self.owns_session = false;
    }

    /// Forget the session (the server no longer knows it), before
    /// [`McpClient::initialize`] makes a new one.
    pub fn forget_session(&mut self) {
        self.session = None;
        self.owns_session = false;
    }

    /// initialize (protocol 2025-11-25; the elicitation capability when
    /// this client has an answerer), remember the session, send
    /// notifications/initialized. Returns the initialize result.
    pub async fn initialize(&mut self) -> Result<Value, McpError> {
        let capabilities = if self.answerer.is_some() {
            Answerer::capabilities()
        } else {
            json!({})
        };
        let params = json!({
            "protocolVersion": LATEST_PROTOCOL_VERSION,
            "capabilities": capabilities,
            "clientInfo": { "name": CLIENT_NAME, "version": env!("CARGO_PKG_VERSION") },
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let response = self.post(&request_body(id, "initialize", params)).await?;
        let session = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let result = self.answer(id, response, &mut |_| {}).await?;
        if let Some(version) = result.get("protocolVersion").and_then(Value::as_str) {
            self.protocol_version = version.to_owned();
        }
        self.owns_session = session.is_some();
        self.session = session;
        tracing::debug!(session = self.session.as_deref(), version = %self.protocol_version, "initialized");
        self.notify("notifications/initialized", None).await?;
        Ok(result)
    }

    /// Send a request; returns its `result`, or its JSON-RPC error as
    /// [`McpError::Rpc`].
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, McpError> {
        self.request_with(method, params, |_| {}).await
    }

    /// Send a request; notifications that arrive on its SSE answer before
    /// the response go to `on_note`, in order. Requests from the server on
    /// that stream are answered: `ping` with `{}`, `elicitation/create` by
    /// the answerer (a question it cannot answer ends the request with
    /// [`McpError::Input`]), anything else with -32601.
    pub async fn request_with(
        &self,
        method: &str,
        params: Value,
        mut on_note: impl FnMut(Notification),
    ) -> Result<Value, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let response = self.post(&request_body(id, method, params)).await?;
        self.answer(id, response, &mut on_note).await
    }

    /// Send a request and return as soon as the server answered with its
    /// headers (a 2xx); the body (JSON or an SSE stream) is the caller's to
    /// read or to hold open.
    pub async fn open_request(
        &self,
        method: &str,
        params: Value,
    ) -> Result<reqwest::Response, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.post(&request_body(id, method, params)).await
    }

    /// Send a notification (no answer expected beyond HTTP 202).
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), McpError> {
        let mut body = json!({ "jsonrpc": "2.0", "method": method });
        if let Some(params) = params {
            body["params"] = params;
        }
        self.post(&body).await.map(drop)
    }

    /// End the session with DELETE if this client made it (best effort: an
    /// error is only logged).
    pub async fn close(self) {
        let (true, Some(session)) = (self.owns_session, &self.session) else {
            return;
        };
        let sent = self
            .http
            .delete(self.url.clone())
            .headers(self.headers())
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        match sent {
            Ok(r) => tracing::debug!(session, status = %r.status(), "session deleted"),
            Err(e) => tracing::debug!(session, error = %e, "session delete failed"),
        }
    }

    fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        if let Some(token) = &self.token
            && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
        {
            h.insert(reqwest::header::AUTHORIZATION, value);
        }
        if let Some(session) = &self.session
            && let Ok(value) = HeaderValue::from_str(session)
        {
            h.insert(SESSION_HEADER, value);
            if let Ok(version) = HeaderValue::from_str(&self.protocol_version) {
                h.insert(VERSION_HEADER, version);
            }
        }
        h
    }

    /// POST one message; a non-2xx answer is an error.
    async fn post(&self, body: &Value) -> Result<reqwest::Response, McpError> {
        let response = self
            .http
            .post(self.url.clone())
            .headers(self.headers())
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| self.send_error(e))?;
        check_status(response, self.token.is_some()).await
    }

    fn send_error(&self, e: reqwest::Error) -> McpError {
        if e.is_connect() {
            McpError::Connect {
                url: self.url.to_string(),
                reason: root_cause(&e),
            }
        } else {
            McpError::Transport(error_chain(&e))
        }
    }

    /// Read the answer to request `id`: one JSON message, or an SSE stream
    /// (resumed with GET and `Last-Event-ID` if it ends early).
    async fn answer(
        &self,
        id: i64,
        response: reqwest::Response,
        on_note: &mut dyn FnMut(Notification),
    ) -> Result<Value, McpError> {
        if !is_sse(&response) {
            let text = response.text().await.map_err(|e| self.send_error(e))?;
            let message: Value = serde_json::from_str(&text)
                .map_err(|e| McpError::Protocol(format!("answer is not JSON ({e}): {text}")))?;
            return match self.handle(id, message, on_note).await {
                Some(outcome) => outcome,
                None => Err(McpError::Protocol(format!(
                    "the answer is not the response to request {id}"
                ))),
            };
        }
        let mut response = response;
        let mut last_event_id: Option<String> = None;
        let mut retry = Duration::from_millis(1000);
        let mut resumes = 0;
        loop {
            let mut parser = SseParser::new();
            while let Some(chunk) = response.chunk().await.map_err(|e| self.send_error(e))? {
                for event in parser.push(&chunk) {
                    if let Some(event_id) = event.id {
                        last_event_id = Some(event_id);
                    }
                    if let Some(ms) = event.retry {
                        retry = Duration::from_millis(ms.min(60_000));
                    }
                    if event.data.trim().is_empty() {
                        continue;
                    }
                    resumes = 0;
                    let message: Value = serde_json::from_str(&event.data).map_err(|e| {
                        McpError::Protocol(format!("SSE data is not JSON ({e}): {}", event.data))
                    })?;
                    if let Some(outcome) = self.handle(id, message, on_note).await {
                        return outcome;
                    }
                }
            }
            let Some(last) = last_event_id.clone() else {
                return Err(McpError::Protocol(
                    "the SSE stream ended without a response".into(),
                ));
            };
            resumes += 1;
            if resumes > MAX_RESUMES {
                return Err(McpError::Protocol(format!(
                    "the SSE stream ended without a response ({MAX_RESUMES} reconnections failed)"
                )));
            }
            tracing::debug!(last_event_id = %last, retry_ms = retry.as_millis(), "SSE stream ended early; resuming");
            tokio::time::sleep(retry).await;
            response = self.resume(&last).await?;
        }
    }

    /// Open the session's GET stream (server-to-client messages such as
    /// notifications/tasks/status); its body is the caller's to read.
    pub async fn open_get_stream(&self) -> Result<reqwest::Response, McpError> {
        self.get_sse(None).await
    }

    /// GET the rest of a stream after `last_event_id`.
    async fn resume(&self, last_event_id: &str) -> Result<reqwest::Response, McpError> {
        let response = self.get_sse(Some(last_event_id)).await?;
        if is_sse(&response) {
            Ok(response)
        } else {
            Err(McpError::Protocol(
                "resuming the stream did not give an SSE answer".into(),
            ))
        }
    }

    /// A GET for an SSE stream (after `last_event_id`, when given).
    async fn get_sse(&self, last_event_id: Option<&str>) -> Result<reqwest::Response, McpError> {
        let mut headers = self.headers();
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers.remove(CONTENT_TYPE);
        if let Some(value) = last_event_id.and_then(|id| HeaderValue::from_str(id).ok()) {
            headers.insert("last-event-id", value);
        }
        let response = self
            .http
            .get(self.url.clone())
            .headers(headers)
            .send()
            .await
            .map_err(|e| self.send_error(e))?;
        check_status(response, self.token.is_some()).await
    }

    /// Handle one message of an answer: the response to `id` ends the wait
    /// (`Some`); notifications go to `on_note`; server requests are answered.
    async fn handle(
        &self,
        id: i64,
        message: Value,
        on_note: &mut dyn FnMut(Notification),
    ) -> Option<Result<Value, McpError>> {
        let method = message.get("method").and_then(Value::as_str);
        match (method, message.get("id")) {
            (Some(method), Some(request_id)) => {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                match self
                    .answer_server_request(method, request_id, &params)
                    .await
                {
                    Ok(()) => None,
                    Err(e) => Some(Err(McpError::Input(e))),
                }
            }
            (Some(method), None) => {
                on_note(Notification {
                    method: method.to_owned(),
                    params: message.get("params").cloned().unwrap_or(Value::Null),
                });
                None
            }
            // A null id: the server could not read our request's id.
            (None, Some(answer_id)) if *answer_id == json!(id) || answer_id.is_null() => {
                if let Some(error) = message.get("error") {
                    Some(Err(McpError::Rpc(RpcError::from_json(error))))
                } else if let Some(result) = message.get("result") {
                    Some(Ok(result.clone()))
                } else {
                    Some(Err(McpError::Protocol(format!(
                        "response without result or error: {message}"
                    ))))
                }
            }
            _ => {
                tracing::debug!(%message, "ignored a message for someone else");
                None
            }
        }
    }

    /// `ping`, and `elicitation/create` when this client has an answerer;
    /// other requests get -32601. A question that cannot be answered here
    /// (no terminal, a bad `--input`) is left unanswered and returned: a
    /// task keeps waiting for it.
    async fn answer_server_request(
        &self,
        method: &str,
        request_id: &Value,
        params: &Value,
    ) -> Result<(), input::InputError> {
        let not_found = || {
            json!({ "jsonrpc": "2.0", "id": request_id,
                    "error": { "code": -32601, "message": format!("Method not found: {method}") } })
        };
        let body = match (method, &self.answerer) {
            ("ping", _) => json!({ "jsonrpc": "2.0", "id": request_id, "result": {} }),
            (input::ELICITATION, Some(answerer)) => {
                // The terminal is read on this thread (the runtime has others).
                match tokio::task::block_in_place(|| answerer.answer(method, params)) {
                    Ok(result) => json!({ "jsonrpc": "2.0", "id": request_id, "result": result }),
                    Err(input::InputError::Unsupported { .. }) => not_found(),
                    Err(e) => return Err(e),
                }
            }
            _ => not_found(),
        };
        if let Err(e) = self.post(&body).await {
            tracing::debug!(method, error = %e, "answering a server request failed");
        }
        Ok(())
    }
}

fn request_body(id: i64, method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

fn is_sse(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"))
}

/// Turn a non-2xx answer into [`McpError::http`], with the JSON-RPC error
/// message of its body when it has one.
async fn check_status(
    response: reqwest::Response,
    token_sent: bool,
) -> Result<reqwest::Response, McpError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/error/message")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| {
            let reason = status.canonical_reason().unwrap_or("error");
            let body: String = body.chars().take(300).collect();
            if body.trim().is_empty() {
                reason.to_owned()
            } else {
                format!("{reason}: {}", body.trim())
            }
        });
    Err(McpError::http(status.as_u16(), message, token_sent))
}

/// The innermost cause of an error (e.g. "Connection refused (os error 111)").
fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// An error and its causes, `: `-separated (reqwest's own message rarely
/// says "connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}
