//! Demo tools, built in so a fresh `taskbroker serve` has something real to
//! run: `echo`, `sleep`, `sleep_as_task`, `fail`, `approve`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{TaskSupport, Tool, ToolContext, ToolDefinition, ToolFuture, ToolOutcome};

/// The demo tools, ready for a `Registry`.
pub fn demo_tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(Echo::new()),
        Arc::new(Sleep::new("sleep", TaskSupport::Optional)),
        Arc::new(Sleep::new("sleep_as_task", TaskSupport::Required)),
        Arc::new(Fail::new()),
        Arc::new(Approve::new()),
    ]
}

/// Longest sleep a demo call may ask for (one day).
const MAX_SLEEP_SECONDS: f64 = 86_400.0;

struct Echo {
    def: ToolDefinition,
}

impl Echo {
    fn new() -> Self {
        Self {
            def: ToolDefinition {
                name: "echo".into(),
                description: "Return the arguments as text and as structuredContent.".into(),
                input_schema: json!({ "type": "object" }),
                output_schema: None,
                task_support: TaskSupport::Forbidden,
                max_attempts: 3,
                concurrency: None,
                global_concurrency: None,
                queue: Default::default(),
                retention: Default::default(),
                extra: Default::default(),
            },
        }
    }
}

impl Tool for Echo {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn call(&self, arguments: Value, _ctx: ToolContext) -> ToolFuture<'_> {
        Box::pin(async move {
            ToolOutcome::Result(json!({
                "content": [{ "type": "text", "text": arguments.to_string() }],
                "structuredContent": arguments,
            }))
        })
    }
}

struct Sleep {
    def: ToolDefinition,
}

impl Sleep {
    fn new(name: &str, task_support: TaskSupport) -> Self {
        let description = match task_support {
            TaskSupport::Required => "Sleep for the given seconds; only as a task.",
            _ => "Sleep for the given seconds, reporting progress each second.",
        };
        let mut properties = json!({
            "seconds": { "type": "number", "minimum": 0, "maximum": MAX_SLEEP_SECONDS,
                         "description": "How long to sleep." }
        });
        if task_support != TaskSupport::Required {
            properties["message"] =
                json!({ "type": "string", "description": "Text to return when done." });
        }
        Self {
            def: ToolDefinition {
                name: name.into(),
                description: description.into(),
                input_schema: json!({
                    "type": "object",
                    "properties": properties,
                    "required": ["seconds"],
                    "additionalProperties": false
                }),
                output_schema: None,
                task_support,
                max_attempts: 3,
                concurrency: None,
                global_concurrency: None,
                queue: Default::default(),
                retention: Default::default(),
                extra: Default::default(),
            },
        }
    }
}

impl Tool for Sleep {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn call(&self, arguments: Value, ctx: ToolContext) -> ToolFuture<'_> {
        Box::pin(async move {
            let seconds = arguments
                .get("seconds")
                .and_then(Value::as_f64)
                .unwrap_or(0.0)
                .clamp(0.0, MAX_SLEEP_SECONDS);
            let mut slept = 0.0;
            while slept < seconds {
                let step = (seconds - slept).min(1.0);
                tokio::time::sleep(Duration::from_secs_f64(step)).await;
                slept += step;
                // Tenths: 1.2 of 1.2 s, never "2 of 1.2 s".
                let shown = (slept * 10.0).round() / 10.0;
                ctx.progress(
                    slept,
                    Some(seconds),
                    Some(format!("slept {shown} of {seconds} s")),
                );
            }
            let text = arguments
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| format!("slept {seconds} s"));
            ToolOutcome::text(text)
        })
    }
}

struct Fail {
    def: ToolDefinition,
}

impl Fail {
    fn new() -> Self {
        Self {
            def: ToolDefinition {
                name: "fail".into(),
                description: "Return a result with isError: true (a task of it ends failed)."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": { "message": { "type": "string" } },
                    "additionalProperties": false
                }),
                output_schema: None,
                task_support: TaskSupport::Optional,
                max_attempts: 3,
                concurrency: None,
                global_concurrency: None,
                queue: Default::default(),
                retention: Default::default(),
                extra: Default::default(),
            },
        }
    }
}

impl Tool for Fail {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn call(&self, arguments: Value, _ctx: ToolContext) -> ToolFuture<'_> {
        Box::pin(async move {
            let message = arguments
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("the fail tool failed, as asked");
            ToolOutcome::tool_error(message)
        })
    }
}

/// Asks the user a yes/no question through the client (elicitation, form
/// mode): as a task, the task goes input_required until the client answers.
struct Approve {
    def: ToolDefinition,
}

impl Approve {
    fn new() -> Self {
        Self {
            def: ToolDefinition {
                name: "approve".into(),
                description: "Ask the user to approve something (elicitation); returns the answer."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "question": { "type": "string", "description": "What to approve." },
                        "also": { "type": "string", "description": "A second question, asked at the same time; approved only if both are." }
                    },
                    "required": ["question"],
                    "additionalProperties": false
                }),
                output_schema: Some(json!({
                    "type": "object",
                    "properties": {
                        "action": { "type": "string", "enum": ["accept", "decline", "cancel"] },
                        "approved": { "type": "boolean" }
                    },
                    "required": ["action", "approved"]
                })),
                task_support: TaskSupport::Optional,
                max_attempts: 3,
                concurrency: None,
                global_concurrency: None,
                queue: Default::default(),
                retention: Default::default(),
                extra: Default::default(),
            },
        }
    }
}

impl Tool for Approve {
    fn definition(&self) -> &ToolDefinition {
        &self.def
    }
    fn call(&self, arguments: Value, ctx: ToolContext) -> ToolFuture<'_> {
        Box::pin(async move {
            let question = arguments
                .get("question")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let ask = |question: &str| {
                json!({
                    "mode": "form",
                    "message": question,
                    "requestedSchema": {
                        "type": "object",
                        "properties": {
                            "approved": { "type": "boolean", "title": "Approve?", "description": question }
                        },
                        "required": ["approved"]
                    }
                })
            };
            let answers = match arguments.get("also").and_then(Value::as_str) {
                None => ctx
                    .request("elicitation/create", ask(question))
                    .await
                    .map(|a| vec![a]),
                // Both requests are out at once.
                Some(also) => {
                    let (first, second) = tokio::join!(
                        ctx.request("elicitation/create", ask(question)),
                        ctx.request("elicitation/create", ask(also))
                    );
                    first.and_then(|a| second.map(|b| vec![a, b]))
                }
            };
            let answers = match answers {
                Ok(answers) => answers,
                Err(e) => {
                    return ToolOutcome::tool_error(format!(
                        "could not ask the user: {}",
                        e.message
                    ));
                }
            };
            // The first answer that is not an acceptance decides the action.
            let action = answers
                .iter()
                .map(|a| a.get("action").and_then(Value::as_str).unwrap_or("cancel"))
                .find(|action| *action != "accept")
                .unwrap_or("accept")
                .to_owned();
            let approved = action == "accept"
                && answers
                    .iter()
                    .all(|a| a.pointer("/content/approved").and_then(Value::as_bool) == Some(true));
            let text = match (action.as_str(), approved) {
                ("accept", true) => "approved".to_owned(),
                ("accept", false) => "not approved".to_owned(),
                ("decline", _) => "the user declined to answer".to_owned(),
                (other, _) => format!("the user did not answer ({other})"),
            };
            ToolOutcome::Result(json!({
                "content": [{ "type": "text", "text": text }],
                "structuredContent": { "action": action, "approved": approved }
            }))
        })
    }
}
