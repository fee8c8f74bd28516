//! The console's JSON under `/ui/api`: what the pages draw. Every answer
//! comes from index searches (the operator reads of
//! [`crate::store::OpsStore`]), so each stays fast at millions of tasks;
//! the one write is a cancel, through the broker as `tasks/cancel` does it.

use std::collections::BTreeMap;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Console;
use super::access::{self, Operator};
use super::pages::secure;
use crate::broker::BrokerError;
use crate::clock::now_ms;
use crate::server::Actor;
use crate::store::ops::{TaskFilter, TaskHistory, ToolRunning, WorkerInfo, WorkerLife};
use crate::store::{ResultKind, TaskStatus, UpstreamRow};

/// Tasks per page unless asked.
const PAGE: i64 = 50;
/// Tasks per page at most.
const PAGE_MAX: i64 = 200;
/// Stopped and dead worker pools shown besides the live ones.
const GONE_WORKERS: usize = 20;

fn reply(status: StatusCode, body: Value) -> Response {
    secure((status, axum::Json(body)).into_response())
}

/// A JSON error with the console's headers.
pub(super) fn error(status: StatusCode, message: &str) -> Response {
    reply(status, json!({ "error": message }))
}

fn internal(e: &dyn std::fmt::Display) -> Response {
    tracing::error!(error = %e, "console: reading the database failed");
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "Internal error: the database did not answer",
    )
}

/// Let an operator in, or answer why not.
async fn admit(console: &Console, headers: &HeaderMap, uri: &Uri) -> Result<Operator, Response> {
    access::check(console, headers, uri)
        .await
        .map_err(|d| error(d.status, &d.message))
}

/// `GET /ui/api/meta`: the tools served here, who is looking, the driver.
pub async fn meta(State(console): State<Console>, headers: HeaderMap, uri: Uri) -> Response {
    let operator = match admit(&console, &headers, &uri).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let served = console.app.broker.tools();
    let tools: Vec<&str> = served.definitions().map(|d| d.name.as_str()).collect();
    reply(
        StatusCode::OK,
        json!({
            "tools": tools,
            "principal": operator.principal,
            "tokens": operator.principal.is_some(),
            "version": env!("CARGO_PKG_VERSION"),
            "database": console.database,
        }),
    )
}

/// `GET /ui/api/overview`: open and finished counts, the queue, throughput
/// and failures by tool, and the worker pools.
pub async fn overview(State(console): State<Console>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(r) = admit(&console, &headers, &uri).await {
        return r;
    }
    let now = now_ms();
    let (stats, workers, upstreams) = match tokio::try_join!(
        console.store.ops_stats(now),
        console.store.ops_workers(),
        console.upstreams.upstreams_list()
    ) {
        Ok(all) => all,
        Err(e) => return internal(&e),
    };
    let mut tools: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for d in console.app.broker.tools().definitions() {
        tool_row(&mut tools, &d.name);
    }
    for q in &stats.queued {
        let r = tool_row(&mut tools, &q.tool);
        r.insert("queued".into(), q.jobs.into());
        r.insert("oldestQueuedAt".into(), q.oldest_since.into());
    }
    for x in &stats.running {
        tool_row(&mut tools, &x.tool).insert("running".into(), x.jobs.into());
    }
    for f in &stats.finished_by_tool {
        let r = tool_row(&mut tools, &f.tool);
        r.insert("finishedLastMinute".into(), f.last_minute.into());
        r.insert("finishedLastHour".into(), f.last_hour.into());
    }
    for f in &stats.failures {
        let r = tool_row(&mut tools, &f.tool);
        r.insert("failedLastHour".into(), f.failed.into());
        r.insert("lastFailureAt".into(), f.last_at.into());
        r.insert("lastFailure".into(), f.last_message.clone().into());
    }
    let mut open = Map::new();
    for status in [TaskStatus::Working, TaskStatus::InputRequired] {
        let n = stats
            .open
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n);
        open.insert(status.as_str().into(), n.into());
    }
    let mut finished = Map::new();
    for status in [
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ] {
        let (m, h) = stats
            .finished
            .iter()
            .find(|f| f.status == status)
            .map_or((0, 0), |f| (f.last_minute, f.last_hour));
        finished.insert(
            status.as_str().into(),
            json!({ "lastMinute": m, "lastHour": h }),
        );
    }
    reply(
        StatusCode::OK,
        json!({
            "now": now,
            "open": open,
            "finished": finished,
            "tools": tools.into_values().collect::<Vec<_>>(),
            "workers": workers_json(workers, now),
            "upstreams": upstreams_json(&console, upstreams, &stats.running),
        }),
    )
}

