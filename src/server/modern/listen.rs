//! `subscriptions/listen` (2026-07-28): a POST answered with a long-lived
//! SSE stream instead of the 2025 GET stream. It opens with
//! `notifications/subscriptions/acknowledged` naming what it honours; this
//! broker honours `taskIds` (the tasks extension): the current state of
//! each of those tasks, then `notifications/tasks` with the full
//! DetailedTask whenever one changes. Every notification carries the
//! subscription id (the listen request's id) in `_meta`.
//!
//! `toolsListChanged` is honoured when the broker serves upstream servers'
//! tools (the only tools that change while it runs): each change clients
//! can see is `notifications/tools/list_changed` on the stream, as on a
//! 2025-11-25 session's GET stream. Other list-changed kinds are not
//! honoured (the broker serves no prompts or resources), so the
//! acknowledgement leaves them out.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::response::Response;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::{Refusal, Request, calls, tasks};
use crate::broker::{FeedEvent, TaskDetail};
use crate::mcp::{self, RpcError, modern};
use crate::server::AppState;
use crate::server::limits::hold_while_streaming;
use crate::server::sse::{KEEP_ALIVE, Numbered, sse_response};

/// Tasks one stream may follow.
const MAX_TASKS: usize = 1000;

/// Open a listen stream.
pub async fn listen(
    state: &AppState,
    request: &Request<'_>,
    sse: bool,
) -> Result<Response, Refusal> {
    if !sse {
        return Err(Refusal::bad_request(RpcError::invalid_request(
            "subscriptions/listen answers with an SSE stream: send Accept: text/event-stream",
        )));
    }
    let wanted = request
        .params
        .and_then(|p| p.get("notifications"))
        .unwrap_or(&Value::Null);
    let task_ids: Vec<String> = match wanted.get("taskIds") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|id| {
                id.as_str().map(str::to_owned).ok_or_else(|| {
                    Refusal::rpc(RpcError::invalid_params(
                        "Invalid params: notifications.taskIds must be an array of task ids",
                    ))
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(Refusal::rpc(RpcError::invalid_params(
                "Invalid params: notifications.taskIds must be an array of task ids",
            )));
        }
    };
    let tools_list_changed = match wanted.get("toolsListChanged") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(Refusal::rpc(RpcError::invalid_params(
                "Invalid params: notifications.toolsListChanged must be true or false",
            )));
        }
    };
    // Told only when tools can change: upstream servers are served.
    let mut tools_served = (tools_list_changed && !state.broker.catalog().groups().is_empty())
        .then(|| state.session_streams.tools_served());
    if !task_ids.is_empty() && !request.envelope.declares_tasks() {
        return Err(calls::tasks_not_declared("notifications.taskIds"));
    }
    if task_ids.len() > MAX_TASKS {
        return Err(Refusal::rpc(RpcError::invalid_params(format!(
            "Invalid params: at most {MAX_TASKS} taskIds per stream"
        ))));
    }
    let Some(slot) = state.open_streams.acquire() else {
        return Err(Refusal {
            status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
            error: RpcError::new(
                mcp::ErrorCode::Other(-32000),
                "Service Unavailable: the maximum of SSE streams is open (max_sse_streams); retry later",
            ),
        });
    };
    // Watch first, then read: no change falls between.
    let (changed_tx, mut changed) = mpsc::unbounded_channel::<String>();
    let mut followed = Vec::new();
    let mut first = Vec::new();
    for task_id in task_ids {
        let mut watch = state.broker.feed().watch_task(&task_id);
        // Unknown or not yours: not honoured (nothing to say about it).
        let Ok(detail) = state.broker.task_detail(&request.owner, &task_id).await else {
            continue;
        };
        first.push(detail);
        let tx = changed_tx.clone();
        let id = task_id.clone();
        // Ends with the stream (the receiver dropped), even for a task
        // that never changes again.
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = watch.recv() => match event {
                        Some(e) if matches!(*e, FeedEvent::Status(_) | FeedEvent::Written(..)) => {
                            if tx.send(id.clone()).is_err() {
                                break;
                            }
                        }
                        Some(_) => {}
                        None => break,
                    },
                    () = tx.closed() => break,
                }
            }
        });
        followed.push(task_id);
    }
    drop(changed_tx);
    let subscription = request.id.0.clone();
    let mut honoured = Map::new();
    if !followed.is_empty() {
        honoured.insert("taskIds".into(), json!(followed));
    }
    if tools_served.is_some() {
        honoured.insert("toolsListChanged".into(), json!(true));
    }
    let ack = mcp::notification(
        "notifications/subscriptions/acknowledged",
        json!({
            "_meta": { modern::META_SUBSCRIPTION_ID: subscription },
            "notifications": honoured,
        }),
    );
    let broker = state.broker.clone();
    let owner = request.owner.clone();
    let keep_alive = state.config.keep_alive;
    let stream = async_stream::stream! {
        let mut numbered = Numbered::new();
        let mut event = |message: &Value| numbered.event(message);
        yield Ok::<_, Infallible>(event(&ack));
        let mut last: std::collections::HashMap<String, (String, i64)> = Default::default();
        for detail in &first {
            last.insert(detail.task.task_id.clone(), seen(detail));
            yield Ok(event(&task_notification(detail, &subscription)));
        }
        let mut open = !first.is_empty();
        loop {
            tokio::select! {
                next = changed.recv(), if open => match next {
                    Some(task_id) => {
                        match broker.task_detail(&owner, &task_id).await {
                            Ok(detail) => {
                                // Several feed events may say one thing.
                                if last.get(&task_id) != Some(&seen(&detail)) {
                                    last.insert(task_id, seen(&detail));
                                    yield Ok(event(&task_notification(&detail, &subscription)));
                                }
                            }
                            Err(e) => tracing::info!(task_id, error = %e, "listen: task no longer readable"),
                        }
                    }
                    None => open = false,
                },
                Some(Ok(())) = async {
                    match tools_served.as_mut() {
                        Some(served) => Some(served.changed().await),
                        None => std::future::pending().await,
                    }
                } => {
                    yield Ok(event(&mcp::notification(
                        "notifications/tools/list_changed",
                        json!({ "_meta": { modern::META_SUBSCRIPTION_ID: subscription } }),
                    )));
                }
                _ = tokio::time::sleep(keep_alive) => yield Ok(Bytes::from_static(KEEP_ALIVE)),
            }
        }
    };
    Ok(hold_while_streaming(sse_response(stream), slot))
}

/// What makes a DetailedTask new: its status, when it last changed, and
/// how many requests it has open.
fn seen(detail: &TaskDetail) -> (String, i64) {
    (
        format!("{}:{}", detail.task.status.as_str(), detail.pending.len()),
        detail.task.updated_at,
    )
}

/// `notifications/tasks`: the DetailedTask, tagged with the subscription.
fn task_notification(detail: &TaskDetail, subscription: &Value) -> Value {
    let mut params = tasks::detailed(detail);
    if let Value::Object(obj) = &mut params {
        obj.remove("resultType");
        obj.insert(
            "_meta".into(),
            json!({ modern::META_SUBSCRIPTION_ID: subscription }),
        );
    }
    mcp::notification("notifications/tasks", params)
}
