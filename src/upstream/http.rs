//! The Streamable HTTP transport of an upstream MCP server (MCP
//! 2025-11-25): every message the broker sends is a POST to the server's
//! URL; the answer to a request comes back as the POST's JSON body, or as
//! an SSE stream that also carries the server's progress, log messages and
//! questions about that request, then the answer. The `Mcp-Session-Id`
//! the server gives with its `initialize` answer goes on every later
//! request, with `MCP-Protocol-Version`.
//!
//! MCP 2026-07-28 requests (those whose `_meta` names that version) go
//! without a session, with `MCP-Protocol-Version`, `Mcp-Method` and
//! `Mcp-Name` taken from the message; a `notifications/cancelled` for one
//! of them closes its answer stream instead of being sent.
//!
//! The connection ends (and the link starts a new one, with backoff) when
//! the server cannot be reached, or answers 404 to a request of its session
//! (the session expired). A request whose POST fails otherwise (an HTTP
//! error status, a body that is no answer) fails alone.
//!
//! The bearer token is read from an environment variable when the config
//! is loaded, and never logged: [`HttpSpec`]'s `Debug` hides it, and errors
//! name the URL only.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::wire::{Connection, Inbound, Outbound, Router};
use super::{BadInputLog, CallError, StartError};
use crate::client::sse::SseParser;
use crate::mcp::{ErrorCode, RpcError, VERSION_HEADER, modern};

/// How to reach one Streamable HTTP upstream.
#[derive(Clone)]
pub struct HttpSpec {
    /// The upstream's name (in logs and errors).
    pub name: String,
    /// The MCP endpoint, e.g. `http://127.0.0.1:3001/mcp`.
    pub url: reqwest::Url,
    /// Headers sent with every request (from the config file).
    pub headers: BTreeMap<String, String>,
    /// Sent as `Authorization: Bearer ...` (read from the environment).
    pub bearer_token: Option<String>,
    /// The MCP revision to speak.
    pub protocol: HttpProtocol,
}

/// The MCP revision spoken to an HTTP upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpProtocol {
    /// Ask with `server/discover`: 2026-07-28 when the server lists it,
    /// else 2025-11-25 (with its handshake).
    #[default]
    Discover,
    /// 2025-11-25: `initialize`, a server session.
    Handshake,
    /// 2026-07-28: stateless, `_meta` on every request (a server that
    /// does not answer `server/discover` with it is down, with that reason).
    Stateless,
}

impl HttpProtocol {
    /// The config value (`protocol = "..."`), None if unknown.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "2025-11-25" => Some(Self::Handshake),
            "2026-07-28" => Some(Self::Stateless),
            _ => None,
        }
    }
}

impl std::fmt::Debug for HttpSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSpec")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field(
                "bearer_token",
                &self.bearer_token.as_ref().map(|_| "(hidden)"),
            )
            .field("protocol", &self.protocol)
            .finish()
    }
}

/// How long a connection to the server may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Wait before the session's GET stream is opened again.
const LISTEN_RETRY: Duration = Duration::from_secs(2);
/// The protocol version every request after `initialize` names.
const PROTOCOL_VERSION: &str = "2025-11-25";

/// What every POST shares.
struct Poster {
    http: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
    /// The server's session id, once its `initialize` answer gave one
    /// (shared with the connection, which tells the session).
    session: Arc<Mutex<Option<Arc<str>>>>,
    router: Router,
    /// 2026-07-28 requests whose answer is being read, by id: cancelled
    /// to close the stream.
    stateless_open: Mutex<HashMap<u64, CancellationToken>>,
    /// Whether a 2026-07-28 request was sent on this connection.
    stateless_used: AtomicBool,
}

