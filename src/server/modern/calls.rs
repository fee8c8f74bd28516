//! `tools/call` for MCP 2026-07-28 clients. The server decides whether a
//! call becomes a task: it does when the request declared the tasks
//! extension and the tool may run as one; a task-only tool called without
//! the extension is -32021. Other calls run here, statelessly: what the
//! tool asks the client (elicitation, sampling, roots) ends the call with
//! `resultType: "input_required"` and a signed `requestState`; the client's
//! retry runs the tool again from the start, and each question already
//! answered is answered at once (multi-round requests, SEP-2322).

use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::input::{check_answer, undeclared};
use super::state::{self as request_state, StateError};
use super::{Refusal, Request, tasks};
use crate::broker::Caller;
use crate::broker::keys::KeyError;
use crate::broker::schedule::Requested;
use crate::clock::now_ms;
use crate::mcp::{self, RpcError, modern};
use crate::server::AppState;
use crate::server::refusals::RpcRefusal;
use crate::server::reply::StreamItem;
use crate::tools::{BeforeTask, TaskSupport, Tool, ToolContext, ToolEvent, ToolOutcome};

/// How long a run that has asked the client something goes on collecting
/// further questions asked at the same time (a tool that asks several at
/// once, e.g. with `join!`) before the call ends `input_required`.
const GATHER: Duration = Duration::from_millis(20);

/// `tools/call` params of 2026-07-28 (`task` is ignored, SEP-2663).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct CallParams {
    name: String,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
    #[serde(default)]
    input_responses: Option<Value>,
    #[serde(default)]
    request_state: Option<Value>,
}

/// What a call answers: now, or later with notifications on the way.
pub enum Answer {
    /// Known now.
    Now(Result<Value, Refusal>),
    /// Known when `outcome` resolves; `items` (progress, logs) go first.
    Later {
        /// Notifications while the tool runs.
        items: mpsc::UnboundedReceiver<StreamItem>,
        /// The result.
        outcome: BoxFuture<'static, Result<Value, Refusal>>,
    },
}

/// `tools/call`.
pub async fn call(state: &AppState, request: &Request<'_>) -> Answer {
    match start(state, request).await {
        Ok(answer) => answer,
        Err(refusal) => Answer::Now(Err(refusal)),
    }
}

async fn start(state: &AppState, request: &Request<'_>) -> Result<Answer, Refusal> {
    let p: CallParams = mcp::parse_params("tools/call", request.params).map_err(Refusal::rpc)?;
    let broker = &state.broker;
    let tool = broker
        .tools()
        .get_for(&p.name, request.owner.principal_name())
        .cloned()
        .ok_or_else(|| {
            Refusal::rpc(RpcError::invalid_params(format!(
                "Unknown tool: {}",
                p.name
            )))
        })?;
    let target = format!("tools/call:{}", p.name);
    let answers = answers_so_far(state, &target, &p).await?;
    let arguments = Value::Object(p.arguments.unwrap_or_default());
    let support = tool.definition().task_support;
    let envelope = &request.envelope;
    if envelope.declares_tasks() && support != TaskSupport::Forbidden {
        return create_task(
            state, request, &p.name, &*tool, arguments, &answers, &target,
        )
        .await;
    }
    if support == TaskSupport::Required {
        return Err(Refusal::rpc(modern::missing_capability(
            format!(
                "Tool '{}' runs only as a task: declare the extension {} in _meta \
                 {}.extensions",
                p.name,
                modern::TASKS_EXTENSION,
                modern::META_CLIENT_CAPABILITIES
            ),
            modern::tasks_capability(),
        )));
    }
    Requested::of(request.params.and_then(|p| p.get("_meta")))
        .and_then(|asked| asked.refuse_plain(&p.name))
        .map_err(|e| Refusal::rpc(e.to_rpc("call")))?;
    broker
        .check_arguments_size(&arguments)
        .map_err(|e| Refusal::rpc(e.to_rpc("call")))?;
    if let Err(reason) = broker.tools().validate(&p.name, &arguments) {
        return Ok(Answer::Now(outcome_result(ToolOutcome::tool_error(reason))));
    }
    Ok(run_plain(state, request, tool, arguments, answers, target))
}