/// The overview's upstream servers: those of this broker's config (rows of
/// upstreams no longer configured stay in the database, unshown), with
/// the calls running now on the tools served from each.
fn upstreams_json(console: &Console, rows: Vec<UpstreamRow>, running: &[ToolRunning]) -> Value {
    let catalog = console.app.broker.catalog();
    let configured = catalog.groups();
    let rows = rows
        .into_iter()
        .filter(|r| configured.contains(&r.name))
        .map(|r| {
            let served: Vec<String> = r
                .served
                .as_deref()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or_default();
            let calls: i64 = running
                .iter()
                .filter(|x| served.contains(&x.tool))
                .map(|x| x.jobs)
                .sum();
            json!({
                "name": r.name,
                "state": r.state,
                "since": r.state_at,
                "restarts": r.restarts,
                "tools": served.len(),
                "listedAt": r.listed_at,
                "running": calls,
                "lastError": r.last_error,
            })
        })
        .collect();
    Value::Array(rows)
}

/// The overview's row of `tool`, zeros until told otherwise.
fn tool_row<'a>(
    tools: &'a mut BTreeMap<String, Map<String, Value>>,
    tool: &str,
) -> &'a mut Map<String, Value> {
    tools.entry(tool.to_owned()).or_insert_with(|| {
        let mut m = Map::new();
        m.insert("tool".into(), tool.into());
        for key in [
            "queued",
            "running",
            "finishedLastMinute",
            "finishedLastHour",
            "failedLastHour",
        ] {
            m.insert(key.into(), 0.into());
        }
        for key in ["oldestQueuedAt", "lastFailureAt", "lastFailure"] {
            m.insert(key.into(), Value::Null);
        }
        m
    })
}

/// Live and stopping pools first (newest first), then the latest few that
/// stopped or died.
fn workers_json(workers: Vec<WorkerInfo>, now: i64) -> Vec<Value> {
    let (mut up, mut gone): (Vec<_>, Vec<_>) = workers
        .into_iter()
        .map(|w| (w.life(now), w))
        .partition(|(life, _)| matches!(life, WorkerLife::Live | WorkerLife::Stopping));
    up.sort_by_key(|(_, w)| std::cmp::Reverse(w.started_at));
    gone.sort_by_key(|(_, w)| std::cmp::Reverse(w.stopped_at.unwrap_or(w.heartbeat_at)));
    gone.truncate(GONE_WORKERS);
    up.into_iter()
        .chain(gone)
        .map(|(life, w)| {
            json!({
                "workerId": w.worker_id,
                "kind": w.kind.as_str(),
                "state": life.as_str(),
                "host": w.host,
                "pid": w.pid,
                "concurrency": w.concurrency,
                "jobsRunning": w.jobs_running,
                "startedAt": w.started_at,
                "heartbeatAt": w.heartbeat_at,
                "stoppedAt": w.stopped_at,
            })
        })
        .collect()
}

