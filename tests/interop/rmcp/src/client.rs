//! The rmcp side: a `ClientHandler`, connecting with the 2026-07-28
//! lifecycle (`server/discover`, no `initialize`), and thin wrappers over
//! rmcp's typed task calls that turn their errors into readable text.
//!
//! How rmcp 3.11 speaks MCP 2026-07-28 and the tasks extension (SEP-2663):
//!
//! - `ClientServiceExt::serve_with_lifecycle(transport,
//!   ClientLifecycleMode::Discover { preferred_versions })` sends
//!   `server/discover` instead of `initialize` and, once the server names a
//!   version it shares, stamps every later request's `params._meta` with
//!   `io.modelcontextprotocol/protocolVersion`, `.../clientInfo` and
//!   `.../clientCapabilities` (taken from `ClientHandler::get_info`). The
//!   Streamable HTTP transport then adds `MCP-Protocol-Version`,
//!   `Mcp-Method` and `Mcp-Name` (the tool name for tools/call, `taskId` for
//!   tasks/*), and keeps no session (no `Mcp-Session-Id`, no GET stream).
//! - The extension is declared in `ClientCapabilities::extensions` under
//!   `model::TASKS_EXTENSION_ID`; the server's declaration is read from
//!   `peer_info().capabilities.extensions` (`supports_tasks()`).
//! - `Peer::call_tool_once` returns `CallToolResponse::Task(CreateTaskResult)`
//!   when the server made a task (`resultType: "task"`), `Complete(..)`
//!   otherwise. `Peer::get_task`, `update_task`, `cancel_task` are the typed
//!   `tasks/get`, `tasks/update`, `tasks/cancel`; the last two return `()`
//!   on the `{resultType: "complete"}` ack.
//! - rmcp's Peer also puts a fresh `progressToken` into every request's
//!   `_meta`, tasks/get, tasks/update and tasks/cancel included, though
//!   SEP-2663 has no progress for tasks; servers may ignore it (taskbroker
//!   does), so it is only noted here.
//!
//! Where rmcp departs from the spec (SEP-2663 / 2026-07-28), a comment
//! says `RMCP vs SPEC`; where its API makes a client work around something,
//! `RMCP API`. `grep -rn 'RMCP vs SPEC' src/` lists them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, ClientRequest, CustomRequest, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationCapability, FormElicitationCapability, GetTaskParams,
    GetTaskResult, Implementation, InputRequest, InputRequests, InputResponses, JsonObject,
    NumberOrString, ProtocolVersion, SubscriptionsAcknowledgedNotificationParams,
    TASKS_EXTENSION_ID, TaskPayload, TaskStatusNotificationParams, UpdateTaskParams,
};
use rmcp::service::{
    ClientLifecycleMode, ClientServiceExt, NotificationContext, PeerRequestOptions, RequestContext,
    RequestHandle, RunningService,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, ServiceError};
use serde_json::{Value, json};

/// Every single MCP request gets this long before it counts as hung.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

pub type Client = RunningService<RoleClient, Interop>;

/// What this client declares per request (rmcp: per connection, see
/// [`Interop::new`]).
#[derive(Clone, Copy, Debug)]
pub struct Declares {
    pub tasks: bool,
    pub elicitation: bool,
}

/// The client handler. Answers `elicitation/create` (form mode) with
/// `accept {approved: true}` and remembers each question it was asked.
#[derive(Clone)]
pub struct Interop {
    info: ClientConfig,
    pub asked: Arc<Mutex<Vec<String>>>,
    /// Every `notifications/tasks`, in order.
    pub task_statuses: Arc<Mutex<Vec<TaskStatusNotificationParams>>>,
    /// Every `notifications/subscriptions/acknowledged`, as rmcp kept it.
    pub acknowledged: Arc<Mutex<Vec<Value>>>,
}

