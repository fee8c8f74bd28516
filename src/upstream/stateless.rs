//! MCP 2026-07-28 spoken to an upstream (a [`Session`] of
//! [`Era::Stateless`]): no handshake and no server session; every request
//! carries the version, the client's capabilities and info, and the log
//! level wanted, in `_meta` (the HTTP transport repeats the version and the
//! method in headers). What differs from 2025-11-25 lives here:
//! - `server/discover` instead of `initialize`;
//! - the server's questions come as `input_required` results (multi-round
//!   calls): each input request goes to the call's [`CallHandler`], as a
//!   2025 server's `elicitation/create` would, and the call is made again
//!   with the answers (`inputResponses`) and the server's `requestState`;
//! - the tasks extension: when the server offers it, every request
//!   declares it and the server decides whether a call becomes a task; a
//!   task is followed with `tasks/get` (its input requests answered with
//!   `tasks/update`) and stopped with `tasks/cancel`;
//! - a plain call is cancelled by closing its response stream (the HTTP
//!   transport does that for the `notifications/cancelled` a dropped call
//!   sends);
//! - list changes come on a `subscriptions/listen` stream, kept open while
//!   the session lives, when the server declares `tools.listChanged`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::session::{CallHandler, Era, ServerRequest, Session, opening_request};
use super::wire::Connection;
use super::{CallError, StartError};
use crate::mcp::{ErrorCode, RpcError, modern};
use crate::traces::TraceContext;

/// Rounds of input requests one call may take before it is given up (a
/// server that asks forever must not hold a worker forever).
const INPUT_ROUNDS_MAX: usize = 32;
/// Wait between two `tasks/get` of an upstream task when the server
/// suggests none, and the bounds put on what it suggests.
const POLL_DEFAULT: Duration = Duration::from_millis(500);
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(2);
/// `tasks/get` failures in a row (timeouts, HTTP errors) before following
/// an upstream task is given up.
const POLL_FAILURES_MAX: u32 = 5;
/// Wait before a `subscriptions/listen` stream that ended is opened again.
const LISTEN_RETRY: Duration = Duration::from_secs(2);

/// What a call the server directs gave.
#[derive(Debug)]
pub enum Directed {
    /// Its `CallToolResult`.
    Result(Value),
    /// A task the server created for it: follow it with
    /// [`Session::task_result`].
    Task(String),
}

/// `params` with the 2026-07-28 `_meta` envelope: the version, the client's
/// capabilities (`capabilities`, plus the tasks extension when
/// `tasks_extension`), the client's info, and `info` as the log level (the
/// server sends log messages only when asked).
pub(super) fn enveloped(params: Value, capabilities: &Value, tasks_extension: bool) -> Value {
    let mut capabilities = capabilities.clone();
    if tasks_extension && let Some(caps) = capabilities.as_object_mut() {
        let extensions = caps.entry("extensions").or_insert_with(|| json!({}));
        if let Some(extensions) = extensions.as_object_mut() {
            extensions.insert(modern::TASKS_EXTENSION.to_owned(), json!({}));
        }
    }
    let mut params = match params {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let meta = params.entry("_meta").or_insert_with(|| json!({}));
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(
            modern::META_PROTOCOL_VERSION.to_owned(),
            json!(modern::VERSION),
        );
        meta.insert(modern::META_CLIENT_CAPABILITIES.to_owned(), capabilities);
        meta.insert(
            modern::META_CLIENT_INFO.to_owned(),
            json!({ "name": "taskbroker", "version": env!("CARGO_PKG_VERSION") }),
        );
        meta.insert(modern::META_LOG_LEVEL.to_owned(), json!("info"));
    }
    Value::Object(params)
}

/// The wait before the next `tasks/get` of `task`: its `pollIntervalMs`
/// within [`POLL_MIN`]..[`POLL_MAX`], else [`POLL_DEFAULT`].
fn poll_wait(task: &Value) -> Duration {
    task.get("pollIntervalMs")
        .and_then(Value::as_u64)
        .map_or(POLL_DEFAULT, Duration::from_millis)
        .clamp(POLL_MIN, POLL_MAX)
}

/// Whether `task` is still `input_required` with every one of `keys`.
fn still_asks(task: &Value, keys: &[String]) -> bool {
    task.get("status").and_then(Value::as_str) == Some("input_required")
        && task
            .get("inputRequests")
            .and_then(Value::as_object)
            .is_some_and(|asked| keys.iter().all(|k| asked.contains_key(k)))
}