/// The filters and page of `GET /ui/api/tasks`; empty fields are absent.
#[derive(Debug, Deserialize)]
pub struct TasksQuery {
    status: Option<String>,
    tool: Option<String>,
    owner: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

fn given(field: Option<String>) -> Option<String> {
    field.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

impl TasksQuery {
    /// The filter, the cursor and the page size, or a 400's sentence.
    fn read(self) -> Result<(TaskFilter, Option<i64>, i64), String> {
        let mut statuses = Vec::new();
        if let Some(list) = given(self.status) {
            for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                statuses.push(s.parse::<TaskStatus>().map_err(|_| {
                    format!(
                        "Bad Request: unknown status '{s}' (working, input_required, completed, failed, cancelled)"
                    )
                })?);
            }
        }
        let before = given(self.before)
            .map(|b| {
                b.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    format!("Bad Request: 'before' must be a positive row key, not '{b}'")
                })
            })
            .transpose()?;
        let limit = given(self.limit)
            .map(|l| {
                l.parse::<i64>()
                    .ok()
                    .filter(|n| (1..=PAGE_MAX).contains(n))
                    .ok_or_else(|| {
                        format!("Bad Request: 'limit' must be 1 to {PAGE_MAX}, not '{l}'")
                    })
            })
            .transpose()?
            .unwrap_or(PAGE);
        let filter = TaskFilter {
            statuses,
            tool: given(self.tool),
            owner: given(self.owner),
        };
        Ok((filter, before, limit))
    }
}

/// `GET /ui/api/tasks`: a keyset page of every owner's tasks, newest
/// first.
pub async fn tasks(
    State(console): State<Console>,
    headers: HeaderMap,
    uri: Uri,
    query: Result<Query<TasksQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Err(r) = admit(&console, &headers, &uri).await {
        return r;
    }
    let Ok(Query(query)) = query else {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: malformed query string",
        );
    };
    let (filter, before, limit) = match query.read() {
        Ok(q) => q,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let mut page = match console
        .store
        .ops_task_page(&filter, before, limit + 1)
        .await
    {
        Ok(page) => page,
        Err(e) => return internal(&e),
    };
    let more = page.len() as i64 > limit;
    page.truncate(usize::try_from(limit).unwrap_or(0));
    let next = more.then(|| page.last().map(|t| t.seq)).flatten();
    let tasks: Vec<Value> = page
        .iter()
        .map(|t| {
            json!({
                "seq": t.seq,
                "taskId": t.task_id,
                "status": t.status.as_str(),
                "tool": t.tool,
                "owner": t.owner,
                "createdAt": t.created_at,
                "updatedAt": t.updated_at,
                "statusMessage": t.status_message,
            })
        })
        .collect();
    reply(
        StatusCode::OK,
        json!({ "tasks": tasks, "nextBefore": next }),
    )
}

/// A task id the path cannot carry (say, bad %-encoding).
fn bad_path(e: &PathRejection) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        &format!("Bad Request: the task id in the path: {}", e.body_text()),
    )
}

/// Stored JSON text as JSON (kept as a string if it is not, which the
/// schema's checks rule out).
fn json_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// `GET /ui/api/tasks/{taskId}`: the task and all its history.
pub async fn task(
    State(console): State<Console>,
    task_id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    if let Err(r) = admit(&console, &headers, &uri).await {
        return r;
    }
    let task_id = match task_id {
        Ok(Path(id)) => id,
        Err(e) => return bad_path(&e),
    };
    match console.store.ops_task_history(&task_id).await {
        Ok(Some(history)) => reply(StatusCode::OK, history_json(&history)),
        Ok(None) => error(StatusCode::NOT_FOUND, "Not Found: no task with this id"),
        Err(e) => internal(&e),
    }
}

