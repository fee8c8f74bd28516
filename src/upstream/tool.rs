//! An upstream server's tool, served by the broker as its own: a call (a
//! task's run in a worker, or a plain call) waits for the upstream's
//! connection, makes the call there, and relays what the upstream says on
//! the way (progress, logs, questions for the client) through the tool
//! context, as any tool does.
//!
//! A task's run keeps a checkpoint in its job's row before the call leaves
//! the broker, so a later run (after a lost worker or a restart) knows what
//! happened:
//! - `{"upstreamTask": id}`: the upstream runs the call as its own task
//!   (it declared `tasks.requests.tools.call`); the next run follows that
//!   task with `tasks/result` and never calls the tool again;
//! - `{"sent": true}`: the call may have reached the upstream; the next run
//!   sends it again only under `retry = "always"`, else the task fails
//!   saying why.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::link::Link;
use super::session::{AnswerFuture, CallHandler, ServerRequest};
use super::spec::{DEFAULT_MAX_ATTEMPTS, Retry, ToolSettings, UpstreamSpec, passed_through};
use super::stateless::Directed;
use super::{CallError, Session};
use crate::mcp::{ErrorCode, LogLevel, RpcError};
use crate::tools::{TaskSupport, Tool, ToolContext, ToolDefinition, ToolFuture, ToolOutcome};

/// ttl asked for an upstream's own task: long enough for any call the
/// broker would wait for; the upstream may grant less.
const UPSTREAM_TASK_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// One upstream tool as the broker serves it.
pub struct UpstreamTool {
    def: ToolDefinition,
    /// Its name on the upstream.
    remote: String,
    /// The upstream's own `execution.taskSupport` for it.
    remote_task_support: Option<String>,
    timeout: Option<Duration>,
    retry: Retry,
    link: Arc<Link>,
}

impl std::fmt::Debug for UpstreamTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTool")
            .field("name", &self.def.name)
            .field("upstream", &self.link.name())
            .finish_non_exhaustive()
    }
}

/// Why a listed tool cannot be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    /// Its name as listed (or a placeholder when it has none).
    pub tool: String,
    /// Why.
    pub reason: String,
}