impl Interop {
    pub fn new(declares: Declares) -> Self {
        // RMCP API: ClientCapabilities::builder() (and its enable_tasks())
        // is compiled only with rmcp's `server` or `macros` feature; a
        // client-only build fills the fields by hand.
        let mut capabilities = ClientCapabilities::default();
        if declares.tasks {
            // SEP-2663: `extensions: {"io.modelcontextprotocol/tasks": {}}`.
            capabilities.extensions = Some(BTreeMap::from([(
                TASKS_EXTENSION_ID.to_owned(),
                JsonObject::new(),
            )]));
        }
        if declares.elicitation {
            capabilities.elicitation =
                Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        }
        // RMCP vs SPEC (design): in 2026-07-28 capabilities travel with each
        // request, and SEP-2663 has the client opt in "in its per-request
        // capabilities". rmcp fixes them per connection: the lifecycle
        // stamps `clientCapabilities` from get_info() onto every request and
        // overwrites any `_meta` a caller puts into the typed params (the
        // extension-level `_meta` wins the merge in model/serde_impl.rs).
        // Only the untyped `Peer::send_request_with_option(..,
        // PeerRequestOptions::with_meta(..))` can vary them per request, so
        // this test uses one client per set of capabilities.
        let info = ClientConfig::new(
            capabilities,
            Implementation::new("taskbroker-rmcp-interop", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::V_2026_07_28);
        Self {
            info,
            asked: Arc::default(),
            task_statuses: Arc::default(),
            acknowledged: Arc::default(),
        }
    }

    fn answer(&self, request: &ElicitRequestParams) -> ElicitResult {
        match request {
            ElicitRequestParams::FormElicitationParams { message, .. } => {
                lock(&self.asked).push(message.clone());
                ElicitResult::new(ElicitationAction::Accept)
                    .with_content(json!({ "approved": true }))
            }
            _ => ElicitResult::new(ElicitationAction::Decline),
        }
    }
}

impl ClientHandler for Interop {
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(self.answer(&request))
    }

    async fn on_task_status(
        &self,
        params: TaskStatusNotificationParams,
        _context: NotificationContext<RoleClient>,
    ) {
        lock(&self.task_statuses).push(params);
    }

    async fn on_subscriptions_acknowledged(
        &self,
        params: SubscriptionsAcknowledgedNotificationParams,
        _context: NotificationContext<RoleClient>,
    ) {
        lock(&self.acknowledged).push(serde_json::to_value(params).unwrap_or_default());
    }

    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Connect with the 2026-07-28 lifecycle: `server/discover`, and no
/// fallback to `initialize` (a server that does not speak 2026-07-28 is an
/// error here, not a reason to speak 2025-11-25).
pub async fn connect(url: &str, declares: Declares) -> Result<Client, String> {
    let transport = StreamableHttpClientTransport::from_uri(url.to_owned());
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    match tokio::time::timeout(
        REQUEST_TIMEOUT,
        Interop::new(declares).serve_with_lifecycle(transport, lifecycle),
    )
    .await
    {
        Err(_) => Err(format!(
            "server/discover to {url}: no answer in {REQUEST_TIMEOUT:?}"
        )),
        Ok(Err(e)) => Err(format!(
            "server/discover to {url} failed: {e} ({e:?}). A server that does not speak MCP \
             2026-07-28 answers server/discover with an error: this client needs the \
             2026-07-28 front end of taskbroker"
        )),
        Ok(Ok(client)) => Ok(client),
    }
}

/// Run one rmcp call with [`REQUEST_TIMEOUT`]; errors become text.
pub async fn timed<T>(
    what: &str,
    call: impl Future<Output = Result<T, ServiceError>>,
) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
        Err(_) => Err(format!("{what}: no answer in {REQUEST_TIMEOUT:?}")),
        Ok(Err(ServiceError::McpError(e))) => Err(format!(
            "{what}: JSON-RPC error {} {:?}{}",
            e.code.0,
            e.message,
            e.data.map(|d| format!(" data {d}")).unwrap_or_default()
        )),
        Ok(Err(ServiceError::UnexpectedResponse)) => Err(format!(
            "{what}: rmcp could not read the reply as this method's result \
             (ServiceError::UnexpectedResponse)"
        )),
        Ok(Err(e)) => Err(format!("{what}: {}", chain(&e))),
        Ok(Ok(v)) => Ok(v),
    }
}

/// An error and its sources, `: `-joined (rmcp's Display alone hides why
/// a transport failed).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text = format!("{text}: {s_text}");
        }
        source = s.source();
    }
    text
}

/// The same request again through rmcp's untyped API
/// (`ClientRequest::CustomRequest`), to show what the server sent when a
/// typed call said `UnexpectedResponse` (rmcp keeps the raw body to
/// itself). Only for requests that are safe to repeat (tasks/get).
pub async fn raw(peer: &Peer<RoleClient>, method: &str, params: Value) -> String {
    let request = ClientRequest::CustomRequest(CustomRequest::new(method, Some(params)));
    match timed(method, peer.send_request(request)).await {
        Ok(result) => serde_json::to_string(&result).unwrap_or_else(|e| e.to_string()),
        Err(e) => e,
    }
}