impl Session {
    /// `server/discover`: the stateless era when the server lists
    /// 2026-07-28 among its versions.
    pub(super) async fn discover(
        conn: &Connection,
        options: &super::SessionOptions,
    ) -> Result<(String, Era), StartError> {
        let params = enveloped(json!({}), &options.capabilities, false);
        let asked = opening_request(conn, "server/discover", params, options.request_timeout);
        let result = asked
            .await
            .map_err(|error| StartError::Discover { error })?;
        let versions: Vec<&str> = result
            .get("supportedVersions")
            .and_then(Value::as_array)
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !versions.contains(&modern::VERSION) {
            return Err(StartError::Version {
                upstream: conn.upstream().clone(),
                answered: format!("{versions:?}"),
            });
        }
        let server = result
            .pointer(&format!(
                "/_meta/{}",
                modern::META_SERVER_INFO.replace('/', "~1")
            ))
            .cloned()
            .unwrap_or_default();
        tracing::info!(upstream = %conn.upstream(), protocol_version = modern::VERSION, %server,
                       "upstream discovered");
        Ok((modern::VERSION.to_owned(), Era::Stateless(result)))
    }

    /// Whether the server offers the tasks extension (then every request
    /// declares it).
    pub(super) fn declares_tasks_extension(&self) -> bool {
        self.capabilities()
            .get("extensions")
            .and_then(|e| e.get(modern::TASKS_EXTENSION))
            .is_some()
    }

    /// `tools/call` as 2026-07-28 makes it: made again with the answers
    /// while the server asks (`input_required`); a task when the server
    /// makes one (only if it offers the tasks extension).
    pub async fn call_tool_directed(
        &self,
        name: &str,
        arguments: Value,
        trace: Option<&TraceContext>,
        handler: Arc<dyn CallHandler>,
        cancel: &CancellationToken,
    ) -> Result<Directed, CallError> {
        let mut answers: Option<(Value, Option<Value>)> = None;
        for _ in 0..INPUT_ROUNDS_MAX {
            let mut params =
                super::session::traced(json!({ "name": name, "arguments": arguments }), trace);
            if let Some((responses, state)) = answers.take() {
                params["inputResponses"] = responses;
                if let Some(state) = state {
                    params["requestState"] = state;
                }
            }
            let result = self
                .call_with_progress("tools/call", params, handler.clone(), cancel)
                .await?;
            match result.get("resultType").and_then(Value::as_str) {
                Some("input_required") => {
                    let asked = result.get("inputRequests").cloned().unwrap_or_default();
                    let responses = self
                        .answer_input_requests(&asked, &HashSet::new(), &handler, cancel)
                        .await?;
                    answers = Some((
                        Value::Object(responses),
                        result.get("requestState").cloned(),
                    ));
                }
                Some("task") => {
                    let Some(task_id) = result.get("taskId").and_then(Value::as_str) else {
                        return Err(self.malformed_answer("tools/call", "a task without a taskId"));
                    };
                    return Ok(Directed::Task(task_id.to_owned()));
                }
                _ => return Ok(Directed::Result(result)),
            }
        }
        Err(self.malformed_answer(
            "tools/call",
            &format!("input requests still after {INPUT_ROUNDS_MAX} rounds"),
        ))
    }

