//! `taskbroker call` and `taskbroker tasks` over MCP 2026-07-28
//! (`--protocol 2026-07-28`): no session; every request carries its
//! version and capabilities in `_meta` and the routing headers. `--task`
//! declares the tasks extension, so the broker makes a task of any tool
//! that may run as one; the task is then followed with `tasks/get`, whose
//! answer carries the result. This generation has no `tasks/list` and no
//! `tasks/result` (the tasks extension removed them).
//!
//! Without tokens, such a task belongs to no one in particular: its id is
//! what lets `tasks get|result|cancel` reach it from any shell.
//!
//! Every request declares form elicitation: the tool's questions are
//! answered by the [`Answerer`] (`--input`, or the terminal): a plain
//! call's `input_required` result is retried with `inputResponses` and its
//! `requestState`; a task's `inputRequests` are answered with
//! `tasks/update`.

use std::io::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Map, Value, json};

use super::input::Answerer;
use super::output::{print_json, print_result};
use super::progress::Progress;
use super::sse::SseParser;
use super::{
    CLIENT_NAME, CallArgs, Connection, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNREACHABLE,
    EXIT_USAGE, McpError, TasksArgs, TasksCommand,
};
use crate::mcp::RpcError;
use crate::mcp::modern;

/// Rounds of `input_required` a plain call may take before the client
/// gives up (a tool that keeps asking).
const MAX_INPUT_ROUNDS: usize = 16;

/// A client of the 2026-07-28 generation: one POST per request.
pub(super) struct StatelessClient {
    http: reqwest::Client,
    url: Url,
    token: Option<String>,
    next_id: AtomicI64,
    /// Answers the tool's questions.
    answerer: Answerer,
}

impl StatelessClient {
    pub(super) fn new(conn: &Connection, answerer: Answerer) -> Result<Self, McpError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| McpError::Protocol(format!("cannot build the HTTP client: {e}")))?;
        if conn.session.is_some() {
            eprintln!(
                "taskbroker: --session is ignored with --protocol {}: it has no sessions",
                modern::VERSION
            );
        }
        Ok(Self {
            http,
            url: conn.url.clone(),
            token: conn.token.clone(),
            next_id: AtomicI64::new(1),
            answerer,
        })
    }

    /// The answers to `requests` (`{key: {method, params}}`) as
    /// `inputResponses`; the terminal is read on this thread.
    fn answer_all(&self, requests: &Value) -> Result<Map<String, Value>, McpError> {
        let mut responses = Map::new();
        if let Some(requests) = requests.as_object() {
            for (key, request) in requests {
                let method = request.get("method").and_then(Value::as_str).unwrap_or("");
                let params = request.get("params").unwrap_or(&Value::Null);
                let answer = tokio::task::block_in_place(|| self.answerer.answer(method, params))?;
                responses.insert(key.clone(), answer);
            }
        }
        Ok(responses)
    }

    /// Send `method` with `params` (plus the `_meta` envelope); with
    /// `tasks`, the request declares the tasks extension.
    pub(super) async fn request(
        &self,
        method: &str,
        params: Value,
        tasks: bool,
    ) -> Result<Value, McpError> {
        let (id, response) = self.open(method, params, tasks).await?;
        self.answer(id, response).await
    }

    /// Send `method` as [`StatelessClient::request`] does, and return the
    /// response unread with the request's id (a `subscriptions/listen`
    /// stream is read as it comes).
    pub(super) async fn open(
        &self,
        method: &str,
        params: Value,
        tasks: bool,
    ) -> Result<(i64, reqwest::Response), McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut params = match params {
            Value::Object(p) => p,
            _ => serde_json::Map::new(),
        };
        let mut capabilities = Answerer::capabilities();
        if tasks
            && let (Some(all), Value::Object(task)) =
                (capabilities.as_object_mut(), modern::tasks_capability())
        {
            all.extend(task);
        }
        // The envelope joins what the caller put in `_meta` (an
        // idempotency key).
        let mut meta = match params.remove("_meta") {
            Some(Value::Object(meta)) => meta,
            _ => serde_json::Map::new(),
        };
        meta.insert(modern::META_PROTOCOL_VERSION.into(), json!(modern::VERSION));
        meta.insert(modern::META_CLIENT_CAPABILITIES.into(), capabilities);
        meta.insert(
            modern::META_CLIENT_INFO.into(),
            json!({ "name": CLIENT_NAME, "version": env!("CARGO_PKG_VERSION") }),
        );
        params.insert("_meta".into(), Value::Object(meta));
        let name = params
            .get("name")
            .or_else(|| params.get("taskId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        headers.insert(
            "mcp-protocol-version",
            HeaderValue::from_static(modern::VERSION),
        );
        let value = |s: &str| {
            HeaderValue::from_str(s)
                .map_err(|_| McpError::Protocol(format!("'{s}' cannot be sent in a header")))
        };
        headers.insert(modern::METHOD_HEADER, value(method)?);
        if let Some(name) = &name {
            headers.insert(modern::NAME_HEADER, value(name)?);
        }
        if let Some(token) = &self.token {
            headers.insert(AUTHORIZATION, value(&format!("Bearer {token}"))?);
        }
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response = self
            .http
            .post(self.url.clone())
            .headers(headers)
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    McpError::Connect {
                        url: self.url.to_string(),
                        reason: e.to_string(),
                    }
                } else {
                    McpError::Transport(e.to_string())
                }
            })?;
        Ok((id, response))
    }

    /// Parse the answer to request `id` out of its HTTP response (JSON or
    /// an SSE body).
    async fn answer(&self, id: i64, response: reqwest::Response) -> Result<Value, McpError> {
        let status = response.status();
        let sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        let text = response
            .text()
            .await
            .map_err(|e| McpError::Transport(e.to_string()))?;
        let messages: Vec<Value> = if sse {
            SseParser::new()
                .push(text.as_bytes())
                .into_iter()
                .filter_map(|e| serde_json::from_str(&e.data).ok())
                .collect()
        } else {
            serde_json::from_str(&text)
                .map(|v| vec![v])
                .unwrap_or_default()
        };
        let answer = messages
            .into_iter()
            .find(|m| m.get("id") == Some(&json!(id)));
        match answer {
            Some(m) if m.get("error").is_some() => Err(McpError::Rpc(RpcError::from_json(
                m.get("error").unwrap_or(&Value::Null),
            ))),
            Some(m) if m.get("result").is_some() => Ok(m["result"].clone()),
            _ if !status.is_success() => Err(McpError::http(
                status.as_u16(),
                text.chars().take(300).collect(),
                self.token.is_some(),
            )),
            _ => Err(McpError::Protocol(format!(
                "no answer to request {id} in: {}",
                text.chars().take(300).collect::<String>()
            ))),
        }
    }
}

