//! Tools: the `Tool` trait, the registry that validates arguments, and the
//! built-in demo tools.

mod catalog;
mod command;
mod conformance;
mod conformance_modern;
mod demo;
mod queue;
mod retention;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use crate::mcp::LogLevel;
use crate::mcp::RpcError;

pub use catalog::{Refused, ToolCatalog};
pub use command::{CommandSpec, CommandTool};
pub use demo::demo_tools;
pub use queue::{PRIORITY_NAMES, QueuePolicy, QueueSettings, describe_priority, parse_priority};
pub use retention::RetentionSettings;

/// The fixture tools the MCP conformance suites call (`serve
/// --conformance-tools`): those of 2025-11-25 and of 2026-07-28.
pub fn conformance_tools() -> Vec<Arc<dyn Tool>> {
    let mut tools = conformance::tools();
    tools.extend(conformance_modern::tools());
    tools
}

/// `execution.taskSupport` of a tool (T-4..T-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    /// Never as a task (the default when absent): a task call is -32601.
    Forbidden,
    /// Either way.
    Optional,
    /// Only as a task: a plain call is -32601.
    Required,
}

impl TaskSupport {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forbidden => "forbidden",
            Self::Optional => "optional",
            Self::Required => "required",
        }
    }
}

/// Everything tools/list says about a tool, plus how the broker runs it.
#[derive(Debug, Clone)]
pub struct ToolDefinition {
    /// Unique name.
    pub name: String,
    /// For people and models.
    pub description: String,
    /// JSON Schema (2020-12) of the arguments object.
    pub input_schema: Value,
    /// JSON Schema of structuredContent, if the tool promises one.
    pub output_schema: Option<Value>,
    /// Whether it may or must run as a task.
    pub task_support: TaskSupport,
    /// Runs allowed when workers are lost before the task fails.
    pub max_attempts: i64,
    /// Jobs of this tool one process runs at once (`None`: only the
    /// process's own cap, `--workers`/`--concurrency`, applies). For tools
    /// that use a scarce resource: CPU, memory, a licence, a rate-limited API.
    pub concurrency: Option<usize>,
    /// Jobs of this tool running at once across every process on the
    /// database, enforced in the claim. Tasks waiting for client input do
    /// not count.
    pub global_concurrency: Option<u32>,
    /// Its jobs' priority and how far ahead calls may put their start.
    pub queue: QueuePolicy,
    /// What becomes of its tasks past their ttl (unset: the server's
    /// `[server]` settings).
    pub retention: RetentionSettings,
    /// Further members of the `Tool` object, served as they are (`title`,
    /// `annotations`, `icons`, `_meta`: what an upstream server listed).
    /// The members above win over any of the same name.
    pub extra: Map<String, Value>,
}

impl ToolDefinition {
    /// The `Tool` object of tools/list (H-9).
    pub fn to_json(&self) -> Value {
        let mut tool = self.extra.clone();
        tool.insert("name".into(), json!(self.name));
        tool.insert("description".into(), json!(self.description));
        tool.insert("inputSchema".into(), self.input_schema.clone());
        if let Some(schema) = &self.output_schema {
            tool.insert("outputSchema".into(), schema.clone());
        }
        tool.insert(
            "execution".into(),
            json!({ "taskSupport": self.task_support.as_str() }),
        );
        Value::Object(tool)
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// A `CallToolResult` (may have `isError: true`).
    Result(Value),
    /// The call failed as a JSON-RPC error.
    Error(RpcError),
}

impl ToolOutcome {
    /// A successful text result.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Result(json!({ "content": [{ "type": "text", "text": text.into() }] }))
    }
    /// A tool-level failure (`isError: true`) with a text explanation.
    pub fn tool_error(text: impl Into<String>) -> Self {
        Self::Result(json!({
            "content": [{ "type": "text", "text": text.into() }],
            "isError": true
        }))
    }
}

/// Something a running tool reports or asks for. Whoever runs the tool (the
/// server for a plain call, a worker for a task) decides how it reaches the
/// client.
#[derive(Debug)]
pub enum ToolEvent {
    /// notifications/progress material.
    Progress {
        /// Increases with every report.
        progress: f64,
        /// Known total, if any.
        total: Option<f64>,
        /// What is happening.
        message: Option<String>,
    },
    /// A new statusMessage for the task.
    Status(String),
    /// A log message for the client (notifications/message).
    Log {
        /// Syslog level name (debug .. emergency).
        level: LogLevel,
        /// Any JSON.
        data: Value,
    },
    /// A request to the client (sampling/createMessage, elicitation/create):
    /// the answer, or why there is none, goes back on `reply`.
    Request {
        /// The name the tool gives this request, stable across retries (MCP
        /// 2026-07-28 `inputRequests` keys); None: the runner names it.
        key: Option<String>,
        /// JSON-RPC method.
        method: String,
        /// Its params.
        params: Value,
        /// The client's `result`, or an error.
        reply: oneshot::Sender<Result<Value, RpcError>>,
    },
    /// Close the client's current SSE connection (it resumes with
    /// Last-Event-ID); the call goes on.
    CloseStream,
}

