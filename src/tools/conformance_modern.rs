//! Fixture tools of the MCP 2026-07-28 conformance scenarios, served with
//! the older fixtures of [`super::conformance`] (`serve --conformance-tools`):
//!
//! - server-stateless: `test_missing_capability`, `test_streaming_elicitation`,
//!   `test_logging_tool`;
//! - input-required-result-* (SEP-2322, multi-round requests): the
//!   `test_input_required_result_*` tools;
//! - tasks-* (SEP-2663, the tasks extension): `greet`, `slow_compute`,
//!   `failing_job`, `protocol_error_job`, `confirm_delete`, `multi_input`,
//!   `test_tool_with_task`;
//! - http-custom-header-server-validation (SEP-2243): `test_header_param`.
//!
//! The tools only ask, with [`ToolContext::ask`] under the keys and texts the
//! suite expects; the front end turns the asks into `input_required` results
//! or task input requests, carries earlier answers in the signed
//! `requestState`, validates answers and checks client capabilities.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::conformance::Fixture;
use super::{BeforeTask, LogLevel, TaskSupport, Tool, ToolContext, ToolFuture, ToolOutcome};
use crate::mcp::{ErrorCode, RpcError};

/// Longest `slow_compute` run (one hour).
const MAX_COMPUTE_SECONDS: f64 = 3_600.0;

/// A fixture's work so far; `Err` ends the call early with that outcome.
type Step<T> = Result<T, ToolOutcome>;

/// A tool body from a fixture function that may end early.
fn run(work: impl Future<Output = Step<ToolOutcome>> + Send + 'static) -> ToolFuture<'static> {
    Box::pin(async move { work.await.unwrap_or_else(|early| early) })
}

/// `elicitation/create` params for a form of required primitive fields
/// (`(name, JSON type)`).
fn form(message: &str, fields: &[(&str, &str)]) -> Value {
    let properties: Map<String, Value> = fields
        .iter()
        .map(|(name, kind)| ((*name).to_owned(), json!({ "type": kind })))
        .collect();
    let required: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
    json!({
        "message": message,
        "requestedSchema": { "type": "object", "properties": properties, "required": required }
    })
}

/// `sampling/createMessage` params for one user text.
fn sampling(text: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [{ "role": "user", "content": { "type": "text", "text": text } }],
        "maxTokens": max_tokens
    })
}

/// Ask the client under `key`. A missing client capability ends the call
/// with that JSON-RPC error as it is (-32021 with `requiredCapabilities`:
/// the fixture cannot go on without it); any other failure is a tool error.
async fn ask(ctx: &ToolContext, key: &str, method: &str, params: Value) -> Step<Value> {
    ctx.ask(key, method, params)
        .await
        .map_err(|e| match e.code {
            ErrorCode::MissingCapability => ToolOutcome::Error(e),
            _ => ToolOutcome::tool_error(format!(
                "{method} ({key}) failed: {} ({})",
                e.message,
                e.code.code()
            )),
        })
}

async fn elicit(
    ctx: &ToolContext,
    key: &str,
    message: &str,
    fields: &[(&str, &str)],
) -> Step<Value> {
    ask(ctx, key, "elicitation/create", form(message, fields)).await
}

/// The content of an accepted elicitation; `None` if the user declined or
/// cancelled.
fn accepted(answer: &Value) -> Option<&Value> {
    (answer.get("action").and_then(Value::as_str) == Some("accept"))
        .then(|| answer.get("content").unwrap_or(&Value::Null))
}

/// The string `field` of an accepted elicitation. A declined or cancelled
/// one ends the call with a text saying so; an acceptance without the field
/// with a tool error.
fn accepted_str(answer: &Value, field: &str) -> Step<String> {
    let Some(content) = accepted(answer) else {
        let text = match answer.get("action").and_then(Value::as_str) {
            Some("decline") => "The user declined to answer.",
            _ => "The user cancelled the request.",
        };
        return Err(ToolOutcome::text(text));
    };
    content
        .get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ToolOutcome::tool_error(format!("the answer has no '{field}'")))
}

/// Whether an elicitation was accepted with the boolean `field` true.
fn accepted_true(answer: &Value, field: &str) -> bool {
    accepted(answer)
        .and_then(|c| c.get(field))
        .and_then(Value::as_bool)
        == Some(true)
}