    /// Follow an upstream task with `tasks/get` until it ends: its result
    /// when completed, its error when failed. Input requests it shows are
    /// asked of `handler` (each key once) and answered with `tasks/update`;
    /// while they wait for an answer the task is still polled, and a
    /// question the task no longer asks (it ended, or went on) is
    /// withdrawn. A new status message reaches `handler`. A `tasks/get`
    /// that fails for a passing reason (a timeout, an HTTP error) is tried
    /// again, up to [`POLL_FAILURES_MAX`] times in a row. `cancel` ends the
    /// wait (the task goes on: [`Session::task_cancel`] stops it).
    pub(super) async fn poll_task(
        &self,
        task_id: &str,
        handler: Arc<dyn CallHandler>,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        let mut answered: HashSet<String> = HashSet::new();
        let mut message: Option<String> = None;
        loop {
            let task = self.get_task(task_id, cancel).await?;
            let said = task.get("statusMessage").and_then(Value::as_str);
            if said.is_some() && said != message.as_deref() {
                message = said.map(str::to_owned);
                handler.task_status(task.clone());
            }
            if let Some(end) = self.task_end(task_id, &task) {
                return end;
            }
            let wait = poll_wait(&task);
            let asked = task.get("inputRequests").cloned().unwrap_or_default();
            let new_keys: Vec<String> = asked
                .as_object()
                .map(|a| {
                    a.keys()
                        .filter(|k| !answered.contains(*k))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            if task.get("status").and_then(Value::as_str) == Some("input_required")
                && !new_keys.is_empty()
            {
                let questions = cancel.child_token();
                let answers = {
                    let asking =
                        self.answer_input_requests(&asked, &answered, &handler, &questions);
                    tokio::pin!(asking);
                    loop {
                        tokio::select! {
                            answers = &mut asking => break answers,
                            () = tokio::time::sleep(wait) => {
                                let now = self.get_task(task_id, cancel).await?;
                                let still_asked = still_asks(&now, &new_keys);
                                if !still_asked {
                                    // Withdrawn: the asking ends as cancelled.
                                    questions.cancel();
                                }
                            }
                        }
                    }
                };
                match answers {
                    Ok(responses) if !responses.is_empty() => {
                        answered.extend(responses.keys().cloned());
                        self.request(
                            "tasks/update",
                            json!({ "taskId": task_id, "inputResponses": responses }),
                        )
                        .await?;
                    }
                    Ok(_) => {}
                    // The task stopped asking: read it again.
                    Err(CallError::Cancelled { .. }) if !cancel.is_cancelled() => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = cancel.cancelled() => {
                    return Err(CallError::Cancelled { upstream: Arc::from(self.name()) });
                }
            }
        }
    }

    /// `tasks/get`, cut short by `cancel`, tried again after a passing
    /// failure (a timeout, an HTTP error); an error that says the task is
    /// not there (-32602), or a lost connection, is final.
    async fn get_task(
        &self,
        task_id: &str,
        cancel: &CancellationToken,
    ) -> Result<Value, CallError> {
        let mut failures = 0;
        loop {
            let got = tokio::select! {
                got = self.request("tasks/get", json!({ "taskId": task_id })) => got,
                () = cancel.cancelled() => {
                    return Err(CallError::Cancelled { upstream: Arc::from(self.name()) });
                }
            };
            let passing = match &got {
                Err(CallError::TimedOut { .. }) => true,
                Err(CallError::Upstream { error, .. }) => !matches!(
                    error.code,
                    ErrorCode::InvalidParams
                        | ErrorCode::MethodNotFound
                        | ErrorCode::MissingCapability
                        | ErrorCode::HeaderMismatch
                ),
                _ => false,
            };
            failures += 1;
            if !passing || failures >= POLL_FAILURES_MAX {
                return got;
            }
            if let Err(e) = &got {
                tracing::warn!(upstream = %self.name(), upstream_task = %task_id, error = %e, failures,
                               "tasks/get failed; asking again");
            }
            tokio::select! {
                () = tokio::time::sleep(POLL_MAX * failures) => {}
                () = cancel.cancelled() => {
                    return Err(CallError::Cancelled { upstream: Arc::from(self.name()) });
                }
            }
        }
    }

    /// How `task` ended, if it has: its result, or why there is none.
    fn task_end(&self, task_id: &str, task: &Value) -> Option<Result<Value, CallError>> {
        let upstream = || Arc::from(self.name());
        match task.get("status").and_then(Value::as_str) {
            Some("completed") => Some(match task.get("result") {
                Some(result @ Value::Object(_)) => Ok(result.clone()),
                _ => Err(self.malformed_answer("tasks/get", "a completed task without a result")),
            }),
            Some("failed") => Some(Err(CallError::Upstream {
                upstream: upstream(),
                error: task.get("error").map_or_else(
                    || {
                        RpcError::new(
                            ErrorCode::InternalError,
                            format!("upstream task {task_id} failed"),
                        )
                    },
                    RpcError::from_json,
                ),
            })),
            Some("cancelled") => Some(Err(CallError::Upstream {
                upstream: upstream(),
                error: RpcError::new(
                    ErrorCode::InternalError,
                    format!("the upstream's task {task_id} was cancelled"),
                ),
            })),
            _ => None,
        }
    }

    /// The answers to the input requests in `asked` (key -> `{method,
    /// params}`) that are not in `skip`, asked of `handler` at once:
    /// key -> the result. `roots/list` is answered here (no roots).
    async fn answer_input_requests(
        &self,
        asked: &Value,
        skip: &HashSet<String>,
        handler: &Arc<dyn CallHandler>,
        cancel: &CancellationToken,
    ) -> Result<Map<String, Value>, CallError> {
        let Some(asked) = asked.as_object() else {
            return Err(self.malformed_answer("tools/call", "inputRequests that are not an object"));
        };
        let mut questions = Vec::new();
        for (key, request) in asked.iter().filter(|(k, _)| !skip.contains(*k)) {
            let Some(method) = request.get("method").and_then(Value::as_str) else {
                return Err(self.malformed_answer(
                    "tools/call",
                    &format!("input request {key} without a method"),
                ));
            };
            let params = request.get("params").cloned().unwrap_or_else(|| json!({}));
            let key = key.clone();
            let answer: super::AnswerFuture = match method {
                "roots/list" => Box::pin(async { Ok(json!({ "roots": [] })) }),
                "elicitation/create" | "sampling/createMessage" => handler.request(ServerRequest {
                    method: method.to_owned(),
                    params,
                    withdrawn: cancel.child_token(),
                }),
                other => {
                    let other = other.to_owned();
                    Box::pin(async move { Err(RpcError::method_not_found(&other)) })
                }
            };
            let method = method.to_owned();
            questions.push(async move { (key, method, answer.await) });
        }
        let answered = tokio::select! {
            answered = join_all(questions) => answered,
            () = cancel.cancelled() => {
                return Err(CallError::Cancelled { upstream: Arc::from(self.name()) });
            }
        };
        let mut responses = Map::new();
        for (key, method, answer) in answered {
            match answer {
                Ok(result) => {
                    responses.insert(key, result);
                }
                Err(error) => {
                    return Err(CallError::Unanswered {
                        upstream: Arc::from(self.name()),
                        method,
                        error: Box::new(error),
                    });
                }
            }
        }
        Ok(responses)
    }

    /// Keep a `subscriptions/listen` stream open for `tools/list_changed`
    /// while the session lives, when the server declares
    /// `tools.listChanged` (its acknowledgement, at each opening, has the
    /// tools listed again: what changed while none was open is not lost).
    /// A server that refuses the stream is not asked again.
    pub(super) fn keep_listening(&self) {
        if self.capabilities().pointer("/tools/listChanged") != Some(&Value::Bool(true)) {
            return;
        }
        let weak = self.downgrade();
        tokio::spawn(async move {
            loop {
                // Hold no session while waiting: its last clone dropped
                // ends the connection, and with it this stream.
                let (rx, mut closed, upstream) = {
                    let Some(session) = Session::upgrade(&weak) else {
                        return;
                    };
                    let params = session
                        .outgoing_params(json!({ "notifications": { "toolsListChanged": true } }));
                    let conn = session.connection();
                    match conn.begin_request("subscriptions/listen", params) {
                        Ok((_, rx)) => (rx, conn.closed(), conn.upstream().clone()),
                        Err(_) => return,
                    }
                };
                match rx.await {
                    // It does not serve the method, or not with these
                    // params: asking again would not change that.
                    Ok(Err(CallError::Upstream { error, .. }))
                        if matches!(
                            error.code,
                            ErrorCode::MethodNotFound | ErrorCode::InvalidParams
                        ) =>
                    {
                        tracing::info!(upstream = %upstream, error = %error.message,
                                       "the upstream refused subscriptions/listen: its tools are listed again only when it reconnects");
                        return;
                    }
                    // Ended (a graceful end, a broken stream, a passing
                    // HTTP error): opened again after a pause.
                    Ok(_) => {}
                    Err(_) => return,
                }
                if closed.borrow_and_update().is_some() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(LISTEN_RETRY) => {}
                    _ = closed.wait_for(Option::is_some) => return,
                }
            }
        });
    }

    fn malformed_answer(&self, method: &str, what: &str) -> CallError {
        CallError::Malformed {
            upstream: Arc::from(self.name()),
            method: method.to_owned(),
            what: what.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_carries_version_capabilities_info_and_log_level() {
        let caps = json!({ "elicitation": { "form": {} } });
        let params = enveloped(
            json!({ "name": "t", "_meta": { "progressToken": 1 } }),
            &caps,
            true,
        );
        let meta = &params["_meta"];
        assert_eq!(meta[modern::META_PROTOCOL_VERSION], "2026-07-28");
        assert_eq!(meta["progressToken"], 1);
        assert_eq!(meta[modern::META_LOG_LEVEL], "info");
        assert_eq!(
            meta[modern::META_CLIENT_CAPABILITIES]["extensions"][modern::TASKS_EXTENSION],
            json!({})
        );
        assert_eq!(
            meta[modern::META_CLIENT_CAPABILITIES]["elicitation"],
            json!({ "form": {} })
        );
        let without = enveloped(json!({}), &caps, false);
        assert!(
            without["_meta"][modern::META_CLIENT_CAPABILITIES]
                .get("extensions")
                .is_none()
        );
    }
}
