//! Fixture tools of the MCP conformance suite (`serve --conformance-tools`),
//! served by the broker's own tool machinery so the suite exercises the real
//! pipeline: content types, progress, logging, requests to the client
//! (sampling, elicitation) inside a call, and stream resumption.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{
    BeforeTask, LogLevel, TaskSupport, Tool, ToolContext, ToolDefinition, ToolFuture, ToolOutcome,
};

/// A 1x1 red PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV file.
const WAV: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

pub(super) type Body = fn(Value, ToolContext) -> ToolFuture<'static>;
pub(super) type Before = fn(Value, &Map<String, Value>) -> BeforeTask;

/// A fixture tool: a definition, a body, and optionally what it asks
/// before a 2026-07-28 task ([`Tool::before_task`]).
pub(super) struct Fixture {
    def: ToolDefinition,
    body: Body,
    before: Option<Before>,
}

impl Tool for Fixture {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn call(&self, arguments: Value, ctx: ToolContext) -> ToolFuture<'_> {
        (self.body)(arguments, ctx)
    }
    fn before_task(&self, arguments: Value, answers: &Map<String, Value>) -> BeforeTask {
        match self.before {
            Some(before) => before(arguments, answers),
            None => BeforeTask::Run(arguments),
        }
    }
}

impl Fixture {
    /// A plain-only fixture; `properties` and `required` make its inputSchema.
    pub(super) fn new(
        name: &str,
        description: &str,
        properties: Value,
        required: &[&str],
        body: Body,
    ) -> Self {
        let mut input_schema = json!({ "type": "object", "properties": properties });
        if !required.is_empty() {
            input_schema["required"] = json!(required);
        }
        Self::with_schema(name, description, input_schema, body)
    }
    /// A plain-only fixture with this inputSchema.
    pub(super) fn with_schema(
        name: &str,
        description: &str,
        input_schema: Value,
        body: Body,
    ) -> Self {
        Self {
            def: ToolDefinition {
                name: name.into(),
                description: description.into(),
                input_schema,
                output_schema: None,
                task_support: TaskSupport::Forbidden,
                max_attempts: 1,
                concurrency: None,
                global_concurrency: None,
                queue: Default::default(),
                retention: Default::default(),
                extra: Default::default(),
            },
            body,
            before: None,
        }
    }
    pub(super) fn task_support(mut self, task_support: TaskSupport) -> Self {
        self.def.task_support = task_support;
        self
    }
    pub(super) fn before_task(mut self, before: Before) -> Self {
        self.before = Some(before);
        self
    }
    pub(super) fn boxed(self) -> Arc<dyn Tool> {
        Arc::new(self)
    }
}

fn fixture(name: &str, description: &str, input_schema: Value, body: Body) -> Arc<dyn Tool> {
    Fixture::with_schema(name, description, input_schema, body).boxed()
}

/// A fixture that may also run as a task (its requests to the client then
/// go through input_required).
fn task_capable(tool: Arc<dyn Tool>) -> Arc<dyn Tool> {
    let fixture = tool.definition().clone();
    Arc::new(TaskCapable {
        def: ToolDefinition {
            task_support: TaskSupport::Optional,
            ..fixture
        },
        inner: tool,
    })
}

struct TaskCapable {
    def: ToolDefinition,
    inner: Arc<dyn Tool>,
}

impl Tool for TaskCapable {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn call(&self, arguments: Value, ctx: ToolContext) -> ToolFuture<'_> {
        self.inner.call(arguments, ctx)
    }
}

fn no_args() -> Value {
    json!({ "type": "object", "properties": {} })
}

fn content(items: Value) -> ToolOutcome {
    ToolOutcome::Result(json!({ "content": items }))
}

/// Ask the client through `ctx`; a refusal becomes a tool error result.
async fn ask(ctx: &ToolContext, method: &str, params: Value) -> Result<Value, ToolOutcome> {
    ctx.request(method, params).await.map_err(|e| {
        ToolOutcome::tool_error(format!(
            "{method} failed: {} ({})",
            e.message,
            e.code.code()
        ))
    })
}

fn elicitation_text(prefix: &str, answer: &Value) -> String {
    let action = answer
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let content = answer.get("content").cloned().unwrap_or(Value::Null);
    format!("{prefix}: action={action}, content={content}")
}