/// Open the connection: nothing is sent until the session's first
/// request (`initialize`).
pub(crate) fn start(
    spec: &HttpSpec,
    bad_input: Arc<BadInputLog>,
) -> Result<(Connection, mpsc::UnboundedReceiver<Inbound>), StartError> {
    let upstream: Arc<str> = Arc::from(spec.name.as_str());
    let invalid = |what: String| StartError::Http {
        upstream: upstream.clone(),
        reason: what,
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &spec.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("header name '{name}' is not valid")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| invalid(format!("the value of header '{name}' is not valid")))?;
        headers.insert(name, value);
    }
    if let Some(token) = &spec.bearer_token {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| invalid("the bearer token is not a valid header value".to_owned()))?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    let http = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| invalid(format!("HTTP client: {e}")))?;
    let (conn, wiring, inbound) = Connection::new(upstream.clone(), bad_input, None);
    let poster = Arc::new(Poster {
        http,
        url: spec.url.clone(),
        headers,
        session: wiring.session_id,
        router: wiring.router,
        stateless_open: Mutex::new(HashMap::new()),
        stateless_used: AtomicBool::new(false),
    });
    tokio::spawn(send_all(poster.clone(), wiring.outgoing, wiring.dropped));
    tracing::info!(upstream = %upstream, url = %spec.url, "upstream connecting over HTTP");
    Ok((conn, inbound))
}

/// The writer: each message a POST of its own, in order, its answer read
/// concurrently (a tool call's SSE answer may stream for hours). The
/// server session is not ended (no DELETE) when the connection is dropped:
/// tasks created in it may still be followed by a later run, possibly of
/// another broker process; the server expires it.
async fn send_all(
    poster: Arc<Poster>,
    mut outgoing: mpsc::UnboundedReceiver<Outbound>,
    dropped: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            message = outgoing.recv() => message,
            () = dropped.cancelled() => None,
        };
        let Some(message) = message else { break };
        if poster.is_stateless_cancel(&message.body) {
            continue;
        }
        let post = poster.request(message);
        // A 2026-07-28 request's stop is registered before its POST
        // starts, so a cancel queued right behind it finds it.
        let stop = match (&post.stateless, post.request_id) {
            (Some(_), Some(id)) => {
                poster.stateless_used.store(true, Ordering::Relaxed);
                let token = CancellationToken::new();
                poster
                    .stateless_open
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(id, token.clone());
                Some((id, token))
            }
            _ => None,
        };
        tokio::spawn(poster.clone().exchange(post, stop));
    }
    // The connection was dropped: its GET stream ends too.
    poster.router.close(Arc::from("the session ended"));
}

/// One message to POST: its text, the id when it is our request, and the
/// session it goes in when not the connection's.
struct Post {
    body: String,
    request_id: Option<u64>,
    initialize: bool,
    session: Option<Arc<str>>,
    /// A 2026-07-28 request: its headers (no server session).
    stateless: Option<Vec<(&'static str, HeaderValue)>>,
}

/// The 2026-07-28 headers of `message` when it carries that revision's
/// `_meta` envelope: `MCP-Protocol-Version`, `Mcp-Method`, and `Mcp-Name`
/// (the tool or prompt of a call, the resource read, the task asked
/// about).
fn stateless_headers(message: &Value) -> Option<Vec<(&'static str, HeaderValue)>> {
    let params = message.get("params")?;
    let version = params
        .get("_meta")?
        .get(modern::META_PROTOCOL_VERSION)?
        .as_str()?;
    let method = message.get("method")?.as_str()?;
    let mut headers = vec![
        (VERSION_HEADER, HeaderValue::from_str(version).ok()?),
        (modern::METHOD_HEADER, HeaderValue::from_str(method).ok()?),
    ];
    let name = match method {
        "tools/call" | "prompts/get" => params.get("name"),
        "resources/read" => params.get("uri"),
        m if m.starts_with("tasks/") => params.get("taskId"),
        _ => None,
    };
    if let Some(name) = name.and_then(Value::as_str)
        && let Ok(value) = HeaderValue::from_str(name)
    {
        headers.push((modern::NAME_HEADER, value));
    }
    Some(headers)
}

impl Poster {
    fn request(&self, Outbound { body, session }: Outbound) -> Post {
        let parsed: Option<Value> = serde_json::from_str(&body).ok();
        let method = parsed
            .as_ref()
            .and_then(|m| m.get("method"))
            .and_then(Value::as_str);
        let request_id = match (&parsed, method) {
            (Some(m), Some(_)) => m.get("id").and_then(Value::as_u64),
            _ => None,
        };
        Post {
            initialize: method == Some("initialize"),
            request_id,
            stateless: parsed.as_ref().and_then(stateless_headers),
            body,
            session,
        }
    }