/// Where a task's run keeps what a later run of the same task needs to
/// resume rather than start again (a worker keeps it in the job's row,
/// fenced by its lease: a run that lost its lease cannot write it).
pub trait Checkpoints: Send + Sync + std::fmt::Debug {
    /// Replace the task's checkpoint with `value`; the error says why it
    /// was not kept.
    fn save<'a>(
        &'a self,
        value: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
}

/// What a tool sees of its call.
#[derive(Debug, Clone)]
pub struct ToolContext {
    events: mpsc::UnboundedSender<ToolEvent>,
    cancel: CancellationToken,
    task_id: Option<String>,
    attempt: i64,
    /// The checkpoint an earlier run of this task kept, if any.
    checkpoint: Option<String>,
    /// Where this run keeps one (None: a plain call, nothing outlives it).
    checkpoints: Option<Arc<dyn Checkpoints>>,
    /// The trace context of this run (its attempt's span), if any.
    trace: Option<crate::traces::TraceContext>,
}

impl ToolContext {
    /// A context whose events go to `events`.
    pub fn new(
        events: mpsc::UnboundedSender<ToolEvent>,
        cancel: CancellationToken,
        task_id: Option<String>,
        attempt: i64,
    ) -> Self {
        Self {
            events,
            cancel,
            task_id,
            attempt,
            checkpoint: None,
            checkpoints: None,
            trace: None,
        }
    }
    /// The same context, for a run traced under `trace` (what the tool
    /// passes on: `TRACEPARENT` to a command, `_meta` to an upstream).
    pub fn with_trace(mut self, trace: Option<crate::traces::TraceContext>) -> Self {
        self.trace = trace;
        self
    }
    /// The W3C trace context this run is part of, if any.
    pub fn trace(&self) -> Option<&crate::traces::TraceContext> {
        self.trace.as_ref()
    }
    /// The same context, for a task's run that resumes from `checkpoint`
    /// (an earlier run's) and keeps new ones in `checkpoints`.
    pub fn with_checkpoints(
        mut self,
        checkpoint: Option<String>,
        checkpoints: Arc<dyn Checkpoints>,
    ) -> Self {
        self.checkpoint = checkpoint;
        self.checkpoints = Some(checkpoints);
        self
    }
    /// What an earlier run of this task kept with
    /// [`ToolContext::save_checkpoint`] (None on a first run, and for plain
    /// calls).
    pub fn checkpoint(&self) -> Option<&str> {
        self.checkpoint.as_deref()
    }
    /// Keep `value` for a later run of this task (after a lost worker or a
    /// restart), durably, before going on. A plain call has no later run:
    /// nothing is kept and this succeeds.
    pub async fn save_checkpoint(&self, value: &str) -> Result<(), String> {
        match &self.checkpoints {
            Some(checkpoints) => checkpoints.save(value).await,
            None => Ok(()),
        }
    }
    /// Whether this run's checkpoints are kept (a task's run in a worker).
    pub fn keeps_checkpoints(&self) -> bool {
        self.checkpoints.is_some()
    }
    /// Report progress (ignored when nobody listens).
    pub fn progress(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        let _ = self.events.send(ToolEvent::Progress {
            progress,
            total,
            message,
        });
    }
    /// Set the task's statusMessage.
    pub fn status(&self, message: impl Into<String>) {
        let _ = self.events.send(ToolEvent::Status(message.into()));
    }
    /// Send a log message to the client (dropped below the session's level).
    pub fn log(&self, level: LogLevel, data: Value) {
        let _ = self.events.send(ToolEvent::Log { level, data });
    }
    /// Ask the client something (`sampling/createMessage`,
    /// `elicitation/create`) and wait for its answer.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.send_request(None, method, params).await
    }
    /// [`ToolContext::request`] under a name of the tool's choosing. In a
    /// plain call of a stateless (MCP 2026-07-28) client it is the key of
    /// an `inputRequests` entry, answered under that key in a later retry
    /// of the same call (the tool then runs again from the start and gets
    /// the answer at once): keys must be unique within a call and the same
    /// on every run. A task's requests are keyed by their stored request
    /// ids instead, which outlive restarts.
    pub async fn ask(&self, key: &str, method: &str, params: Value) -> Result<Value, RpcError> {
        self.send_request(Some(key.to_owned()), method, params)
            .await
    }
    async fn send_request(
        &self,
        key: Option<String>,
        method: &str,
        params: Value,
    ) -> Result<Value, RpcError> {
        let (reply, answer) = oneshot::channel();
        self.events
            .send(ToolEvent::Request {
                key,
                method: method.to_owned(),
                params,
                reply,
            })
            .map_err(|_| RpcError::internal())?;
        answer.await.unwrap_or_else(|_| {
            Err(RpcError::new(
                crate::mcp::ErrorCode::InternalError,
                format!("{method}: the request to the client was dropped"),
            ))
        })
    }
    /// Close the client's SSE connection now; it reconnects and resumes.
    pub fn close_stream(&self) {
        let _ = self.events.send(ToolEvent::CloseStream);
    }
    /// Fires when the call is cancelled; the tool's future is also dropped.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }
    /// The task this call runs for (None for a plain call).
    pub fn task_id(&self) -> Option<&str> {
        self.task_id.as_deref()
    }
    /// 1 for the first run of a task; more after a lost worker.
    pub fn attempt(&self) -> i64 {
        self.attempt
    }
}

