//! The MCP 2026-07-28 front end: stateless requests on the same `/mcp`
//! endpoint and the same broker as 2025-11-25 sessions.
//!
//! A request is served here when it carries the 2026-07-28 envelope
//! (`params._meta` with a protocol version), an `MCP-Protocol-Version`
//! header of 2026-07-28, or a method only this generation has
//! ([`speaks_modern`]). Each request stands alone: it names its
//! version and client capabilities in `_meta`, and its headers must agree
//! with its body. Who owns a task: the token's principal, as for 2025
//! sessions; without tokens, [`Owner::stateless`], so that the task id
//! (random, 122 bits) is the capability to read, answer and cancel it.

mod calls;
pub mod headers;
mod input;
mod listen;
pub mod state;
mod tasks;

use std::time::Instant;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::auth::Principal;
use super::limits::hold_while_streaming;
use super::reply::StreamItem;
use super::responses::json_response;
use super::{AppState, sse};
use crate::broker::Owner;
use crate::mcp::modern::{self, Envelope};
use crate::mcp::{self, ErrorCode, RequestId, RpcError};

/// A JSON-RPC error with the HTTP status it goes out with.
#[derive(Debug)]
pub struct Refusal {
    status: StatusCode,
    error: RpcError,
}

impl Refusal {
    /// The status the 2026-07-28 transport gives each error: 400 for
    /// header, version and capability errors, 404 for unknown methods, 200
    /// otherwise (a JSON-RPC error about the call itself).
    pub fn rpc(error: RpcError) -> Self {
        let status = match error.code {
            ErrorCode::HeaderMismatch
            | ErrorCode::MissingCapability
            | ErrorCode::UnsupportedVersion => StatusCode::BAD_REQUEST,
            ErrorCode::MethodNotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::OK,
        };
        Self { status, error }
    }

    /// 400: the request is malformed at the protocol level (its envelope).
    fn bad_request(error: RpcError) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            error,
        }
    }
}

/// One 2026-07-28 request, checked.
pub struct Request<'a> {
    /// Whose tasks it may see and creates.
    pub owner: Owner,
    /// What it says of itself in `_meta`.
    pub envelope: Envelope,
    /// Its params.
    pub params: Option<&'a Value>,
    /// Its id (also the id of a `subscriptions/listen` stream).
    pub id: &'a RequestId,
    /// The W3C trace context of a `tools/call` (`_meta`, else headers).
    pub trace: Option<crate::traces::TraceContext>,
}

/// Methods only 2026-07-28 has: a request for one is served here even
/// without the envelope (and refused for lacking it).
const MODERN_ONLY: &[&str] = &["server/discover", "subscriptions/listen", "tasks/update"];

/// Whether a request is for this front end (see the module doc). An
/// `initialize` with the 2026-07-28 envelope is one: an unknown method
/// here, as the spec wants.
pub fn speaks_modern(headers: &HeaderMap, method: &str, params: Option<&Value>) -> bool {
    if modern::has_envelope(params) || MODERN_ONLY.contains(&method) {
        return true;
    }
    names_modern_version(headers)
}

/// Whether the `MCP-Protocol-Version` header names a 2026 version (another
/// unknown version without the envelope is a 2025 client's mistake: H-6).
pub fn names_modern_version(headers: &HeaderMap) -> bool {
    headers
        .get(crate::mcp::VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| modern::SUPPORTED_VERSIONS.contains(&v.trim()))
}