impl UpstreamTool {
    /// The served tool for one `Tool` object of the upstream's
    /// `tools/list`; None when the config does not serve it.
    pub fn from_listed(
        spec: &UpstreamSpec,
        listed: &Value,
        link: Arc<Link>,
    ) -> Result<Option<Self>, Unusable> {
        let Some(object) = listed.as_object() else {
            return Err(Unusable {
                tool: "?".into(),
                reason: "a tools/list entry that is not an object".into(),
            });
        };
        let Some(remote) = object.get("name").and_then(Value::as_str) else {
            return Err(Unusable {
                tool: "?".into(),
                reason: "a tools/list entry without a name".into(),
            });
        };
        if !spec.serves(remote) {
            return Ok(None);
        }
        let unusable = |reason: &str| Unusable {
            tool: remote.to_owned(),
            reason: reason.to_owned(),
        };
        let input_schema = match object.get("inputSchema") {
            Some(schema @ Value::Object(_)) => schema.clone(),
            Some(_) => return Err(unusable("its inputSchema is not an object")),
            None => return Err(unusable("it has no inputSchema")),
        };
        let output_schema = match object.get("outputSchema") {
            None | Some(Value::Null) => None,
            Some(schema @ Value::Object(_)) => Some(schema.clone()),
            Some(_) => return Err(unusable("its outputSchema is not an object")),
        };
        let settings: ToolSettings = spec.settings(remote);
        Ok(Some(Self {
            def: ToolDefinition {
                name: spec.served_name(remote),
                description: object
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                input_schema,
                output_schema,
                task_support: settings.task_support.unwrap_or(TaskSupport::Optional),
                max_attempts: settings.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
                concurrency: settings.concurrency,
                global_concurrency: settings.global_concurrency,
                queue: settings.queue.policy(),
                retention: settings.retention,
                extra: passed_through(object),
            },
            remote: remote.to_owned(),
            remote_task_support: object
                .get("execution")
                .and_then(|e| e.get("taskSupport"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            timeout: settings.timeout,
            retry: settings.retry.unwrap_or_default(),
            link,
        }))
    }

    /// The upstream's name for this tool.
    pub fn remote_name(&self) -> &str {
        &self.remote
    }

    /// An error outcome naming this tool and its upstream.
    fn failure(&self, what: impl std::fmt::Display) -> ToolOutcome {
        ToolOutcome::Error(RpcError::new(
            ErrorCode::InternalError,
            format!(
                "tool '{}' of upstream '{}': {what}",
                self.remote,
                self.link.name()
            ),
        ))
    }

    /// The outcome of a request that gave no result.
    fn outcome_of(&self, error: CallError) -> ToolOutcome {
        match error {
            // The upstream's own JSON-RPC error is the call's, whole.
            CallError::Upstream { error, .. } => ToolOutcome::Error(error),
            other => self.failure(other),
        }
    }

    async fn run(&self, arguments: Value, ctx: &ToolContext) -> ToolOutcome {
        let cancel = ctx.cancelled().clone();
        match ctx.checkpoint().map(Checkpoint::parse) {
            Some(Checkpoint::UpstreamTask { id, session }) => {
                tracing::info!(upstream = %self.link.name(), tool = %self.remote, task_id = ?ctx.task_id(),
                               upstream_task = %id, "resuming: following the upstream's task, not calling again");
                return self.follow(&id, session.as_deref(), ctx, &cancel).await;
            }
            Some(Checkpoint::Sent) if self.retry == Retry::Never => {
                return self.failure(format!(
                    "the call may have reached the upstream before its worker was lost (run {} of this task); \
                     it is not sent again because the tool may not be safe to repeat \
                     (set retry = \"always\" for this upstream or tool if it is)",
                    ctx.attempt()
                ));
            }
            _ => {}
        }
        let Some(session) = self.link.session(&cancel).await else {
            return self.failure("cancelled while waiting for the upstream");
        };
        // A task's run follows an upstream task where the upstream offers
        // one (nothing then runs twice); a plain call does too when the
        // upstream runs the tool only as a task.
        let remote = self.remote_task_support.as_deref();
        let as_upstream_task = session.runs_tool_calls_as_tasks()
            && matches!(remote, Some("optional" | "required"))
            && (ctx.keeps_checkpoints() || remote == Some("required"));
        if ctx.keeps_checkpoints()
            && let Err(e) = ctx.save_checkpoint(&Checkpoint::Sent.to_text()).await
        {
            return self.failure(format!("the call was not made: {e}"));
        }
        if session.is_stateless() {
            return self.run_directed(&session, arguments, ctx, &cancel).await;
        }
        if as_upstream_task {
            return self
                .start_upstream_task(&session, arguments, ctx, &cancel)
                .await;
        }
        let relay: Arc<dyn CallHandler> = Arc::new(Relay { ctx: ctx.clone() });
        match session
            .call_tool_traced(&self.remote, arguments, ctx.trace(), relay, &cancel)
            .await
        {
            Ok(result) => ToolOutcome::Result(result),
            Err(e) => self.outcome_of(e),
        }
    }

    /// A call to a 2026-07-28 server, which decides whether it becomes a
    /// task (when it offers the tasks extension): a task is kept in the
    /// job's row (a later run follows it) and followed to its end.
    async fn run_directed(
        &self,
        session: &Session,
        arguments: Value,
        ctx: &ToolContext,
        cancel: &CancellationToken,
    ) -> ToolOutcome {
        let relay: Arc<dyn CallHandler> = Arc::new(Relay { ctx: ctx.clone() });
        let task_id = match session
            .call_tool_directed(&self.remote, arguments, ctx.trace(), relay, cancel)
            .await
        {
            Ok(Directed::Result(result)) => return ToolOutcome::Result(result),
            Ok(Directed::Task(task_id)) => task_id,
            Err(e) => return self.outcome_of(e),
        };
        if ctx.keeps_checkpoints() {
            let checkpoint = Checkpoint::UpstreamTask {
                id: task_id.clone(),
                session: None,
            };
            if let Err(e) = ctx.save_checkpoint(&checkpoint.to_text()).await {
                let _ = session.task_cancel(&task_id).await;
                return self.failure(format!("the upstream's task {task_id} was cancelled: {e}"));
            }
        }
        tracing::info!(upstream = %self.link.name(), tool = %self.remote, task_id = ?ctx.task_id(),
                       upstream_task = %task_id, "the upstream runs the call as its own task");
        self.follow(&task_id, None, ctx, cancel).await
    }

    async fn start_upstream_task(
        &self,
        session: &Session,
        arguments: Value,
        ctx: &ToolContext,
        cancel: &CancellationToken,
    ) -> ToolOutcome {
        let created = match session
            .call_tool_as_task_traced(&self.remote, arguments, UPSTREAM_TASK_TTL_MS, ctx.trace())
            .await
        {
            Ok(created) => created,
            Err(e) => return self.outcome_of(e),
        };
        let Some(task_id) = created.pointer("/task/taskId").and_then(Value::as_str) else {
            return self.failure("the upstream created a task without a taskId");
        };
        // The server session it belongs to (HTTP), so that a later run on
        // a new connection asks about it in that session.
        let in_session = session.upstream_session_id();
        let checkpoint = Checkpoint::UpstreamTask {
            id: task_id.to_owned(),
            session: in_session.clone(),
        };
        if let Err(e) = ctx.save_checkpoint(&checkpoint.to_text()).await {
            // Without the id kept, a later run could not follow it: stop it.
            let _ = session.task_cancel(task_id).await;
            return self.failure(format!("the upstream's task {task_id} was cancelled: {e}"));
        }
        tracing::info!(upstream = %self.link.name(), tool = %self.remote, task_id = ?ctx.task_id(),
                       upstream_task = %task_id, "the upstream runs the call as its own task");
        self.follow(task_id, in_session.as_deref(), ctx, cancel)
            .await
    }

    /// Follow the upstream's task to its result, across reconnections; a
    /// cancel of ours cancels it there. `task_session`: the server session
    /// (HTTP) the task was created in, asked in whatever connection is
    /// current (a broker restarted since has a new one).
    async fn follow(
        &self,
        task_id: &str,
        task_session: Option<&str>,
        ctx: &ToolContext,
        cancel: &CancellationToken,
    ) -> ToolOutcome {
        let relay: Arc<dyn CallHandler> = Arc::new(Relay { ctx: ctx.clone() });
        loop {
            let Some(session) = self.link.session(cancel).await else {
                return self.failure("cancelled while waiting for the upstream");
            };
            let in_session = task_session
                .filter(|s| session.upstream_session_id().as_deref() != Some(*s))
                .map(str::to_owned);
            match session
                .task_result_in(task_id, in_session.as_deref(), relay.clone(), cancel)
                .await
            {
                Ok(result) => return ToolOutcome::Result(result),
                Err(CallError::Cancelled { .. }) => {
                    let link = self.link.clone();
                    let task_id = task_id.to_owned();
                    // The run ends now; the upstream hears of it meanwhile.
                    tokio::spawn(async move {
                        if let Some(session) = link.current()
                            && let Err(e) = session
                                .task_cancel_in(&task_id, in_session.as_deref())
                                .await
                        {
                            tracing::warn!(upstream = %link.name(), upstream_task = %task_id, error = %e,
                                           "cancelling the upstream's task failed");
                        }
                    });
                    return self.failure("cancelled");
                }
                Err(CallError::Lost { reason, .. }) => {
                    tracing::warn!(upstream = %self.link.name(), upstream_task = %task_id, %reason,
                                   "connection lost while following the upstream's task; following it again once back");
                    // The link restarts the connection; wait for it.
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
                Err(e) => return self.outcome_of(e),
            }
        }
    }
}

impl Tool for UpstreamTool {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }

    fn allows(&self, principal: Option<&str>) -> bool {
        self.link.spec().allows(principal)
    }

    fn restricted(&self) -> bool {
        self.link.spec().principals.is_some()
    }

    fn call(&self, arguments: Value, ctx: ToolContext) -> ToolFuture<'_> {
        Box::pin(async move {
            let call = self.link.call_started();
            let outcome = match self.timeout {
                None => self.run(arguments, &ctx).await,
                Some(limit) => match tokio::time::timeout(limit, self.run(arguments, &ctx)).await {
                    Ok(outcome) => outcome,
                    Err(_) => self.failure(format!(
                        "no result within its timeout of {} (the call was cancelled upstream)",
                        humantime::format_duration(limit)
                    )),
                },
            };
            call.finished(&outcome);
            outcome
        })
    }
}

/// What a task's run kept before its call left the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Checkpoint {
    /// The call may have reached the upstream.
    Sent,
    /// The upstream runs it as its own task, with this id, created in
    /// this server session (HTTP).
    UpstreamTask {
        /// The upstream's task id.
        id: String,
        /// The server's session id it was created in, if any.
        session: Option<String>,
    },
    /// Something this version does not know (kept by another tool).
    Other,
}