fn fail(e: &McpError) -> u8 {
    eprintln!("taskbroker: {e}");
    e.exit_code()
}

/// `taskbroker call --protocol 2026-07-28`.
pub async fn call(args: &CallArgs) -> u8 {
    let client = match StatelessClient::new(&args.conn, Answerer::new(args.input.clone())) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if args.ttl.is_some() {
        eprintln!(
            "taskbroker: --ttl is ignored with --protocol {}: the broker sets the ttl",
            modern::VERSION
        );
    }
    let mut params = json!({ "name": args.tool, "arguments": args.args });
    if let Some(meta) = args.task_meta() {
        params["_meta"] = meta;
    }
    let answer = tokio::select! {
        answer = call_answering(&client, params, args.task) => answer,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ntaskbroker: interrupted");
            return EXIT_INTERRUPTED;
        }
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            if e.rpc().is_some_and(|r| r.code.code() == -32021) && !args.task {
                eprintln!("taskbroker: call {}: {e} (add --task)", args.tool);
                return EXIT_FAILURE;
            }
            return fail(&e);
        }
    };
    match answer.get("resultType").and_then(Value::as_str) {
        Some("task") => {}
        // The broker ran it at once (a tool that never runs as a task).
        _ => return print_result(&answer, args.json),
    }
    let Some(task_id) = answer.get("taskId").and_then(Value::as_str) else {
        return fail(&McpError::Protocol(format!(
            "a task without taskId: {answer}"
        )));
    };
    if args.detach {
        println!("{task_id}");
        let _ = std::io::stdout().flush();
        eprintln!(
            "taskbroker: task {task_id} started; its result: taskbroker tasks result {task_id} \
             --protocol {}",
            modern::VERSION
        );
        return EXIT_OK;
    }
    eprintln!("taskbroker: task {task_id}");
    follow(&client, task_id, answer.clone(), args.json).await
}

/// `tools/call`, retried with the answers while the result is
/// `input_required` (the multi-round flow of plain calls; a task's first
/// questions, before it exists, come the same way).
async fn call_answering(
    client: &StatelessClient,
    mut params: Value,
    tasks: bool,
) -> Result<Value, McpError> {
    for _ in 0..MAX_INPUT_ROUNDS {
        let answer = client.request("tools/call", params.clone(), tasks).await?;
        if answer.get("resultType").and_then(Value::as_str) != Some("input_required") {
            return Ok(answer);
        }
        let requests = answer.get("inputRequests").unwrap_or(&Value::Null);
        let responses = client.answer_all(requests)?;
        let mut earlier = params
            .get("inputResponses")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        earlier.extend(responses);
        params["inputResponses"] = Value::Object(earlier);
        params["requestState"] = answer.get("requestState").cloned().unwrap_or(Value::Null);
    }
    Err(McpError::Protocol(format!(
        "the tool asked for input {MAX_INPUT_ROUNDS} times in a row; giving up"
    )))
}