    /// Whether `body` is a `notifications/cancelled` on a 2026-07-28
    /// connection: the request's stream, if still open, is closed instead
    /// (how that revision cancels), and the notification is not sent (a
    /// late one, for a request already answered, too).
    fn is_stateless_cancel(&self, body: &str) -> bool {
        if !body.contains("notifications/cancelled") || !self.stateless_used.load(Ordering::Relaxed)
        {
            return false;
        }
        let Ok(message) = serde_json::from_str::<Value>(body) else {
            return false;
        };
        if message.get("method").and_then(Value::as_str) != Some("notifications/cancelled") {
            return false;
        }
        let id = message.pointer("/params/requestId").and_then(Value::as_u64);
        let stream = id.and_then(|id| {
            self.stateless_open
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id)
        });
        if let Some(stream) = stream {
            stream.cancel();
        }
        true
    }

    /// POST one message and route what comes back; a 2026-07-28 request's
    /// exchange ends (its stream closed) when `stop` is cancelled.
    async fn exchange(self: Arc<Self>, post: Post, stop: Option<(u64, CancellationToken)>) {
        match &stop {
            Some((_, token)) => {
                tokio::select! {
                    () = self.clone().exchange_until_answered(post) => {}
                    () = token.cancelled() => {}
                }
            }
            None => self.clone().exchange_until_answered(post).await,
        }
        if let Some((id, _)) = stop {
            self.stateless_open
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        }
    }

