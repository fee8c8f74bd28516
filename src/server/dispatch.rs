//! One match from method name to handler. Each handler returns a
//! [`Reply`]: a finished result, or a future (with notifications on the way)
//! that the transport streams over SSE or awaits for a JSON response.

use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::reply::{Reply, StreamItem};
use super::sessions::Session;
use super::{AppState, calls};
use crate::broker::{ResultLook, Task, TaskResult, WaitEvent};
use crate::mcp::{
    self, CallToolParams, ErrorCode, PaginatedParams, RequestId, RpcError, TaskIdParams,
    parse_params,
};
use crate::server::refusals::RpcRefusal;
use crate::store::TaskMessage;
use crate::tools::{LogLevel, ToolOutcome};

/// The `Task` wire object (2025-11-25).
pub fn task_json(task: &Task) -> Value {
    serde_json::to_value(mcp::Task {
        task_id: task.task_id.clone(),
        status: task.status.as_str().to_owned(),
        status_message: task.status_message.clone(),
        created_at: mcp::format_time(task.created_at),
        last_updated_at: mcp::format_time(task.updated_at),
        ttl: task.ttl_ms,
        poll_interval: task.poll_interval_ms,
    })
    .unwrap_or(Value::Null)
}

/// Route a request (other than initialize) to its handler. `sse`: the
/// client accepts an SSE answer.
pub async fn dispatch(
    state: &AppState,
    session: &Arc<Session>,
    sse: bool,
    headers: &HeaderMap,
    id: &RequestId,
    method: &str,
    params: Option<&Value>,
) -> Reply {
    match method {
        "ping" => Reply::Done(Ok(json!({}))),
        "logging/setLevel" => logging_set_level(session, params),
        "tools/list" => tools_list(state, session, params),
        "tools/call" => tools_call(state, session, sse, headers, id, params).await,
        "tasks/get" => tasks_get(state, session, params).await,
        "tasks/result" => tasks_result(state, session, params).await,
        "tasks/list" => tasks_list(state, session, params).await,
        "tasks/cancel" => tasks_cancel(state, session, params).await,
        other => Reply::err(RpcError::method_not_found(other)),
    }
}

fn logging_set_level(session: &Session, params: Option<&Value>) -> Reply {
    #[derive(serde::Deserialize)]
    struct SetLevel {
        level: String,
    }
    let p: SetLevel = match parse_params("logging/setLevel", params) {
        Ok(p) => p,
        Err(e) => return Reply::err(e),
    };
    match LogLevel::parse(&p.level) {
        Some(level) => {
            session.set_log_level(level);
            Reply::Done(Ok(json!({})))
        }
        None => Reply::err(RpcError::invalid_params(format!(
            "Invalid params for logging/setLevel: unknown level '{}' (expected one of debug, info, notice, warning, error, critical, alert, emergency)",
            p.level
        ))),
    }
}

fn tools_list(state: &AppState, session: &Session, params: Option<&Value>) -> Reply {
    // T-2: a `task` field here is ignored (tools/list is not task-capable).
    let params: PaginatedParams = match parse_params("tools/list", params) {
        Ok(p) => p,
        Err(e) => return Reply::err(e),
    };
    if params.cursor.is_some() {
        // Every tool fits on one page, so no cursor was ever handed out.
        return Reply::err(RpcError::invalid_params("Invalid cursor"));
    }
    let owner = session.owner();
    let tools: Vec<Value> = state
        .broker
        .tools()
        .definitions_for(owner.principal_name())
        .map(|d| d.to_json())
        .collect();
    Reply::Done(Ok(json!({ "tools": tools })))
}