/// `tools/call` NAME ARGS, as rmcp's `call_tool_once` returns it.
pub async fn call(
    peer: &Peer<RoleClient>,
    name: &str,
    args: Value,
) -> Result<CallToolResponse, String> {
    let args = match args {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    // RMCP vs SPEC: `Peer::call_tool` / `RunningService::call_tool` (the
    // "high-level" call) fail with ServiceError::UnexpectedResponse when
    // the server answers with a CreateTaskResult (service/client.rs,
    // call_tool_with_mrtr_max_rounds); SEP-2663 says a client that declared
    // the extension MUST be prepared for either result and suggests SDKs
    // drive the polling behind their fixed-shape calls. `call_tool_once` is
    // the way in.
    timed(
        &format!("tools/call {name}"),
        peer.call_tool_once(CallToolRequestParams::new(name.to_owned()).with_arguments(args)),
    )
    .await
}

/// `tools/call` that must make a task: its taskId.
pub async fn call_task(peer: &Peer<RoleClient>, name: &str, args: Value) -> Result<String, String> {
    match call(peer, name, args).await? {
        CallToolResponse::Task(created) => {
            // RMCP vs SPEC (lenient): `Task::ttl_ms` is an Option read
            // with serde's default for a missing field, so a task without
            // the required `ttlMs` (number | null) reads as `null`, i.e.
            // unlimited, instead of being refused.
            //
            // RMCP vs SPEC (lenient): call_tool_once hands back a Task
            // whether or not this client declared the extension; SEP-2663
            // forbids the server to do that, and rmcp does not check
            // (check 3 does).
            if !created.result_type.is_task() {
                return Err(format!(
                    "CreateTaskResult with resultType {:?}",
                    created.result_type
                ));
            }
            if created.task.task_id.is_empty() {
                return Err("CreateTaskResult with an empty taskId".into());
            }
            Ok(created.task.task_id)
        }
        other => Err(format!(
            "tools/call {name}: expected a task, got {}",
            show_response(&other)
        )),
    }
}

pub fn show_response(response: &CallToolResponse) -> String {
    match response {
        CallToolResponse::Complete(r) => format!("a complete result {}", show(r)),
        CallToolResponse::InputRequired(r) => format!("an input_required result {}", show(r)),
        CallToolResponse::Task(r) => format!("a task {}", show(r)),
        _ => "an unknown kind of result".into(),
    }
}

pub fn show(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| e.to_string())
}

/// `tasks/get`. On `UnexpectedResponse` (rmcp could not read the reply as
/// a GetTaskResult), the raw reply is shown too.
pub async fn get(peer: &Peer<RoleClient>, task_id: &str) -> Result<GetTaskResult, String> {
    match timed("tasks/get", peer.get_task(GetTaskParams::new(task_id))).await {
        Ok(task) => {
            // SEP-2663: "The resultType field MUST be set to "complete"".
            // RMCP vs SPEC (lenient): GetTaskResult defaults an absent
            // resultType to "complete" (`#[serde(default)]`), so a server
            // that leaves it out passes unseen here; a wrong value shows.
            if !task.result_type.is_complete() {
                return Err(format!("tasks/get resultType {:?}", task.result_type));
            }
            Ok(task)
        }
        Err(e) if e.contains("UnexpectedResponse") => Err(format!(
            "{e}; the server sent: {}",
            raw(peer, "tasks/get", json!({ "taskId": task_id })).await
        )),
        Err(e) => Err(e),
    }
}

/// One word for a task's state, e.g. `working`, `input_required`.
pub fn status_of(task: &GetTaskResult) -> String {
    serde_json::to_value(task.task.status())
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{:?}", task.task.status()))
}

/// Poll tasks/get until `done` says so; honours pollIntervalMs (kept
/// between 100 ms and 1 s so the test stays quick). The error names every
/// state seen.
pub async fn poll_until(
    peer: &Peer<RoleClient>,
    task_id: &str,
    within: Duration,
    what: &str,
    done: impl Fn(&GetTaskResult) -> bool,
) -> Result<GetTaskResult, String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut seen: Vec<String> = Vec::new();
    loop {
        let task = get(peer, task_id).await?;
        if task.task.task.task_id != task_id {
            return Err(format!(
                "tasks/get {task_id} answered for task {}",
                task.task.task.task_id
            ));
        }
        let status = status_of(&task);
        if seen.last() != Some(&status) {
            seen.push(status);
        }
        if done(&task) {
            return Ok(task);
        }
        if task.task.status().is_terminal() || tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "task {task_id} did not become {what} within {within:?}; states seen: {}; last: {}",
                seen.join(" -> "),
                show(&task)
            ));
        }
        let interval = task
            .task
            .task
            .poll_interval_ms
            .unwrap_or(500)
            .clamp(100, 1000);
        tokio::time::sleep(Duration::from_millis(interval)).await;
    }
}