    async fn exchange_until_answered(self: Arc<Self>, post: Post) {
        let mut headers = self.headers.clone();
        if let Some(stateless) = &post.stateless {
            for (name, value) in stateless {
                headers.insert(*name, value.clone());
            }
        } else if !post.initialize {
            headers.insert(
                "mcp-protocol-version",
                HeaderValue::from_static(PROTOCOL_VERSION),
            );
            let session = post.session.clone().or_else(|| {
                self.session
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            });
            if let Some(session) = session.and_then(|s| HeaderValue::from_str(&s).ok()) {
                headers.insert("mcp-session-id", session);
            }
        }
        let response = match self
            .http
            .post(self.url.clone())
            .headers(headers)
            .body(post.body)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // Unreachable: the connection is over; the link starts a
                // new one (with backoff).
                let reason = format!("cannot reach {}: {}", self.url, error_chain(&e));
                tracing::warn!(upstream = %self.router.upstream(), reason, "upstream connection ended");
                self.router.close(Arc::from(reason));
                return;
            }
        };
        let status = response.status();
        if post.initialize
            && let Some(session) = response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
        {
            *self.session.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::from(session));
        }
        if post.initialize && status.is_success() {
            // Once the session is open: the server's own stream, for what
            // it sends outside any request (tools/list_changed).
            tokio::spawn(self.clone().listen());
        }
        // (A 2026-07-28 request has no session: its 404 is -32601.)
        if status == reqwest::StatusCode::NOT_FOUND
            && !post.initialize
            && post.session.is_none()
            && post.stateless.is_none()
        {
            let reason = format!("{} answered 404: the server ended the session", self.url);
            tracing::warn!(upstream = %self.router.upstream(), reason, "upstream connection ended");
            self.router.close(Arc::from(reason));
            return;
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            self.failed(post.request_id, status, &body);
            return;
        }
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if is_sse {
            let mut parser = SseParser::new();
            let mut body = response.bytes_stream();
            let mut closed = self.router.closed();
            loop {
                // The connection dropped: nobody waits for this answer
                // (a listen stream would otherwise stay open for ever).
                let chunk = tokio::select! {
                    chunk = body.next() => chunk,
                    _ = closed.wait_for(Option::is_some) => return,
                };
                let Some(chunk) = chunk else { break };
                match chunk {
                    Ok(bytes) => {
                        for event in parser.push(&bytes) {
                            if !event.data.is_empty() {
                                self.router
                                    .on_message_in(event.data.as_bytes(), post.session.clone());
                            }
                        }
                    }
                    Err(e) => {
                        let reason = format!("the answer stream broke: {}", error_chain(&e));
                        if let Some(id) = post.request_id {
                            self.router.fail(id, self.lost(reason));
                        }
                        return;
                    }
                }
            }
            self.unanswered(post.request_id, "the answer stream ended without an answer");
            return;
        }
        match response.bytes().await {
            Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {
                self.unanswered(
                    post.request_id,
                    "the server answered the request with no body",
                );
            }
            Ok(bytes) => {
                self.router.on_message_in(&bytes, post.session.clone());
                self.unanswered(post.request_id, "the answer's body held no answer to it");
            }
            Err(e) => {
                if let Some(id) = post.request_id {
                    self.router.fail(
                        id,
                        self.lost(format!("reading the answer: {}", error_chain(&e))),
                    );
                }
            }
        }
    }

    /// The GET stream of the session, while the connection lasts; opened
    /// again after it ends (a server may close it at any time). A server
    /// that has none (405) is not asked again.
    async fn listen(self: Arc<Self>) {
        let mut closed = self.router.closed();
        loop {
            let mut headers = self.headers.clone();
            headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
            headers.remove(CONTENT_TYPE);
            headers.insert(
                "mcp-protocol-version",
                HeaderValue::from_static(PROTOCOL_VERSION),
            );
            let session = self
                .session
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(session) = session.and_then(|s| HeaderValue::from_str(&s).ok()) {
                headers.insert("mcp-session-id", session);
            }
            let stream = async {
                let response = self
                    .http
                    .get(self.url.clone())
                    .headers(headers)
                    .send()
                    .await;
                let Ok(response) = response else { return true };
                if !response.status().is_success() {
                    // 405: the server offers no such stream.
                    return response.status() != reqwest::StatusCode::METHOD_NOT_ALLOWED;
                }
                // What the server sent before the stream was open is lost
                // (servers register tools once the session starts, and
                // say so): list the tools again.
                self.router.notify("notifications/tools/list_changed");
                let mut parser = SseParser::new();
                let mut body = response.bytes_stream();
                while let Some(Ok(bytes)) = body.next().await {
                    for event in parser.push(&bytes) {
                        if !event.data.is_empty() {
                            self.router.on_message(event.data.as_bytes());
                        }
                    }
                }
                true
            };
            let again = tokio::select! {
                again = stream => again,
                _ = closed.wait_for(Option::is_some) => return,
            };
            if !again {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(LISTEN_RETRY) => {}
                _ = closed.wait_for(Option::is_some) => return,
            }
        }
    }

    /// A request whose POST was answered without its answer: it fails as
    /// lost (the server closed the stream, a proxy cut it), so no caller
    /// waits for ever. Nothing happens when the answer came.
    fn unanswered(&self, request_id: Option<u64>, why: &str) {
        if let Some(id) = request_id {
            self.router.fail(id, self.lost(why.to_owned()));
        }
    }

    /// A POST answered with an error status: its request fails with it.
    fn failed(&self, request_id: Option<u64>, status: reqwest::StatusCode, body: &str) {
        // The JSON-RPC error in the body, when the server sent one.
        let error = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|b| b.get("error").map(RpcError::from_json))
            .unwrap_or_else(|| {
                RpcError::new(
                    ErrorCode::InternalError,
                    format!("HTTP {status}: {}", super::quote(body.as_bytes())),
                )
            });
        match request_id {
            Some(id) => self.router.fail(
                id,
                CallError::Upstream {
                    upstream: self.router.upstream().clone(),
                    error,
                },
            ),
            None => tracing::warn!(upstream = %self.router.upstream(), %status,
                                   "the upstream refused a notification or an answer"),
        }
    }

    fn lost(&self, reason: String) -> CallError {
        CallError::Lost {
            upstream: self.router.upstream().clone(),
            reason: Arc::from(reason),
        }
    }
}

/// An error with its causes, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