async fn tools_call(
    state: &AppState,
    session: &Arc<Session>,
    sse: bool,
    headers: &HeaderMap,
    id: &RequestId,
    params: Option<&Value>,
) -> Reply {
    let meta = params.and_then(|p| p.get("_meta"));
    let trace = crate::traces::TraceContext::of_request(meta, Some(headers));
    let params: CallToolParams = match parse_params("tools/call", params) {
        Ok(p) => p,
        Err(e) => return Reply::err(e),
    };
    let arguments = params.arguments.unwrap_or_default();
    let progress_token = params.meta.and_then(|m| m.progress_token);
    let broker = &state.broker;
    let schedule = match crate::broker::schedule::Requested::of(meta) {
        Ok(schedule) => schedule,
        Err(e) => return Reply::err(e.to_rpc("create")),
    };
    if let Some(task) = params.task {
        let token = progress_token.map(|t| serde_json::to_value(t).unwrap_or(Value::Null));
        let idempotency_key = match crate::broker::idempotency::key_of(meta) {
            Ok(key) => key,
            Err(e) => return Reply::err(e.to_rpc("create")),
        };
        return match broker
            .tools_call_task(
                &crate::broker::Caller {
                    owner: &session.owner(),
                    session_id: Some(&session.id),
                    client_capabilities: None,
                    idempotency_key,
                    schedule,
                    trace: trace.as_ref(),
                },
                &params.name,
                arguments,
                task.ttl,
                token,
            )
            .await
        {
            Ok(task) => {
                state
                    .audit
                    .record("task.create", session, &task.task_id, &params.name);
                Reply::Done(Ok(json!({ "task": task_json(&task) })))
            }
            Err(e) => {
                log_broker_error(&e);
                Reply::err(e.to_rpc("create"))
            }
        };
    }
    let tool = match broker.tool_for_call(&params.name, &session.owner(), false) {
        Ok(t) => t,
        Err(e) => return Reply::err(e.to_rpc("call")),
    };
    if let Err(e) = schedule.refuse_plain(&params.name) {
        return Reply::err(e.to_rpc("call"));
    }
    let arguments = Value::Object(arguments);
    if let Err(e) = broker.check_arguments_size(&arguments) {
        return Reply::err(e.to_rpc("call"));
    }
    if let Err(reason) = broker.tools().validate(&params.name, &arguments) {
        return match ToolOutcome::tool_error(reason) {
            ToolOutcome::Result(v) => Reply::Done(Ok(v)),
            ToolOutcome::Error(e) => Reply::err(e),
        };
    }
    // A plain call runs here, on this request (no task row, no durability).
    calls::run(
        calls::PlainCall {
            session: session.clone(),
            requests: state.client_requests.clone(),
            progress_token,
            sse,
            request_id: id.clone(),
            trace,
        },
        tool,
        arguments,
    )
}

/// Audit a refused lookup (not found, expired: maybe someone else's task);
/// log store failures.
fn refused(
    state: &AppState,
    session: &Session,
    event: &'static str,
    task_id: &str,
    e: &crate::broker::BrokerError,
) {
    use crate::broker::BrokerError;
    match e {
        BrokerError::NotFound | BrokerError::Expired => {
            state.audit.refused(event, session, task_id, &e.to_string())
        }
        other => log_broker_error(other),
    }
}

fn log_broker_error(e: &crate::broker::BrokerError) {
    if let crate::broker::BrokerError::Store(inner) = e {
        tracing::error!(error = %inner, "store failure");
    }
}

async fn tasks_get(state: &AppState, session: &Arc<Session>, params: Option<&Value>) -> Reply {
    let p: TaskIdParams = match parse_params("tasks/get", params) {
        Ok(p) => p,
        Err(e) => return Reply::err(e),
    };
    match state.broker.tasks_get(&session.owner(), &p.task_id).await {
        // T-30: no related-task _meta on tasks/get results.
        Ok(task) => Reply::Done(Ok(task_json(&task))),
        Err(e) => {
            refused(state, session, "task.get", &p.task_id, &e);
            Reply::err(e.to_rpc("retrieve"))
        }
    }
}

/// The tasks/result answer for a terminal task, with related-task `_meta`
/// on success (T-16). Errors are returned exactly as stored (T-15).
fn result_reply(task_id: &str, result: TaskResult) -> Result<Value, Value> {
    match result {
        TaskResult::Result { mut value, .. } => {
            if let Value::Object(obj) = &mut value {
                let meta = obj.entry("_meta").or_insert_with(|| json!({}));
                if let Value::Object(meta) = meta {
                    meta.insert(mcp::RELATED_TASK_META.into(), json!({ "taskId": task_id }));
                }
            }
            Ok(value)
        }
        TaskResult::Error(error) => Err(error.to_rpc().to_json()),
        TaskResult::Cancelled => Err(RpcError {
            code: ErrorCode::RequestCancelled,
            message: format!("Task {task_id} was cancelled; it has no result"),
            data: Some(json!({ "taskId": task_id, "status": "cancelled" })),
        }
        .to_json()),
        TaskResult::Pending => Err(RpcError::internal().to_json()),
    }
}