/// Serve one 2026-07-28 request.
pub async fn post(
    state: &AppState,
    headers: &HeaderMap,
    principal: Option<&Principal>,
    id: RequestId,
    method: String,
    params: Option<Value>,
) -> Response {
    let started = Instant::now();
    let sse = super::sse::accepts(headers, "text/event-stream");
    let request = match check(headers, principal, &id, &method, params.as_ref()) {
        Ok(r) => r,
        Err(refusal) => {
            log(&method, &Err(&refusal), started);
            return error_response(&id, refusal);
        }
    };
    let answer = match method.as_str() {
        "server/discover" => calls::Answer::Now(Ok(discover())),
        "tools/list" => calls::Answer::Now(tools_list(state, &request)),
        "tools/call" => match headers::check_call(state, headers, &request) {
            Ok(()) => calls::call(state, &request).await,
            Err(refusal) => calls::Answer::Now(Err(refusal)),
        },
        "tasks/get" | "tasks/update" | "tasks/cancel" => {
            calls::Answer::Now(task_method(state, headers, &request, &method).await)
        }
        // Nothing to list: the lists exist so that clients of this
        // generation can cache them (SEP-2549).
        "prompts/list" => calls::Answer::Now(Ok(cacheable(json!({ "prompts": [] })))),
        "resources/list" => calls::Answer::Now(Ok(cacheable(json!({ "resources": [] })))),
        "resources/templates/list" => {
            calls::Answer::Now(Ok(cacheable(json!({ "resourceTemplates": [] }))))
        }
        "prompts/get" | "resources/read" => calls::Answer::Now(Err(not_served(&request))),
        "subscriptions/listen" => {
            return match listen::listen(state, &request, sse).await {
                Ok(response) => {
                    log(&method, &Ok(&json!({})), started);
                    response
                }
                Err(refusal) => {
                    log(&method, &Err(&refusal), started);
                    error_response(&id, refusal)
                }
            };
        }
        other => calls::Answer::Now(Err(unknown_method(other))),
    };
    respond(state, id, method, answer, sse, started).await
}

/// The envelope and the headers every request must get right, in the
/// order the spec checks them.
fn check<'a>(
    headers: &HeaderMap,
    principal: Option<&Principal>,
    id: &'a RequestId,
    method: &str,
    params: Option<&'a Value>,
) -> Result<Request<'a>, Refusal> {
    let header_version = headers::version(headers)?;
    let envelope = Envelope::parse(params).map_err(Refusal::bad_request)?;
    if header_version != envelope.version {
        return Err(Refusal::rpc(modern::header_mismatch(format!(
            "Header mismatch: MCP-Protocol-Version is '{header_version}' but _meta \
             \"{}\" is '{}'",
            modern::META_PROTOCOL_VERSION,
            envelope.version
        ))));
    }
    if !modern::SUPPORTED_VERSIONS.contains(&envelope.version.as_str()) {
        return Err(Refusal::rpc(modern::unsupported_version(&envelope.version)));
    }
    headers::check_method(headers, method)?;
    let owner = match principal {
        Some(p) => Owner::principal(&p.0),
        None => Owner::stateless(),
    };
    let trace = if method == "tools/call" {
        crate::traces::TraceContext::of_request(params.and_then(|p| p.get("_meta")), Some(headers))
    } else {
        None
    };
    Ok(Request {
        owner,
        envelope,
        params,
        id,
        trace,
    })
}

