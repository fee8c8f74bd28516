//! The tasks extension of MCP 2026-07-28 (`io.modelcontextprotocol/tasks`,
//! SEP-2663) over the broker's tasks: the flat CreateTaskResult, the
//! DetailedTask of `tasks/get` with its outcome or open requests inline,
//! `tasks/update` answering those requests, and `tasks/cancel`'s plain
//! acknowledgement.
//!
//! The stored outcome is what happened; this front end maps it. A task
//! whose tool returned a result flagged as an error (`tool_error`) failed
//! to the broker and to 2025-11-25 clients, and is `completed` with that
//! result here (SEP-2663); an error record is `failed` with `error`.

use serde_json::{Map, Value, json};

use super::Refusal;
use crate::broker::{BrokerError, Owner, Task, TaskDetail, TaskResult, TaskStatus};
use crate::mcp::{self, RpcError, modern};
use crate::server::{Actor, AppState};
use crate::store::TaskMessage;

/// The fields every task shape shares (`ttlMs`, `pollIntervalMs`: the
/// 2026-07-28 names).
fn task_fields(task: &Task) -> Map<String, Value> {
    let mut obj = Map::new();
    obj.insert("taskId".into(), json!(task.task_id));
    if task.tool_error {
        // A tool that reported an error still completed (SEP-2663): the
        // result says what went wrong, not a statusMessage.
        obj.insert("status".into(), json!(TaskStatus::Completed.as_str()));
    } else {
        obj.insert("status".into(), json!(task.status.as_str()));
        if let Some(message) = &task.status_message {
            obj.insert("statusMessage".into(), json!(message));
        }
    }
    obj.insert("createdAt".into(), json!(mcp::format_time(task.created_at)));
    obj.insert(
        "lastUpdatedAt".into(),
        json!(mcp::format_time(task.updated_at)),
    );
    obj.insert("ttlMs".into(), json!(task.ttl_ms));
    if let Some(poll) = task.poll_interval_ms {
        obj.insert("pollIntervalMs".into(), json!(poll));
    }
    obj
}

/// The CreateTaskResult a task-creating `tools/call` answers with.
pub fn create_result(task: &Task) -> Value {
    modern::with_result_type(Value::Object(task_fields(task)), "task")
}

/// The DetailedTask of `tasks/get` and `notifications/tasks`.
pub fn detailed(detail: &TaskDetail) -> Value {
    let task = &detail.task;
    let mut inline = Map::new();
    match &detail.outcome {
        TaskResult::Result { value, .. } => {
            inline.insert("result".into(), inline_result(value));
        }
        TaskResult::Error(error) => {
            inline.insert("error".into(), error.to_rpc().to_json());
        }
        TaskResult::Cancelled | TaskResult::Pending => {}
    }
    if task.status == TaskStatus::InputRequired {
        inline.insert("inputRequests".into(), input_requests(&detail.pending));
    }
    let mut obj = task_fields(task);
    obj.extend(inline);
    modern::complete(Value::Object(obj))
}

/// The `result` of a completed task: the result the original request
/// would have answered, a 2026-07-28 CallToolResult, so with its
/// `resultType: "complete"` (clients that validate it as one, such as the
/// TypeScript ext-tasks package, refuse it without).
fn inline_result(result: &Value) -> Value {
    let mut result = result.clone();
    if let Value::Object(obj) = &mut result {
        obj.entry("resultType").or_insert_with(|| json!("complete"));
    }
    result
}

/// Open requests by key (the request id): `{method, params}`, the params
/// as the tool gave them.
fn input_requests(pending: &[TaskMessage]) -> Value {
    let mut requests = Map::new();
    for m in pending {
        let params: Value = serde_json::from_str(&m.params).unwrap_or_else(|_| json!({}));
        requests.insert(
            m.request_id.clone(),
            json!({ "method": m.method, "params": params }),
        );
    }
    Value::Object(requests)
}

/// `{taskId}` of tasks/get and tasks/cancel; `{taskId, inputResponses}` of
/// tasks/update.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TaskParams {
    task_id: String,
    #[serde(default)]
    input_responses: Option<Value>,
}

fn task_params(method: &str, params: Option<&Value>) -> Result<TaskParams, Refusal> {
    mcp::parse_params(method, params).map_err(Refusal::rpc)
}

/// Unknown, foreign or expired tasks are -32602 (SEP-2663), and audited
/// (someone may be guessing ids); store failures -32603.
fn refusal(
    state: &AppState,
    e: BrokerError,
    event: &'static str,
    owner: &Owner,
    task_id: &str,
) -> Refusal {
    match e {
        BrokerError::NotFound | BrokerError::Expired => {
            state.audit.refused_by(
                &Actor::without_session(owner),
                event,
                task_id,
                &e.to_string(),
            );
            Refusal::rpc(RpcError::invalid_params(format!(
                "Invalid params: {e} (unknown task id, or not yours)"
            )))
        }
        BrokerError::Store(inner) => {
            tracing::error!(error = %inner, "store failure");
            Refusal::rpc(RpcError::internal())
        }
        other => Refusal::rpc(RpcError::invalid_params(other.to_string())),
    }
}

/// tasks/get.
pub async fn get(
    state: &AppState,
    owner: &Owner,
    params: Option<&Value>,
) -> Result<Value, Refusal> {
    let p = task_params("tasks/get", params)?;
    let detail = state
        .broker
        .task_detail(owner, &p.task_id)
        .await
        .map_err(|e| refusal(state, e, "task.get", owner, &p.task_id))?;
    Ok(detailed(&detail))
}

/// tasks/update: answers to open requests; unknown or already answered
/// keys are ignored (SEP-2663), answers of the wrong shape refused.
pub async fn update(
    state: &AppState,
    owner: &Owner,
    params: Option<&Value>,
) -> Result<Value, Refusal> {
    let p = task_params("tasks/update", params)?;
    let answers = match p.input_responses {
        Some(Value::Object(answers)) => answers,
        _ => {
            return Err(Refusal::rpc(RpcError::invalid_params(
                "Invalid params: tasks/update needs inputResponses, an object of answers by key",
            )));
        }
    };
    let detail = state
        .broker
        .task_detail(owner, &p.task_id)
        .await
        .map_err(|e| refusal(state, e, "task.update", owner, &p.task_id))?;
    for m in &detail.pending {
        if let Some(answer) = answers.get(&m.request_id) {
            super::input::check_answer(&m.request_id, &m.method, answer).map_err(Refusal::rpc)?;
        }
    }
    let stored = state
        .broker
        .answer_task_requests(owner, &p.task_id, &answers)
        .await
        .map_err(|e| refusal(state, e, "task.update", owner, &p.task_id))?;
    tracing::info!(task_id = %p.task_id, answered = stored, given = answers.len(), "tasks/update");
    Ok(modern::complete(json!({})))
}

/// tasks/cancel: acknowledged with an empty result, also for a task that
/// has already ended.
pub async fn cancel(
    state: &AppState,
    owner: &Owner,
    params: Option<&Value>,
) -> Result<Value, Refusal> {
    let p = task_params("tasks/cancel", params)?;
    match state.broker.tasks_cancel(owner, &p.task_id).await {
        Ok(_) => {
            state.audit.record_by(
                &Actor::without_session(owner),
                "task.cancel",
                &p.task_id,
                "cancelled",
            );
            Ok(modern::complete(json!({})))
        }
        Err(BrokerError::Terminal(_)) => Ok(modern::complete(json!({}))),
        Err(e) => Err(refusal(state, e, "task.cancel", owner, &p.task_id)),
    }
}