/// The answers of earlier rounds (from a verified `requestState`) with this
/// round's `inputResponses` over them.
async fn answers_so_far(
    state: &AppState,
    target: &str,
    p: &CallParams,
) -> Result<Map<String, Value>, Refusal> {
    let mut answers = match &p.request_state {
        None | Some(Value::Null) => Map::new(),
        Some(Value::String(s)) => open_state(state, target, s).await?,
        Some(_) => {
            return Err(Refusal::rpc(RpcError::invalid_params(
                "Invalid params: requestState must be the string a previous result gave",
            )));
        }
    };
    match &p.input_responses {
        None => {}
        Some(Value::Object(given)) => {
            for (key, answer) in given {
                if !answer.is_object() {
                    return Err(Refusal::rpc(RpcError::invalid_params(format!(
                        "Invalid params: inputResponses.{key} must be an object (the client's \
                         result for that request)"
                    ))));
                }
                answers.insert(key.clone(), answer.clone());
            }
        }
        Some(_) => {
            return Err(Refusal::rpc(RpcError::invalid_params(
                "Invalid params: inputResponses must be an object of answers by key",
            )));
        }
    }
    Ok(answers)
}

/// A task for this call, after the rounds the tool wants before it.
async fn create_task(
    state: &AppState,
    request: &Request<'_>,
    name: &str,
    tool: &dyn Tool,
    arguments: Value,
    answers: &Map<String, Value>,
    target: &str,
) -> Result<Answer, Refusal> {
    let arguments = match tool.before_task(arguments, answers) {
        BeforeTask::Run(arguments) => arguments,
        BeforeTask::Ask(requests) => {
            for (key, r) in &requests {
                let method = r.get("method").and_then(Value::as_str).unwrap_or("");
                let params = r.get("params").cloned().unwrap_or_else(|| json!({}));
                if let Some(required) = undeclared(&request.envelope.capabilities, method, &params)
                {
                    return Err(Refusal::rpc(modern::missing_capability(
                        format!("Tool '{name}' needs {method} (input '{key}') before it starts"),
                        required,
                    )));
                }
            }
            return Ok(Answer::Now(
                input_required(state, target, requests, answers).await,
            ));
        }
    };
    let Value::Object(arguments) = arguments else {
        return Err(Refusal::rpc(RpcError::invalid_params(
            "Invalid params: arguments must be an object",
        )));
    };
    let idempotency_key =
        crate::broker::idempotency::key_of(request.params.and_then(|p| p.get("_meta")))
            .map_err(|e| Refusal::rpc(e.to_rpc("create")))?;
    let schedule = Requested::of(request.params.and_then(|p| p.get("_meta")))
        .map_err(|e| Refusal::rpc(e.to_rpc("create")))?;
    let caller = Caller {
        owner: &request.owner,
        session_id: None,
        client_capabilities: Some(&request.envelope.capabilities),
        idempotency_key,
        schedule,
        trace: request.trace.as_ref(),
    };
    match state
        .broker
        .tools_call_task(&caller, name, arguments, None, None)
        .await
    {
        Ok(task) => {
            let who = crate::server::Actor::without_session(&request.owner);
            state
                .audit
                .record_by(&who, "task.create", &task.task_id, name);
            Ok(Answer::Now(Ok(tasks::create_result(&task))))
        }
        Err(e) => {
            if let crate::broker::BrokerError::Store(inner) = &e {
                tracing::error!(error = %inner, "store failure");
            }
            Err(Refusal::rpc(e.to_rpc("create")))
        }
    }
}

/// The answers a client's `requestState` carries, checked with the key of
/// its period.
async fn open_state(
    state: &AppState,
    target: &str,
    request_state: &str,
) -> Result<Map<String, Value>, Refusal> {
    let invalid = |e: StateError| Refusal::rpc(RpcError::invalid_params(e.to_string()));
    let epoch = request_state::epoch(request_state).map_err(invalid)?;
    let key = match state.broker.signing_keys().for_epoch(epoch, now_ms()).await {
        Ok(key) => key,
        Err(KeyError::Expired(hours)) => {
            return Err(invalid(StateError::Expired(format!(
                "request states are accepted for {hours} to {} hours",
                2 * hours
            ))));
        }
        Err(e) => return Err(key_failure(e)),
    };
    request_state::open(&key, target, request_state).map_err(invalid)
}

/// -32603 when no key can be read or made (the database is down): the
/// client may retry the same request.
fn key_failure(e: KeyError) -> Refusal {
    tracing::error!(error = %e, "request-state key unavailable");
    Refusal::rpc(RpcError::internal())
}

/// `{resultType: "input_required", inputRequests, requestState}`.
async fn input_required(
    state: &AppState,
    target: &str,
    requests: Map<String, Value>,
    answers: &Map<String, Value>,
) -> Result<Value, Refusal> {
    let key = state
        .broker
        .signing_keys()
        .current(now_ms())
        .await
        .map_err(key_failure)?;
    let request_state = request_state::sign(&key, target, answers);
    Ok(modern::with_result_type(
        json!({ "inputRequests": requests, "requestState": request_state }),
        "input_required",
    ))
}