/// -32602 for a prompt or resource: there are none (SEP-2164: the unknown
/// URI in `data`).
fn not_served(request: &Request<'_>) -> Refusal {
    let params = request.params;
    let error = match params.and_then(|p| p.get("uri")).and_then(Value::as_str) {
        Some(uri) => RpcError::invalid_params(format!(
            "Resource not found: {uri} (this broker serves tools and tasks, no resources)"
        ))
        .with_data(json!({ "uri": uri })),
        None => RpcError::invalid_params(format!(
            "Prompt not found: {} (this broker serves tools and tasks, no prompts)",
            params
                .and_then(|p| p.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("(no name)")
        )),
    };
    Refusal::rpc(error)
}

/// -32601 + 404, naming what this generation has instead.
fn unknown_method(method: &str) -> Refusal {
    let hint = match method {
        "initialize" => format!(
            " (MCP {} has no initialize: send each request with its _meta; for a 2025-11-25 \
             session, send initialize without the {} _meta)",
            modern::VERSION,
            modern::VERSION
        ),
        "tasks/result" | "tasks/list" => format!(
            " (removed by the tasks extension: poll tasks/get, which carries the result; a \
             2025-11-25 session still has {method})"
        ),
        "ping" | "logging/setLevel" => format!(" (removed in MCP {})", modern::VERSION),
        _ => String::new(),
    };
    let mut error = RpcError::method_not_found(method);
    error.message.push_str(&hint);
    if method == "initialize" {
        let mut supported: Vec<&str> = modern::SUPPORTED_VERSIONS.to_vec();
        supported.extend_from_slice(mcp::SUPPORTED_PROTOCOL_VERSIONS);
        error = error.with_data(json!({ "supported": supported }));
    }
    Refusal::rpc(error)
}

async fn task_method(
    state: &AppState,
    headers: &HeaderMap,
    request: &Request<'_>,
    method: &str,
) -> Result<Value, Refusal> {
    headers::check_task_name(headers, request.params, state.config.header_presence)?;
    if !request.envelope.declares_tasks() {
        return Err(calls::tasks_not_declared(method));
    }
    match method {
        "tasks/get" => tasks::get(state, &request.owner, request.params).await,
        "tasks/update" => tasks::update(state, &request.owner, request.params).await,
        _ => tasks::cancel(state, &request.owner, request.params).await,
    }
}

/// How long clients may cache what `server/discover` and `tools/list`
/// return: the tools change only when the broker restarts.
const CACHE_TTL_MS: i64 = 60_000;

fn cacheable(mut result: Value) -> Value {
    if let Value::Object(obj) = &mut result {
        obj.insert("ttlMs".into(), json!(CACHE_TTL_MS));
        // The same for every principal.
        obj.insert("cacheScope".into(), json!("public"));
    }
    modern::complete(result)
}

/// `server/discover`.
fn discover() -> Value {
    cacheable(json!({
        "supportedVersions": modern::SUPPORTED_VERSIONS,
        "capabilities": {
            "tools": {},
            // Declared with empty lists, which clients may cache.
            "prompts": {},
            "resources": {},
            "extensions": { modern::TASKS_EXTENSION: {} }
        },
        "instructions": "Durable task broker. Declare the extension io.modelcontextprotocol/tasks \
                         in _meta clientCapabilities and tools that may run as tasks do: poll \
                         tasks/get (the result is inline), answer inputRequests with tasks/update.",
    }))
}

/// `tools/list`: one page; no `execution` (2026-07-28 tools have none:
/// the server decides what runs as a task).
fn tools_list(state: &AppState, request: &Request<'_>) -> Result<Value, Refusal> {
    if request.params.and_then(|p| p.get("cursor")).is_some() {
        return Err(Refusal::rpc(RpcError::invalid_params("Invalid cursor")));
    }
    let registry = state.broker.tools();
    let tools: Vec<Value> = registry
        .definitions_for(request.owner.principal_name())
        .map(|d| {
            let mut tool = d.to_json();
            if let Value::Object(obj) = &mut tool {
                obj.remove("execution");
            }
            tool
        })
        .collect();
    let mut result = cacheable(json!({ "tools": tools }));
    if registry.restricted() {
        // Some tools are served to some principals only.
        result["cacheScope"] = json!("private");
    }
    Ok(result)
}

/// The JSON-RPC error response.
fn error_response(id: &RequestId, refusal: Refusal) -> Response {
    let body = json!({ "jsonrpc": "2.0", "id": id.0, "error": refusal.error.to_json() });
    json_response(refusal.status, &body)
}

/// Answer now as JSON; a call still running answers as JSON when it ends
/// before saying anything, else as SSE with its notifications first (a
/// client that does not take SSE gets only the result).
async fn respond(
    state: &AppState,
    id: RequestId,
    method: String,
    answer: calls::Answer,
    sse: bool,
    started: Instant,
) -> Response {
    let (mut items, mut outcome) = match answer {
        calls::Answer::Now(outcome) => return finish(&id, &method, outcome, started),
        calls::Answer::Later { items, outcome } => (items, outcome),
    };
    if !sse {
        return finish(&id, &method, outcome.await, started);
    }
    // What the tool said first; a tool that said something as it ended
    // still answers over SSE, with the outcome known already.
    let mut first = Vec::new();
    tokio::select! {
        biased;
        item = items.recv() => first.extend(item),
        done = &mut outcome => {
            while let Ok(item) = items.try_recv() {
                first.push(item);
            }
            if first.is_empty() {
                return finish(&id, &method, done, started);
            }
            outcome = Box::pin(std::future::ready(done));
        }
    }
    let Some(slot) = state.open_streams.acquire() else {
        return error_response(
            &id,
            Refusal {
                status: StatusCode::SERVICE_UNAVAILABLE,
                error: RpcError::new(
                    ErrorCode::Other(-32000),
                    format!(
                        "Service Unavailable: {} SSE streams are open, the maximum \
                         (max_sse_streams); retry later",
                        state.open_streams.max()
                    ),
                ),
            },
        );
    };
    // Closing the stream drops `outcome`, and with it the tool: the call
    // is cancelled.
    let keep_alive = state.config.keep_alive;
    let stream = async_stream::stream! {
        let mut numbered = sse::Numbered::new();
        let mut event = |message: &Value| numbered.event(message);
        for item in first {
            if let StreamItem::Message(m) = item {
                yield Ok::<_, std::convert::Infallible>(event(&m));
            }
        }
        let mut items = Some(items);
        let start = tokio::time::Instant::now() + keep_alive;
        let mut ticker = tokio::time::interval_at(start, keep_alive);
        let outcome = loop {
            tokio::select! {
                biased;
                item = async {
                    match items.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => match item {
                    Some(StreamItem::Message(m)) => yield Ok(event(&m)),
                    Some(StreamItem::Close) => {}
                    None => items = None,
                },
                outcome = &mut outcome => break outcome,
                _ = ticker.tick() => yield Ok(axum::body::Bytes::from_static(sse::KEEP_ALIVE)),
            }
        };
        // What the tool said before it ended goes out before the result.
        if let Some(rx) = items.as_mut() {
            while let Ok(item) = rx.try_recv() {
                if let StreamItem::Message(m) = item {
                    yield Ok(event(&m));
                }
            }
        }
        log(&method, &outcome.as_ref(), started);
        let last = match outcome {
            Ok(result) => mcp::success_response(&id, result),
            Err(refusal) => json!({ "jsonrpc": "2.0", "id": id.0, "error": refusal.error.to_json() }),
        };
        yield Ok(event(&last));
    };
    let response = sse::sse_response(stream);
    hold_while_streaming(response, slot)
}

fn finish(
    id: &RequestId,
    method: &str,
    outcome: Result<Value, Refusal>,
    started: Instant,
) -> Response {
    log(method, &outcome.as_ref(), started);
    match outcome {
        Ok(result) => json_response(StatusCode::OK, &mcp::success_response(id, result)),
        Err(refusal) => error_response(id, refusal),
    }
}

fn log(method: &str, outcome: &Result<&Value, &Refusal>, started: Instant) {
    let (status, task_id) = match outcome {
        Ok(r) => (
            r.get("status")
                .or_else(|| r.get("resultType"))
                .and_then(Value::as_str)
                .unwrap_or("ok")
                .to_owned(),
            r.get("taskId").and_then(Value::as_str),
        ),
        Err(refusal) => (format!("error {}", refusal.error.code.code()), None),
    };
    tracing::info!(
        method,
        protocol = modern::VERSION,
        task_id = task_id.unwrap_or("-"),
        status,
        duration_ms = (started.elapsed().as_secs_f64() * 100_000.0).round() / 100.0,
        "request"
    );
}