impl Checkpoint {
    fn parse(text: &str) -> Self {
        let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
            return Self::Other;
        };
        if let Some(id) = map.get("upstreamTask").and_then(Value::as_str) {
            return Self::UpstreamTask {
                id: id.to_owned(),
                session: map
                    .get("upstreamSession")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            };
        }
        if map.get("sent") == Some(&Value::Bool(true)) {
            return Self::Sent;
        }
        Self::Other
    }

    fn to_text(&self) -> String {
        match self {
            Self::Sent => json!({ "sent": true }).to_string(),
            Self::UpstreamTask { id, session: None } => json!({ "upstreamTask": id }).to_string(),
            Self::UpstreamTask {
                id,
                session: Some(session),
            } => json!({ "upstreamTask": id, "upstreamSession": session }).to_string(),
            Self::Other => Value::Object(Map::new()).to_string(),
        }
    }
}

/// What the upstream says during a call, passed to the tool context: the
/// same paths as any tool's (progress, logs, status, questions).
struct Relay {
    ctx: ToolContext,
}

/// The longest status message a log message of the upstream becomes.
const STATUS_TEXT_MAX: usize = 500;

/// A log message's data as one line of text: the text itself, or its
/// `message` field (`msg`: FastMCP's), else its JSON; cut at [`STATUS_TEXT_MAX`] bytes.
fn status_text(data: &Value) -> String {
    let text = match data {
        Value::String(s) => s.clone(),
        other => match ["message", "msg"]
            .iter()
            .find_map(|key| other.get(key).and_then(Value::as_str))
        {
            Some(m) => m.to_owned(),
            None => other.to_string(),
        },
    };
    let mut end = text.len().min(STATUS_TEXT_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

impl CallHandler for Relay {
    fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        self.ctx.progress(progress, total, message);
    }

    fn log(&self, level: LogLevel, logger: Option<String>, data: Value) {
        // What the upstream says about the call (info and above) is also the
        // task's status message, kept with the task: a client that polls
        // later reads the last one.
        if level >= LogLevel::Info {
            self.ctx.status(status_text(&data));
        }
        let data = match logger {
            Some(logger) => json!({ "logger": logger, "data": data }),
            None => data,
        };
        self.ctx.log(level, data);
    }

    fn task_status(&self, task: Value) {
        if let Some(message) = task.get("statusMessage").and_then(Value::as_str) {
            self.ctx.status(message);
        }
    }

    fn request(&self, request: ServerRequest) -> AnswerFuture {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            tokio::select! {
                answer = ctx.request(&request.method, request.params) => answer,
                _ = request.withdrawn.cancelled() => Err(RpcError::new(
                    ErrorCode::InternalError,
                    format!("{}: withdrawn by the upstream", request.method),
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_read_back_as_written() {
        for c in [
            Checkpoint::Sent,
            Checkpoint::UpstreamTask {
                id: "t-1".into(),
                session: None,
            },
            Checkpoint::UpstreamTask {
                id: "t-2".into(),
                session: Some("s-9".into()),
            },
        ] {
            assert_eq!(Checkpoint::parse(&c.to_text()), c);
        }
        assert_eq!(Checkpoint::parse("not json"), Checkpoint::Other);
        assert_eq!(Checkpoint::parse(r#"{"mine":1}"#), Checkpoint::Other);
    }

    #[test]
    fn a_log_message_becomes_one_line_of_status() {
        assert_eq!(status_text(&json!("step 2 of 5")), "step 2 of 5");
        assert_eq!(
            status_text(&json!({ "message": "halfway", "n": 1 })),
            "halfway"
        );
        assert_eq!(status_text(&json!({ "n": 1 })), r#"{"n":1}"#);
        let long = "é".repeat(STATUS_TEXT_MAX);
        let cut = status_text(&json!(long));
        assert!(cut.len() <= STATUS_TEXT_MAX && cut.chars().all(|c| c == 'é'));
    }
}