/// The tool result a completed task carries.
///
/// RMCP API: `TaskPayload::Completed { result }` is an untyped JsonObject
/// (the spec's `result: JSONObject`); a tools/call task's result is turned
/// into a CallToolResult here.
pub fn completed_result(task: &GetTaskResult) -> Result<CallToolResult, String> {
    match &task.task.payload {
        TaskPayload::Completed { result } => serde_json::from_value(Value::Object(result.clone()))
            .map_err(|e| {
                format!(
                    "the task's result is no CallToolResult ({e}): {}",
                    show(result)
                )
            }),
        _ => Err(format!(
            "task is {}, not completed: {}",
            status_of(task),
            show(task)
        )),
    }
}

/// The text of a CallToolResult's text blocks, joined.
pub fn text_of(result: &CallToolResult) -> String {
    serde_json::to_value(&result.content)
        .ok()
        .and_then(|v| {
            v.as_array().map(|blocks| {
                blocks
                    .iter()
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        })
        .unwrap_or_default()
}

/// The outstanding `inputRequests` of an input_required task.
pub fn input_requests(task: &GetTaskResult) -> Result<&InputRequests, String> {
    match &task.task.payload {
        TaskPayload::InputRequired { input_requests } => Ok(input_requests),
        _ => Err(format!("task is {}, not input_required", status_of(task))),
    }
}

/// The JSON-RPC method of an input request (`elicitation/create`, ...).
pub fn method_of(request: &InputRequest) -> String {
    serde_json::to_value(request)
        .ok()
        .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// Answer a task's input requests with this client's own handler.
///
/// RMCP API: rmcp routes the `inputRequests` of an MRTR
/// `InputRequiredResult` to the ClientHandler itself (call_tool's retry
/// loop), but the helper that does it (`fulfill_input_requests`) is private
/// and nothing routes a task's `inputRequests` (tasks/get) anywhere; the
/// application calls its handler and builds `InputResponses` itself.
pub async fn answer_with_handler(
    client: &Client,
    requests: &InputRequests,
) -> Result<InputResponses, String> {
    let mut responses = InputResponses::new();
    for (key, request) in requests {
        let InputRequest::Elicitation(elicit) = request else {
            return Err(format!(
                "input request {key} is {}, not elicitation/create",
                method_of(request)
            ));
        };
        let context = RequestContext::new(
            NumberOrString::String(key.as_str().into()),
            client.peer().clone(),
        );
        let answer = client
            .service()
            .create_elicitation(elicit.params.clone(), context)
            .await
            .map_err(|e| format!("the handler did not answer {key}: {e:?}"))?;
        responses.insert(
            key.clone(),
            serde_json::to_value(answer).map_err(|e| e.to_string())?,
        );
    }
    Ok(responses)
}

/// `tasks/update {taskId, inputResponses}`; Ok on the ack.
pub async fn update(
    peer: &Peer<RoleClient>,
    task_id: &str,
    responses: InputResponses,
) -> Result<(), String> {
    // RMCP vs SPEC (lenient): update_task (and cancel_task) also take a
    // bare `{}` (EmptyResult) as the ack, though SEP-2663 says the ack
    // MUST carry resultType "complete"; so a server that forgets it passes.
    timed(
        "tasks/update",
        peer.update_task(UpdateTaskParams::new(task_id, responses)),
    )
    .await
}

/// `tasks/cancel {taskId}`; Ok on the ack.
pub async fn cancel(peer: &Peer<RoleClient>, task_id: &str) -> Result<(), String> {
    timed(
        "tasks/cancel",
        peer.cancel_task(CancelTaskParams::new(task_id)),
    )
    .await
}

/// `subscriptions/listen {notifications: {taskIds}}`: the server streams
/// `notifications/tasks` for those tasks (to `on_task_status`) until the
/// returned request is cancelled.
///
/// RMCP vs SPEC: SEP-2663 adds `taskIds` to the `notifications` filter of
/// `subscriptions/listen` and to its acknowledgement; rmcp's
/// `SubscriptionFilter` has no such field (only the list_changed flags and
/// resourceSubscriptions), so the typed `Peer::listen` cannot ask for task
/// notifications and `on_subscriptions_acknowledged` gets the server's
/// `taskIds` dropped. rmcp does decode `notifications/tasks`
/// (`TaskStatusNotification`, a DetailedTask) and hands it to
/// `ClientHandler::on_task_status`; the request goes out through rmcp's
/// untyped `ClientRequest::CustomRequest`.
pub async fn listen_tasks(
    peer: &Peer<RoleClient>,
    task_ids: &[&str],
) -> Result<RequestHandle<RoleClient>, String> {
    let request = ClientRequest::CustomRequest(CustomRequest::new(
        "subscriptions/listen",
        Some(json!({ "notifications": { "taskIds": task_ids } })),
    ));
    timed(
        "subscriptions/listen",
        peer.send_request_with_option(request, PeerRequestOptions::no_options()),
    )
    .await
}