/// Answer the `inputRequests` of a task in `input_required` that were not
/// answered yet, with `tasks/update`.
async fn answer_task(
    client: &StatelessClient,
    task_id: &str,
    task: &Value,
    answered: &mut std::collections::HashSet<String>,
) -> Result<(), McpError> {
    let Some(requests) = task.get("inputRequests").and_then(Value::as_object) else {
        return Ok(());
    };
    let open: Map<String, Value> = requests
        .iter()
        .filter(|(key, _)| !answered.contains(*key))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if open.is_empty() {
        return Ok(());
    }
    let responses = client.answer_all(&Value::Object(open))?;
    answered.extend(responses.keys().cloned());
    client
        .request(
            "tasks/update",
            json!({ "taskId": task_id, "inputResponses": responses }),
            true,
        )
        .await
        .map(drop)
}

/// Poll `tasks/get` until the task ends, answering its questions; print its
/// result or error.
async fn follow(client: &StatelessClient, task_id: &str, mut task: Value, json: bool) -> u8 {
    let progress = Progress::new(&format!("task {task_id}"));
    let mut answered = std::collections::HashSet::new();
    loop {
        let status = task.get("status").and_then(Value::as_str).unwrap_or("");
        match status {
            "completed" => {
                progress.clear();
                return match task.get("result") {
                    Some(result) => print_result(result, json),
                    None => fail(&McpError::Protocol(format!(
                        "completed without a result: {task}"
                    ))),
                };
            }
            "failed" => {
                progress.clear();
                if json {
                    print_json(&task);
                }
                let error = task.get("error").unwrap_or(&Value::Null);
                eprintln!(
                    "taskbroker: task {task_id} failed: {} (JSON-RPC error {})",
                    error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("no message"),
                    error.get("code").unwrap_or(&Value::Null)
                );
                return EXIT_FAILURE;
            }
            "cancelled" => {
                progress.clear();
                eprintln!("taskbroker: task {task_id} was cancelled");
                return EXIT_FAILURE;
            }
            "input_required" => {
                progress.clear();
                if let Err(e) = answer_task(client, task_id, &task, &mut answered).await {
                    let code = fail(&e);
                    if matches!(e, McpError::Input(_)) {
                        eprintln!(
                            "taskbroker: task {task_id} waits for that answer; give it later with: \
                             taskbroker tasks result {task_id} --protocol {} --input JSON",
                            modern::VERSION
                        );
                    }
                    return code;
                }
            }
            _ => {}
        }
        if let Some(message) = task.get("statusMessage").and_then(Value::as_str) {
            progress.message(&format!("task {task_id}: {status}: {message}"));
        }
        let wait = task
            .get("pollIntervalMs")
            .and_then(Value::as_u64)
            .unwrap_or(1000)
            .clamp(100, 5000);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
            _ = tokio::signal::ctrl_c() => {
                progress.clear();
                eprintln!(
                    "\ntaskbroker: interrupted; the task goes on (cancel it with: taskbroker tasks \
                     cancel {task_id} --protocol {})",
                    modern::VERSION
                );
                return EXIT_INTERRUPTED;
            }
        }
        task = match client
            .request("tasks/get", json!({ "taskId": task_id }), true)
            .await
        {
            Ok(t) => t,
            Err(e) => {
                progress.clear();
                return fail(&e);
            }
        };
    }
}

/// `taskbroker tasks ... --protocol 2026-07-28`.
pub async fn tasks(args: &TasksArgs) -> u8 {
    let (conn, id) = match &args.command {
        TasksCommand::List { .. } => {
            eprintln!(
                "taskbroker: MCP {} has no tasks/list (the tasks extension removed it); list \
                 with --protocol 2025-11-25, or keep the ids `call --task --detach` prints",
                modern::VERSION
            );
            return EXIT_USAGE;
        }
        TasksCommand::Get { conn, id }
        | TasksCommand::Result { conn, id, .. }
        | TasksCommand::Cancel { conn, id } => (conn, id),
    };
    let given = match &args.command {
        TasksCommand::Result { input, .. } => input.clone(),
        _ => None,
    };
    let client = match StatelessClient::new(conn, Answerer::new(given)) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let params = json!({ "taskId": id });
    match &args.command {
        TasksCommand::Cancel { .. } => {
            if let Err(e) = client.request("tasks/cancel", params.clone(), true).await {
                return fail(&e);
            }
            show(&client, params).await
        }
        TasksCommand::Result { .. } => match client.request("tasks/get", params, true).await {
            Ok(task) => follow(&client, id, task, true).await,
            Err(e) => fail(&e),
        },
        _ => show(&client, params).await,
    }
}

async fn show(client: &StatelessClient, params: Value) -> u8 {
    match client.request("tasks/get", params, true).await {
        Ok(task) => {
            print_json(&task);
            EXIT_OK
        }
        Err(e) if matches!(e, McpError::Connect { .. }) => {
            eprintln!("taskbroker: {e}");
            EXIT_UNREACHABLE
        }
        Err(e) => fail(&e),
    }
}