fn outcome_result(outcome: ToolOutcome) -> Result<Value, Refusal> {
    match outcome {
        ToolOutcome::Result(v) => Ok(modern::complete(v)),
        ToolOutcome::Error(e) => Err(Refusal::rpc(e)),
    }
}

/// Run the tool on this request. Its progress (under the request's
/// progressToken) and logs (at the request's logLevel and above) are the
/// notifications; its questions end the run `input_required` unless
/// answered already.
fn run_plain(
    state: &AppState,
    request: &Request<'_>,
    tool: std::sync::Arc<dyn Tool>,
    arguments: Value,
    answers: Map<String, Value>,
    target: String,
) -> Answer {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (items_tx, items) = mpsc::unbounded_channel();
    let ctx = ToolContext::new(events_tx, CancellationToken::new(), None, 1)
        .with_trace(request.trace.clone());
    let capabilities = request.envelope.capabilities.clone();
    let progress_token = request.envelope.progress_token.clone();
    let log_level = request.envelope.log_level;
    let state = state.clone();
    let name = tool.definition().name.clone();
    let outcome = async move {
        let run = tool.call(arguments, ctx);
        tokio::pin!(run);
        let mut asked = Map::new();
        let mut used = Map::new();
        // Held so the tool stays parked on its questions until dropped.
        let mut parked: Vec<oneshot::Sender<Result<Value, RpcError>>> = Vec::new();
        let mut unnamed = 0usize;
        let gather = tokio::time::sleep(Duration::from_secs(u64::MAX / 4));
        tokio::pin!(gather);
        loop {
            tokio::select! {
                biased;
                outcome = &mut run => {
                    while let Ok(event) = events.try_recv() {
                        if let ToolEvent::Progress { .. } | ToolEvent::Log { .. } = event {
                            notify(&items_tx, &name, progress_token.as_ref(), log_level, event);
                        }
                    }
                    return outcome_result(outcome);
                }
                Some(event) = events.recv() => match event {
                    ToolEvent::Request { key, method, params, reply } => {
                        unnamed += 1;
                        let key = key.unwrap_or_else(|| format!("input-{unnamed}"));
                        if let Some(required) = undeclared(&capabilities, &method, &params) {
                            let _ = reply.send(Err(modern::missing_capability(
                                format!("{method} needs the client capability {required}, which this request did not declare"),
                                required,
                            )));
                        } else if let Some(answer) = answers.get(&key) {
                            check_answer(&key, &method, answer).map_err(Refusal::rpc)?;
                            used.insert(key, answer.clone());
                            let _ = reply.send(Ok(answer.clone()));
                        } else {
                            if asked.is_empty() {
                                gather.as_mut().reset(tokio::time::Instant::now() + GATHER);
                            }
                            asked.insert(key, json!({ "method": method, "params": params }));
                            parked.push(reply);
                        }
                    }
                    other => notify(&items_tx, &name, progress_token.as_ref(), log_level, other),
                },
                _ = &mut gather, if !asked.is_empty() => {
                    tracing::info!(tool = %name, asked = asked.len(), "plain call needs input: input_required");
                    drop(parked);
                    return input_required(&state, &target, asked, &used).await;
                }
            }
        }
    };
    Answer::Later {
        items,
        outcome: Box::pin(outcome),
    }
}

/// A tool's progress or log as a notification of this request's stream.
fn notify(
    items: &mpsc::UnboundedSender<StreamItem>,
    tool: &str,
    progress_token: Option<&Value>,
    log_level: Option<crate::tools::LogLevel>,
    event: ToolEvent,
) {
    let message = match event {
        ToolEvent::Progress {
            progress,
            total,
            message,
        } => {
            let Some(token) = progress_token else { return };
            let mut params = Map::new();
            params.insert("progressToken".into(), token.clone());
            params.insert("progress".into(), json!(progress));
            if let Some(total) = total {
                params.insert("total".into(), json!(total));
            }
            if let Some(message) = message {
                params.insert("message".into(), json!(message));
            }
            mcp::notification("notifications/progress", Value::Object(params))
        }
        ToolEvent::Log { level, data } => {
            if log_level.is_none_or(|wanted| level < wanted) {
                return;
            }
            mcp::notification(
                "notifications/message",
                json!({ "level": level.as_str(), "logger": tool, "data": data }),
            )
        }
        _ => return,
    };
    let _ = items.send(StreamItem::Message(message));
}

/// -32021 for a task-only method of a request without the extension.
pub(super) fn tasks_not_declared(method: &str) -> Refusal {
    Refusal::rpc(modern::missing_capability(
        format!(
            "{method} belongs to the tasks extension: declare {} in _meta {}.extensions",
            modern::TASKS_EXTENSION,
            modern::META_CLIENT_CAPABILITIES
        ),
        modern::tasks_capability(),
    ))
}