fn history_json(h: &TaskHistory) -> Value {
    let t = &h.task;
    // Every task that may run gets its job when it is created; only a task
    // whose arguments were refused (they do not match the tool's
    // inputSchema) is stored terminal without one. Its result is a tool
    // error, like a failure the tool reported, but the tool never ran.
    let arguments_refused = h.job.is_none() && t.tool_error;
    let task = json!({
        "seq": t.seq,
        "taskId": t.task_id,
        "owner": t.owner,
        "tool": t.tool,
        "arguments": json_text(&t.arguments),
        "status": t.status.as_str(),
        "statusMessage": t.status_message,
        "createdAt": t.created_at,
        "updatedAt": t.updated_at,
        "ttlMs": t.ttl_ms,
        "expiresAt": t.expires_at,
        "pollIntervalMs": t.poll_interval_ms,
        "resultKind": t.result_kind.map(|k| match k {
            ResultKind::Result => "result",
            ResultKind::Error => "error",
        }),
        "result": t.result.as_deref().map(json_text),
        "toolError": t.tool_error,
        "argumentsRefused": arguments_refused,
    });
    let job = h.job.as_ref().map(|j| {
        json!({
            "state": j.state,
            "attempt": j.attempt,
            "maxAttempts": j.max_attempts,
            "priority": j.priority,
            "runAfter": j.run_after,
            "leaseOwner": j.lease_owner,
            "leaseExpiresAt": j.lease_expires_at,
            "cancelRequested": j.cancel_requested,
            "lastError": j.last_error,
            "finishedAt": j.finished_at,
        })
    });
    let events: Vec<Value> = h
        .events
        .iter()
        .map(|e| {
            json!({
                "id": e.id,
                "from": e.from_status.map(TaskStatus::as_str),
                "to": e.to_status.as_str(),
                "message": e.message,
                "at": e.at,
            })
        })
        .collect();
    let job_events: Vec<Value> = h
        .job_events
        .iter()
        .map(|e| {
            json!({
                "id": e.id,
                "attempt": e.attempt,
                "event": e.event,
                "worker": e.worker,
                "reason": e.reason,
                "at": e.at,
            })
        })
        .collect();
    let progress: Vec<Value> = h
        .progress
        .iter()
        .map(|p| {
            json!({
                "id": p.id,
                "progress": p.progress,
                "total": p.total,
                "message": p.message,
                "at": p.at,
            })
        })
        .collect();
    let messages: Vec<Value> = h
        .messages
        .iter()
        .map(|m| {
            json!({
                "requestId": m.request_id,
                "method": m.method,
                "params": json_text(&m.params),
                "state": m.state,
                "response": m.response.as_deref().map(json_text),
                "createdAt": m.created_at,
                "answeredAt": m.answered_at,
            })
        })
        .collect();
    json!({
        "task": task,
        "job": job,
        "events": events,
        "jobEvents": job_events,
        "progress": progress,
        "messages": messages,
    })
}

/// `POST /ui/api/tasks/{taskId}/cancel`, JSON only: a cross-site form
/// cannot send `application/json` without the preflight this server never
/// grants.
pub async fn cancel(
    State(console): State<Console>,
    task_id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let operator = match admit(&console, &headers, &uri).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let task_id = match task_id {
        Ok(Path(id)) => id,
        Err(e) => return bad_path(&e),
    };
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported Media Type: a cancel is a POST with Content-Type: application/json",
        );
    }
    match console.app.broker.tasks_cancel_any(&task_id).await {
        Ok((task, owner)) => {
            let actor = Actor {
                principal: operator.principal.as_deref(),
                session: None,
                owner: owner.to_string(),
            };
            console.app.audit.record_by(
                &actor,
                "tasks/cancel",
                &task_id,
                "by an operator, in the console",
            );
            reply(
                StatusCode::OK,
                json!({ "task": {
                    "taskId": task.task_id,
                    "status": task.status.as_str(),
                    "statusMessage": task.status_message,
                }}),
            )
        }
        Err(BrokerError::Terminal(status)) => error(
            StatusCode::CONFLICT,
            &format!(
                "Conflict: the task is already {status}; only working or input_required tasks can be cancelled"
            ),
        ),
        Err(BrokerError::NotFound | BrokerError::Expired) => error(
            StatusCode::NOT_FOUND,
            "Not Found: no task with this id (or its ttl has passed)",
        ),
        Err(e) => internal(&e),
    }
}