/// The 2025-11-25 fixtures, for [`super::conformance_tools`].
pub(super) fn tools() -> Vec<Arc<dyn Tool>> {
    let tools: Vec<Arc<dyn Tool>> = vec![
        fixture(
            "test_simple_text",
            "Returns a fixed text.",
            no_args(),
            |_, _| {
                Box::pin(async { ToolOutcome::text("This is a simple text response for testing.") })
            },
        ),
        fixture(
            "test_image_content",
            "Returns a PNG image.",
            no_args(),
            |_, _| {
                Box::pin(async {
                    content(json!([{ "type": "image", "data": PNG, "mimeType": "image/png" }]))
                })
            },
        ),
        fixture(
            "test_audio_content",
            "Returns a WAV sound.",
            no_args(),
            |_, _| {
                Box::pin(async {
                    content(json!([{ "type": "audio", "data": WAV, "mimeType": "audio/wav" }]))
                })
            },
        ),
        fixture(
            "test_embedded_resource",
            "Returns an embedded resource.",
            no_args(),
            |_, _| {
                Box::pin(async {
                    content(json!([{ "type": "resource", "resource": {
                    "uri": "test://embedded-resource", "mimeType": "text/plain",
                    "text": "This is an embedded resource content." } }]))
                })
            },
        ),
        fixture(
            "test_multiple_content_types",
            "Returns text, an image and a resource.",
            no_args(),
            |_, _| {
                Box::pin(async {
                    content(json!([
                        { "type": "text", "text": "Multiple content types test:" },
                        { "type": "image", "data": PNG, "mimeType": "image/png" },
                        { "type": "resource", "resource": {
                            "uri": "test://mixed-content-resource", "mimeType": "application/json",
                            "text": "{\"test\":\"data\",\"value\":123}" } }
                    ]))
                })
            },
        ),
        fixture(
            "test_tool_with_logging",
            "Sends three log messages while it runs.",
            no_args(),
            |_, ctx| {
                Box::pin(async move {
                    for (i, text) in [
                        "Tool execution started",
                        "Tool processing data",
                        "Tool execution completed",
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        if i > 0 {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        ctx.log(LogLevel::Info, json!(text));
                    }
                    ToolOutcome::text("Tool with logging executed successfully")
                })
            },
        ),
        fixture(
            "test_error_handling",
            "Always returns isError: true.",
            no_args(),
            |_, _| {
                Box::pin(async {
                    ToolOutcome::tool_error("This tool intentionally returns an error for testing")
                })
            },
        ),
        fixture(
            "test_tool_with_progress",
            "Reports progress 0, 50, 100 of 100.",
            no_args(),
            |_, ctx| {
                Box::pin(async move {
                    for (i, p) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                        if i > 0 {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        ctx.progress(p, Some(100.0), Some(format!("progress {p}")));
                    }
                    ToolOutcome::text("Tool with progress completed")
                })
            },
        ),
        fixture(
            "test_sampling",
            "Asks the client's model (sampling/createMessage) and returns its answer.",
            json!({ "type": "object", "properties": { "prompt": { "type": "string" } }, "required": ["prompt"] }),
            |args, ctx| {
                Box::pin(async move {
                    let prompt = args
                        .get("prompt")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let params = json!({
                        "messages": [{ "role": "user", "content": { "type": "text", "text": prompt } }],
                        "maxTokens": 100
                    });
                    match ask(&ctx, "sampling/createMessage", params).await {
                        Ok(answer) => {
                            let text = answer
                                .pointer("/content/text")
                                .and_then(Value::as_str)
                                .unwrap_or("");
                            ToolOutcome::text(format!("LLM response: {text}"))
                        }
                        Err(refused) => refused,
                    }
                })
            },
        ),
        fixture(
            "test_elicitation",
            "Asks the user for a username and email (elicitation/create).",
            json!({ "type": "object", "properties": { "message": { "type": "string" } }, "required": ["message"] }),
            |args, ctx| {
                Box::pin(async move {
                    let message = args
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let params = json!({
                        "mode": "form",
                        "message": message,
                        "requestedSchema": {
                            "type": "object",
                            "properties": {
                                "username": { "type": "string", "description": "User's response" },
                                "email": { "type": "string", "description": "User's email address" }
                            },
                            "required": ["username", "email"]
                        }
                    });
                    match ask(&ctx, "elicitation/create", params).await {
                        Ok(answer) => ToolOutcome::text(elicitation_text("User response", &answer)),
                        Err(refused) => refused,
                    }
                })
            },
        ),
        fixture(
            "test_elicitation_sep1034_defaults",
            "Asks for a form whose fields have defaults (SEP-1034).",
            no_args(),
            |_, ctx| {
                Box::pin(async move {
                    let params = json!({
                        "mode": "form",
                        "message": "Please review and update the form fields with defaults",
                        "requestedSchema": {
                            "type": "object",
                            "properties": {
                                "name": { "type": "string", "description": "User name", "default": "John Doe" },
                                "age": { "type": "integer", "description": "User age", "default": 30 },
                                "score": { "type": "number", "description": "User score", "default": 95.5 },
                                "status": { "type": "string", "description": "User status",
                                            "enum": ["active", "inactive", "pending"], "default": "active" },
                                "verified": { "type": "boolean", "description": "Verification status", "default": true }
                            },
                            "required": []
                        }
                    });
                    match ask(&ctx, "elicitation/create", params).await {
                        Ok(answer) => {
                            ToolOutcome::text(elicitation_text("Elicitation completed", &answer))
                        }
                        Err(refused) => refused,
                    }
                })
            },
        ),
        fixture(
            "test_elicitation_sep1330_enums",
            "Asks for a form with every kind of enum (SEP-1330).",
            no_args(),
            |_, ctx| {
                Box::pin(async move {
                    let choice = |v: &str, t: &str| json!({ "const": v, "title": t });
                    let params = json!({
                        "mode": "form",
                        "message": "Please select options from the enum fields",
                        "requestedSchema": {
                            "type": "object",
                            "properties": {
                                "untitledSingle": { "type": "string", "description": "Select one option",
                                                    "enum": ["option1", "option2", "option3"] },
                                "titledSingle": { "type": "string", "description": "Select one option with titles",
                                                  "oneOf": [choice("value1", "First Option"), choice("value2", "Second Option"),
                                                            choice("value3", "Third Option")] },
                                "legacyEnum": { "type": "string", "description": "Select one option (legacy)",
                                                "enum": ["opt1", "opt2", "opt3"],
                                                "enumNames": ["Option One", "Option Two", "Option Three"] },
                                "untitledMulti": { "type": "array", "description": "Select multiple options",
                                                   "minItems": 1, "maxItems": 3,
                                                   "items": { "type": "string", "enum": ["option1", "option2", "option3"] } },
                                "titledMulti": { "type": "array", "description": "Select multiple options with titles",
                                                 "minItems": 1, "maxItems": 3,
                                                 "items": { "anyOf": [choice("value1", "First Choice"),
                                                                      choice("value2", "Second Choice"),
                                                                      choice("value3", "Third Choice")] } }
                            },
                            "required": []
                        }
                    });
                    match ask(&ctx, "elicitation/create", params).await {
                        Ok(answer) => {
                            ToolOutcome::text(elicitation_text("Elicitation completed", &answer))
                        }
                        Err(refused) => refused,
                    }
                })
            },
        ),
        fixture(
            "test_reconnection",
            "Closes its SSE stream mid-call; the result arrives on the resumed stream.",
            no_args(),
            |_, ctx| {
                Box::pin(async move {
                    ctx.close_stream();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    ToolOutcome::text("Reconnection test completed successfully")
                })
            },
        ),
        fixture(
            "json_schema_2020_12_tool",
            "Takes arguments described by a JSON Schema 2020-12 document: $defs with $anchor, \
             composition (allOf/anyOf) and conditionals (if/then/else).",
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {
                    "address": {
                        "$anchor": "addressDef",
                        "type": "object",
                        "properties": { "street": { "type": "string" }, "city": { "type": "string" } }
                    }
                },
                "properties": {
                    "name": { "type": "string" },
                    "address": { "$ref": "#/$defs/address" },
                    "contactMethod": { "type": "string", "enum": ["phone", "email"] },
                    "phone": { "type": "string" },
                    "email": { "type": "string" }
                },
                "allOf": [{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }],
                "if": { "properties": { "contactMethod": { "const": "phone" } }, "required": ["contactMethod"] },
                "then": { "required": ["phone"] },
                "else": { "required": ["email"] },
                "additionalProperties": false
            }),
            |args, _| {
                Box::pin(async move {
                    ToolOutcome::text(format!("JSON Schema 2020-12 tool called with: {args}"))
                })
            },
        ),
    ];
    // The fixtures that ask the client may run as tasks too.
    tools
        .into_iter()
        .map(|t| match t.definition().name.as_str() {
            "test_sampling" | "test_elicitation" => task_capable(t),
            _ => t,
        })
        .collect()
}