/// `action` and content of an elicitation answer, for a summary.
fn summary(answer: &Value) -> String {
    let action = answer
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    match answer.get("content") {
        Some(content) => format!("{action} {content}"),
        None => action.to_owned(),
    }
}

fn str_arg<'a>(arguments: &'a Value, name: &str) -> Option<&'a str> {
    arguments.get(name).and_then(Value::as_str)
}

// --- server-stateless ---------------------------------------------------

async fn missing_capability(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let params = sampling("Say hello to the conformance suite.", 50);
    ask(&ctx, "sampling_request", "sampling/createMessage", params).await?;
    Ok(ToolOutcome::text("Success"))
}

async fn streaming_elicitation(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    ctx.progress(1.0, Some(1.0), Some("streaming".into()));
    Ok(ToolOutcome::text("Streaming complete"))
}

async fn logging_tool(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    ctx.log(LogLevel::Info, json!("Logging evaluated"));
    Ok(ToolOutcome::text("Logging evaluated"))
}

// --- input-required-result-* ---------------------------------------------

const NAME_QUESTION: &str = "What is your name?";

async fn irr_elicitation(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let answer = elicit(&ctx, "user_name", NAME_QUESTION, &[("name", "string")]).await?;
    let name = accepted_str(&answer, "name")?;
    Ok(ToolOutcome::text(format!("Hello, {name}!")))
}

async fn irr_sampling(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let params = sampling("What is the capital of France?", 100);
    let answer = ask(&ctx, "sample_request", "sampling/createMessage", params).await?;
    Ok(ToolOutcome::text(format!(
        "Sampling result: {}",
        sampled_text(&answer)
    )))
}

fn sampled_text(answer: &Value) -> &str {
    answer
        .pointer("/content/text")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn root_count(answer: &Value) -> usize {
    answer
        .get("roots")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

async fn irr_list_roots(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let answer = ask(&ctx, "roots_request", "roots/list", json!({})).await?;
    Ok(ToolOutcome::text(format!(
        "Found {} root(s)",
        root_count(&answer)
    )))
}

/// Asks to confirm (key `confirm`, `{ok: boolean}`); `done` if confirmed.
async fn confirm(ctx: &ToolContext, done: &str) -> Step<ToolOutcome> {
    let answer = elicit(ctx, "confirm", "Please confirm", &[("ok", "boolean")]).await?;
    if accepted_true(&answer, "ok") {
        Ok(ToolOutcome::text(done))
    } else {
        Ok(ToolOutcome::tool_error(format!(
            "not confirmed: {}",
            summary(&answer)
        )))
    }
}

async fn irr_request_state(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    confirm(&ctx, "state-ok: requestState validated").await
}

async fn irr_tampered_state(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    confirm(&ctx, "integrity-ok: state verified").await
}

async fn irr_multiple_inputs(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    // All three are out at once: one input_required result asks for them all.
    let (name, greeting, roots) = tokio::join!(
        elicit(&ctx, "user_name", NAME_QUESTION, &[("name", "string")]),
        ask(
            &ctx,
            "greeting",
            "sampling/createMessage",
            sampling("Generate a greeting", 50)
        ),
        ask(&ctx, "client_roots", "roots/list", json!({})),
    );
    let name = accepted_str(&name?, "name")?;
    let greeting = greeting?;
    let roots = roots?;
    Ok(ToolOutcome::text(format!(
        "Name: {name}; Greeting: {}; Roots: {}",
        sampled_text(&greeting),
        root_count(&roots)
    )))
}

async fn irr_multi_round(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let step1 = elicit(
        &ctx,
        "step1",
        "Step 1: What is your name?",
        &[("name", "string")],
    )
    .await?;
    let name = accepted_str(&step1, "name")?;
    let step2 = elicit(
        &ctx,
        "step2",
        "Step 2: What is your favorite color?",
        &[("color", "string")],
    )
    .await?;
    let color = accepted_str(&step2, "color")?;
    Ok(ToolOutcome::text(format!(
        "Multi-round complete for {name} who likes {color}"
    )))
}

async fn irr_capabilities(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    // Each request needs its own capability; the front end refuses the
    // undeclared ones at once and asks only for the others.
    let (elicited, sampled) = tokio::join!(
        ctx.ask(
            "elicit_input",
            "elicitation/create",
            form("Provide input", &[("value", "string")])
        ),
        ctx.ask(
            "sample_input",
            "sampling/createMessage",
            sampling("Sample request", 50)
        ),
    );
    let mut received = Vec::new();
    for (key, answer) in [("elicit_input", elicited), ("sample_input", sampled)] {
        match answer {
            Ok(_) => received.push(key),
            Err(e) if e.code == ErrorCode::MissingCapability => {}
            Err(e) => {
                return Ok(ToolOutcome::tool_error(format!(
                    "{key} failed: {}",
                    e.message
                )));
            }
        }
    }
    Ok(if received.is_empty() {
        ToolOutcome::text("No supported capabilities declared")
    } else {
        ToolOutcome::text(format!("capabilities-ok: received {}", received.join(", ")))
    })
}

// --- tasks-* ---------------------------------------------------------------

async fn greet(arguments: Value, _: ToolContext) -> Step<ToolOutcome> {
    let name = str_arg(&arguments, "name").unwrap_or("World");
    Ok(ToolOutcome::text(format!("Hello, {name}!")))
}

async fn slow_compute(arguments: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let seconds = arguments
        .get("seconds")
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
        .clamp(0.0, MAX_COMPUTE_SECONDS);
    let label = str_arg(&arguments, "label").unwrap_or("slow_compute");
    let mut elapsed = 0.0;
    while elapsed < seconds {
        let step = (seconds - elapsed).min(1.0);
        tokio::time::sleep(Duration::from_secs_f64(step)).await;
        elapsed += step;
        ctx.progress(
            elapsed,
            Some(seconds),
            Some(format!("{label}: {elapsed:.0} of {seconds} s")),
        );
    }
    Ok(ToolOutcome::text(format!(
        "{label}: computed after {seconds} s"
    )))
}

async fn failing_job(_: Value, _: ToolContext) -> Step<ToolOutcome> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(ToolOutcome::tool_error("failing_job failed on purpose"))
}

async fn protocol_error_job(_: Value, _: ToolContext) -> Step<ToolOutcome> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(ToolOutcome::Error(RpcError::new(
        ErrorCode::InternalError,
        "protocol_error_job: failed with a JSON-RPC error on purpose",
    )))
}