/// What a tool needs before the broker creates its task (MCP 2026-07-28:
/// multi-round requests happen before a task exists, SEP-2663).
#[derive(Debug, Clone, PartialEq)]
pub enum BeforeTask {
    /// Create the task and run it with these arguments.
    Run(Value),
    /// Ask the client first: `inputRequests` by key (`{method, params}`).
    Ask(Map<String, Value>),
}

/// A boxed tool future.
pub type ToolFuture<'a> = Pin<Box<dyn Future<Output = ToolOutcome> + Send + 'a>>;

/// A tool the broker can run, in-process.
pub trait Tool: Send + Sync {
    /// Its definition (name, schemas, task support).
    fn definition(&self) -> &ToolDefinition;
    /// Run it with validated arguments.
    fn call(&self, arguments: Value, ctx: ToolContext) -> ToolFuture<'_>;
    /// Called by the 2026-07-28 front end before it creates a task for this
    /// tool, with the answers the client gave so far (by key): the
    /// arguments to run with, or what to ask first. The default asks
    /// nothing. 2025-11-25 clients have no such rounds: there the tool asks
    /// while it runs, with [`ToolContext::request`].
    fn before_task(&self, arguments: Value, _answers: &Map<String, Value>) -> BeforeTask {
        BeforeTask::Run(arguments)
    }
    /// Whether `principal` (None: a client without a token) may see and
    /// call it. Every client may, unless the tool says otherwise (an
    /// upstream server's `principals`).
    fn allows(&self, _principal: Option<&str>) -> bool {
        true
    }
    /// Whether some clients may not see it ([`Tool::allows`] is not always
    /// true): tool lists then differ by principal.
    fn restricted(&self) -> bool {
        false
    }
}

/// Why a registry could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two tools with one name.
    #[error("duplicate tool name '{0}'")]
    Duplicate(String),
    /// A schema that is not valid JSON Schema.
    #[error("tool '{name}': invalid inputSchema: {reason}")]
    BadSchema {
        /// The tool.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

struct Entry {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
}

impl Entry {
    fn new(tool: Arc<dyn Tool>) -> Result<Self, RegistryError> {
        let def = tool.definition();
        let validator =
            jsonschema::validator_for(&def.input_schema).map_err(|e| RegistryError::BadSchema {
                name: def.name.clone(),
                reason: e.to_string(),
            })?;
        Ok(Self { tool, validator })
    }
}

/// The tools this broker serves, by name, with compiled input validators.
pub struct Registry {
    tools: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    /// Build a registry; refuses duplicate names and invalid schemas.
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> Result<Self, RegistryError> {
        let mut registry = Self {
            tools: BTreeMap::new(),
        };
        for tool in tools {
            registry.add(tool)?;
        }
        Ok(registry)
    }

    /// Add one tool; refuses a name already served and an invalid schema
    /// (the registry is then unchanged).
    fn add(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.definition().name.clone();
        if self.tools.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        let entry = Entry::new(tool)?;
        self.tools.insert(name, entry);
        Ok(())
    }

    /// A tool by name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|e| &e.tool)
    }

    /// Every definition, by name.
    pub fn definitions(&self) -> impl Iterator<Item = &ToolDefinition> {
        self.tools.values().map(|e| e.tool.definition())
    }

    /// A tool by name, if `principal` may call it (one it may not is as
    /// unknown to it as one that does not exist).
    pub fn get_for(&self, name: &str, principal: Option<&str>) -> Option<&Arc<dyn Tool>> {
        self.get(name).filter(|t| t.allows(principal))
    }

    /// The definitions `principal` may see, by name.
    pub fn definitions_for<'a>(
        &'a self,
        principal: Option<&'a str>,
    ) -> impl Iterator<Item = &'a ToolDefinition> + 'a {
        self.tools
            .values()
            .filter(move |e| e.tool.allows(principal))
            .map(|e| e.tool.definition())
    }

    /// Whether some tool is hidden from some clients.
    pub fn restricted(&self) -> bool {
        self.tools.values().any(|e| e.tool.restricted())
    }

    /// Check arguments against the tool's inputSchema; the error lists every
    /// violation with its JSON pointer (H-10).
    pub fn validate(&self, name: &str, arguments: &Value) -> Result<(), String> {
        let Some(entry) = self.tools.get(name) else {
            return Err(format!("unknown tool '{name}'"));
        };
        let errors: Vec<String> = entry
            .validator
            .iter_errors(arguments)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "Invalid arguments for tool '{name}': {}",
                errors.join("; ")
            ))
        }
    }
}