async fn tasks_result(state: &AppState, session: &Arc<Session>, params: Option<&Value>) -> Reply {
    let p: TaskIdParams = match parse_params("tasks/result", params) {
        Ok(p) => p,
        Err(e) => return Reply::err(e),
    };
    let owner = session.owner();
    let pending = match state.broker.tasks_result_start(&owner, &p.task_id).await {
        Ok(ResultLook::Pending(pending)) => pending,
        Ok(ResultLook::Ready(done)) => {
            state
                .audit
                .record("task.result", session, &p.task_id, "terminal");
            return Reply::Done(result_reply(&p.task_id, done));
        }
        Err(e) => {
            refused(state, session, "task.result", &p.task_id, &e);
            return Reply::err(e.to_rpc("retrieve"));
        }
    };
    state
        .audit
        .record("task.result", session, &p.task_id, "waiting");
    // T-14: block until terminal; the transport streams this over SSE with
    // keep-alives when the client accepts it, and with what the task has for
    // the client meanwhile: progress under its original token (T-32), status
    // notifications (T-31), and its pending requests (T-26).
    let token = pending.task().progress_token;
    let (items_tx, items) = mpsc::unbounded_channel();
    let (events_tx, mut events) = mpsc::unbounded_channel::<WaitEvent>();
    let broker = state.broker.clone();
    // While this stream waits, the task's status changes go here only.
    let watch = state.session_streams.watch(&p.task_id);
    let outcome = async move {
        let forward = |event: WaitEvent| {
            if let WaitEvent::Status(task) = &event {
                watch.sent_status(task.status.as_str(), task.updated_at);
            }
            if let Some(message) = wait_message(event, token.as_ref()) {
                let _ = items_tx.send(StreamItem::Message(message));
            }
        };
        let wait = broker.tasks_result_wait(&owner, &p.task_id, pending, Some(events_tx));
        tokio::pin!(wait);
        let done = loop {
            tokio::select! {
                done = &mut wait => break done,
                Some(event) = events.recv() => forward(event),
            }
        };
        // What the wait said last (e.g. the terminal status) goes out before
        // the response.
        while let Ok(event) = events.try_recv() {
            forward(event);
        }
        match done {
            Ok(done) => result_reply(&p.task_id, done),
            Err(e) => {
                log_broker_error(&e);
                Err(e.to_rpc("retrieve").to_json())
            }
        }
    };
    Reply::Later {
        items: Some(items),
        outcome: Box::pin(outcome),
        // Waiting needs nobody once the client has gone; a pending request is
        // delivered again on the next tasks/result.
        resumable: false,
    }
}

/// The JSON-RPC message a waiting client gets for `event`.
fn wait_message(event: WaitEvent, token: Option<&Value>) -> Option<Value> {
    match event {
        WaitEvent::Progress(p) => {
            let token = token?;
            let mut params = Map::new();
            params.insert("progressToken".into(), token.clone());
            params.insert("progress".into(), json!(p.progress));
            if let Some(total) = p.total {
                params.insert("total".into(), json!(total));
            }
            if let Some(message) = &p.message {
                params.insert("message".into(), json!(message));
            }
            // T-28: notifications about a task carry related-task _meta.
            params.insert("_meta".into(), mcp::related_task_meta(&p.task_id));
            Some(mcp::notification(
                "notifications/progress",
                Value::Object(params),
            ))
        }
        // T-30: the full Task, without related-task _meta.
        WaitEvent::Status(task) => Some(mcp::notification(
            "notifications/tasks/status",
            task_json(&task),
        )),
        WaitEvent::Ask(m) => Some(task_request(&m)),
    }
}

async fn tasks_list(state: &AppState, session: &Arc<Session>, params: Option<&Value>) -> Reply {
    let p: PaginatedParams = match parse_params("tasks/list", params) {
        Ok(p) => p,
        Err(e) => return Reply::err(e),
    };
    match state
        .broker
        .tasks_list(&session.owner(), p.cursor.as_deref())
        .await
    {
        Ok((tasks, next)) => {
            let mut result = Map::new();
            result.insert("tasks".into(), tasks.iter().map(task_json).collect());
            if let Some(next) = next {
                result.insert("nextCursor".into(), json!(next));
            }
            Reply::Done(Ok(Value::Object(result)))
        }
        Err(e) => {
            log_broker_error(&e);
            Reply::err(e.to_rpc("list"))
        }
    }
}

async fn tasks_cancel(state: &AppState, session: &Arc<Session>, params: Option<&Value>) -> Reply {
    let p: TaskIdParams = match parse_params("tasks/cancel", params) {
        Ok(p) => p,
        Err(e) => return Reply::err(e),
    };
    match state
        .broker
        .tasks_cancel(&session.owner(), &p.task_id)
        .await
    {
        Ok(task) => {
            state
                .audit
                .record("task.cancel", session, &p.task_id, "cancelled");
            Reply::Done(Ok(task_json(&task)))
        }
        Err(e) => {
            refused(state, session, "task.cancel", &p.task_id, &e);
            Reply::err(e.to_rpc("cancel"))
        }
    }
}

/// A task's request to its client as a 2025-11-25 JSON-RPC request: the
/// params as the tool gave them, with the related-task `_meta` (T-25).
pub fn task_request(m: &TaskMessage) -> Value {
    let mut params: Value = serde_json::from_str(&m.params).unwrap_or_else(|_| json!({}));
    if let Value::Object(obj) = &mut params {
        let meta = obj.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(meta) = meta {
            meta.insert(
                mcp::RELATED_TASK_META.into(),
                json!({ "taskId": m.task_id }),
            );
        }
    }
    json!({ "jsonrpc": "2.0", "id": m.request_id, "method": m.method, "params": params })
}