async fn confirm_delete(arguments: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let filename = str_arg(&arguments, "filename")
        .unwrap_or_default()
        .to_owned();
    let message = format!("Delete {filename}?");
    let answer = elicit(&ctx, "confirm", &message, &[("confirm", "boolean")]).await?;
    Ok(if accepted_true(&answer, "confirm") {
        ToolOutcome::text(format!("Deleted {filename}"))
    } else {
        ToolOutcome::text(format!("Kept {filename}"))
    })
}

async fn multi_input(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    // Both are outstanding at once.
    let (first, second) = tokio::join!(
        elicit(&ctx, "first", "First input", &[("name", "string")]),
        elicit(&ctx, "second", "Second input", &[("confirm", "boolean")]),
    );
    let (first, second) = (first?, second?);
    Ok(ToolOutcome::text(format!(
        "first: {}; second: {}",
        summary(&first),
        summary(&second)
    )))
}

/// The `user_name` request of `test_tool_with_task`, before and in the task.
fn user_name_request() -> Value {
    form(NAME_QUESTION, &[("name", "string")])
}

/// Ask for the name before the task exists (MCP 2026-07-28): the task runs
/// with the accepted name as its `name` argument. An answer without one
/// (declined, cancelled) still creates the task, which then asks itself.
fn tool_with_task_before(mut arguments: Value, answers: &Map<String, Value>) -> BeforeTask {
    if str_arg(&arguments, "name").is_some() {
        return BeforeTask::Run(arguments);
    }
    let Some(answer) = answers.get("user_name") else {
        let mut ask = Map::new();
        ask.insert(
            "user_name".into(),
            json!({ "method": "elicitation/create", "params": user_name_request() }),
        );
        return BeforeTask::Ask(ask);
    };
    if let Some(name) = accepted(answer)
        .and_then(|c| c.get("name"))
        .and_then(Value::as_str)
    {
        match arguments.as_object_mut() {
            Some(args) => {
                args.insert("name".into(), json!(name));
            }
            None => arguments = json!({ "name": name }),
        }
    }
    BeforeTask::Run(arguments)
}

