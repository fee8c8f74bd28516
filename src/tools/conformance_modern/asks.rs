//! What every 2026-07-28 fixture does with the client: ask it (an
//! elicitation form, a sampling request) through [`ToolContext::ask`], and
//! read its answers; a fixture's work is a [`Step`] that may end early.

use std::future::Future;

use serde_json::{Map, Value, json};

use crate::mcp::ErrorCode;
use crate::tools::{ToolContext, ToolFuture, ToolOutcome};

/// The name question of `test_input_required_result_*` and
/// `test_tool_with_task`, in the words the suite expects.
pub(super) const NAME_QUESTION: &str = "What is your name?";

/// A fixture's work so far; `Err` ends the call early with that outcome.
pub(super) type Step<T> = Result<T, ToolOutcome>;

/// A tool body from a fixture function that may end early.
pub(super) fn run(
    work: impl Future<Output = Step<ToolOutcome>> + Send + 'static,
) -> ToolFuture<'static> {
    Box::pin(async move { work.await.unwrap_or_else(|early| early) })
}

/// `elicitation/create` params for a form of required primitive fields
/// (`(name, JSON type)`).
pub(super) fn form(message: &str, fields: &[(&str, &str)]) -> Value {
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
pub(super) fn sampling(text: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [{ "role": "user", "content": { "type": "text", "text": text } }],
        "maxTokens": max_tokens
    })
}

/// Ask the client under `key`. A missing client capability ends the call
/// with that JSON-RPC error as it is (-32021 with `requiredCapabilities`:
/// the fixture cannot go on without it); any other failure is a tool error.
pub(super) async fn ask(ctx: &ToolContext, key: &str, method: &str, params: Value) -> Step<Value> {
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

/// Ask the client to fill a form of required fields under `key`.
pub(super) async fn elicit(
    ctx: &ToolContext,
    key: &str,
    message: &str,
    fields: &[(&str, &str)],
) -> Step<Value> {
    ask(ctx, key, "elicitation/create", form(message, fields)).await
}

/// The content of an accepted elicitation; `None` if the user declined or
/// cancelled.
pub(super) fn accepted(answer: &Value) -> Option<&Value> {
    (answer.get("action").and_then(Value::as_str) == Some("accept"))
        .then(|| answer.get("content").unwrap_or(&Value::Null))
}

/// The string `field` of an accepted elicitation. A declined or cancelled
/// one ends the call with a text saying so; an acceptance without the field
/// with a tool error.
pub(super) fn accepted_str(answer: &Value, field: &str) -> Step<String> {
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
pub(super) fn accepted_true(answer: &Value, field: &str) -> bool {
    accepted(answer)
        .and_then(|c| c.get(field))
        .and_then(Value::as_bool)
        == Some(true)
}

/// `action` and content of an elicitation answer, for a summary.
pub(super) fn summary(answer: &Value) -> String {
    let action = answer
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    match answer.get("content") {
        Some(content) => format!("{action} {content}"),
        None => action.to_owned(),
    }
}

/// The string argument `name`, if given as a string.
pub(super) fn str_arg<'a>(arguments: &'a Value, name: &str) -> Option<&'a str> {
    arguments.get(name).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