async fn tool_with_task(arguments: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let name = match str_arg(&arguments, "name") {
        Some(name) => name.to_owned(),
        // No round before the task (a 2025-11-25 client, or no name given):
        // the task asks.
        None => {
            let answer = ask(&ctx, "user_name", "elicitation/create", user_name_request()).await?;
            accepted_str(&answer, "name")?
        }
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(ToolOutcome::text(format!("Hello, {name}! (from a task)")))
}

// --- http-custom-header-server-validation ----------------------------------

async fn header_param(arguments: Value, _: ToolContext) -> Step<ToolOutcome> {
    let region = str_arg(&arguments, "region").unwrap_or_default();
    Ok(ToolOutcome::text(format!("region: {region}")))
}

/// The 2026-07-28 fixtures, for [`super::conformance_tools`].
pub(super) fn tools() -> Vec<Arc<dyn Tool>> {
    let none = json!({});
    vec![
        // server-stateless
        Fixture::new(
            "test_missing_capability",
            "Needs the client's sampling capability: without it the call fails with -32021.",
            none.clone(),
            &[],
            |a, c| run(missing_capability(a, c)),
        ),
        Fixture::new(
            "test_streaming_elicitation",
            "Reports progress, then returns; never sends a request to the client on the stream.",
            none.clone(),
            &[],
            |a, c| run(streaming_elicitation(a, c)),
        ),
        Fixture::new(
            "test_logging_tool",
            "Logs one message (sent only if the request asked for a log level) and returns.",
            none.clone(),
            &[],
            |a, c| run(logging_tool(a, c)),
        ),
        // input-required-result-*
        Fixture::new(
            "test_input_required_result_elicitation",
            "Asks the user's name (input_required, key user_name) and greets them.",
            none.clone(),
            &[],
            |a, c| run(irr_elicitation(a, c)),
        ),
        Fixture::new(
            "test_input_required_result_sampling",
            "Asks the client's model a question (input_required, sampling) and returns its answer.",
            none.clone(),
            &[],
            |a, c| run(irr_sampling(a, c)),
        ),
        Fixture::new(
            "test_input_required_result_list_roots",
            "Asks the client's roots (input_required, roots/list) and counts them.",
            none.clone(),
            &[],
            |a, c| run(irr_list_roots(a, c)),
        ),
        Fixture::new(
            "test_input_required_result_request_state",
            "Asks for a confirmation; the retry must carry the requestState back.",
            none.clone(),
            &[],
            |a, c| run(irr_request_state(a, c)),
        ),
        Fixture::new(
            "test_input_required_result_multiple_inputs",
            "Asks for a name, a sampled greeting and the roots in one input_required result.",
            none.clone(),
            &[],
            |a, c| run(irr_multiple_inputs(a, c)),
        ),
        Fixture::new(
            "test_input_required_result_multi_round",
            "Asks a name, then a colour, in two successive input_required rounds.",
            none.clone(),
            &[],
            |a, c| run(irr_multi_round(a, c)),
        ),
        Fixture::new(
            "test_input_required_result_tampered_state",
            "Asks for a confirmation; a retry with an altered requestState is refused.",
            none.clone(),
            &[],
            |a, c| run(irr_tampered_state(a, c)),
        ),
        Fixture::new(
            "test_input_required_result_capabilities",
            "Asks by elicitation and by sampling, each only if the client declared it.",
            none.clone(),
            &[],
            |a, c| run(irr_capabilities(a, c)),
        ),
        // tasks-*
        Fixture::new(
            "greet",
            "Greets someone by name; never runs as a task.",
            json!({ "name": { "type": "string", "description": "Who to greet." } }),
            &["name"],
            |a, c| run(greet(a, c)),
        ),
        Fixture::new(
            "slow_compute",
            "Works for the given seconds, reporting progress; may run as a task.",
            json!({
                "seconds": { "type": "number", "minimum": 0, "maximum": MAX_COMPUTE_SECONDS,
                             "description": "How long to work." },
                "label": { "type": "string", "description": "Names the run in the result." }
            }),
            &["seconds"],
            |a, c| run(slow_compute(a, c)),
        )
        .task_support(TaskSupport::Optional),
        Fixture::new(
            "failing_job",
            "A task that ends with a tool error (isError: true) after about a second.",
            none.clone(),
            &[],
            |a, c| run(failing_job(a, c)),
        )
        .task_support(TaskSupport::Required),
        Fixture::new(
            "protocol_error_job",
            "A task that fails with a JSON-RPC error.",
            none.clone(),
            &[],
            |a, c| run(protocol_error_job(a, c)),
        )
        .task_support(TaskSupport::Required),
        Fixture::new(
            "confirm_delete",
            "Asks the user to confirm deleting a file (elicitation) and reports the choice.",
            json!({ "filename": { "type": "string", "description": "The file to delete." } }),
            &["filename"],
            |a, c| run(confirm_delete(a, c)),
        )
        .task_support(TaskSupport::Optional),
        Fixture::new(
            "multi_input",
            "Asks two questions at once (elicitation) and summarizes both answers.",
            none.clone(),
            &[],
            |a, c| run(multi_input(a, c)),
        )
        .task_support(TaskSupport::Optional),
        Fixture::new(
            "test_tool_with_task",
            "Asks the user's name before its task is created, then greets them from the task.",
            json!({ "name": { "type": "string", "description": "Who to greet (else asked)." } }),
            &[],
            |a, c| run(tool_with_task(a, c)),
        )
        .task_support(TaskSupport::Required)
        .before_task(tool_with_task_before),
        // http-custom-header-server-validation
        Fixture::new(
            "test_header_param",
            "Echoes its region argument, which the client also sends as the Mcp-Param-Region header.",
            json!({
                "region": { "type": "string", "x-mcp-header": "Region",
                            "description": "A region name, mirrored in the Mcp-Param-Region header." }
            }),
            &["region"],
            |a, c| run(header_param(a, c)),
        ),
    ]
    .into_iter()
    .map(Fixture::boxed)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn tool_with_task_asks_first() {
        let BeforeTask::Ask(ask) = tool_with_task_before(json!({}), &Map::new()) else {
            panic!("expected an ask");
        };
        assert_eq!(ask.len(), 1);
        assert_eq!(ask["user_name"]["method"], "elicitation/create");
        assert_eq!(ask["user_name"]["params"]["message"], NAME_QUESTION);
        assert_eq!(
            ask["user_name"]["params"]["requestedSchema"]["required"],
            json!(["name"])
        );
    }

    #[test]
    fn tool_with_task_runs_with_the_accepted_name() {
        let given = answers(json!({
            "user_name": { "action": "accept", "content": { "name": "Alice" } },
            "other": { "action": "accept", "content": {} }
        }));
        assert_eq!(
            tool_with_task_before(json!({}), &given),
            BeforeTask::Run(json!({ "name": "Alice" }))
        );
    }

    #[test]
    fn tool_with_task_runs_without_a_name_after_a_decline() {
        let given = answers(json!({ "user_name": { "action": "decline" } }));
        assert_eq!(
            tool_with_task_before(json!({}), &given),
            BeforeTask::Run(json!({}))
        );
    }

    #[test]
    fn tool_with_task_keeps_a_given_name() {
        assert_eq!(
            tool_with_task_before(json!({ "name": "Bob" }), &Map::new()),
            BeforeTask::Run(json!({ "name": "Bob" }))
        );
    }

    #[test]
    fn accepted_str_explains_missing_answers() {
        let ok = json!({ "action": "accept", "content": { "name": "Alice" } });
        assert_eq!(accepted_str(&ok, "name"), Ok("Alice".to_owned()));
        let declined = json!({ "action": "decline" });
        assert_eq!(
            accepted_str(&declined, "name"),
            Err(ToolOutcome::text("The user declined to answer."))
        );
        let Err(ToolOutcome::Result(missing)) = accepted_str(&ok, "color") else {
            panic!("expected a tool error");
        };
        assert_eq!(missing["isError"], true);
    }

    #[test]
    fn schemas_are_objects_with_properties() {
        for tool in tools() {
            let def = tool.definition();
            assert_eq!(def.input_schema["type"], "object", "{}", def.name);
            assert!(def.input_schema["properties"].is_object(), "{}", def.name);
            assert!(!def.description.is_empty(), "{}", def.name);
            jsonschema::validator_for(&def.input_schema).expect("valid schema");
        }
    }
}
