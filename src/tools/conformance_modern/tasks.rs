//! Fixtures of the tasks-* scenarios (SEP-2663, the tasks extension):
//! tools that run as tasks, fail, or ask before and within their task.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::asks::{
    NAME_QUESTION, Step, accepted, accepted_str, accepted_true, ask, elicit, form, str_arg, summary,
};
use crate::mcp::{ErrorCode, RpcError};
use crate::tools::{BeforeTask, ToolContext, ToolOutcome};

/// Longest `slow_compute` run (one hour).
pub(super) const MAX_COMPUTE_SECONDS: f64 = 3_600.0;

pub(super) async fn greet(arguments: Value, _: ToolContext) -> Step<ToolOutcome> {
    let name = str_arg(&arguments, "name").unwrap_or("World");
    Ok(ToolOutcome::text(format!("Hello, {name}!")))
}

pub(super) async fn slow_compute(arguments: Value, ctx: ToolContext) -> Step<ToolOutcome> {
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

pub(super) async fn failing_job(_: Value, _: ToolContext) -> Step<ToolOutcome> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(ToolOutcome::tool_error("failing_job failed on purpose"))
}

pub(super) async fn protocol_error_job(_: Value, _: ToolContext) -> Step<ToolOutcome> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(ToolOutcome::Error(RpcError::new(
        ErrorCode::InternalError,
        "protocol_error_job: failed with a JSON-RPC error on purpose",
    )))
}

pub(super) async fn confirm_delete(arguments: Value, ctx: ToolContext) -> Step<ToolOutcome> {
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

pub(super) async fn multi_input(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
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
pub(super) fn user_name_request() -> Value {
    form(NAME_QUESTION, &[("name", "string")])
}

/// Ask for the name before the task exists (MCP 2026-07-28): the task runs
/// with the accepted name as its `name` argument. An answer without one
/// (declined, cancelled) still creates the task, which then asks itself.
pub(super) fn tool_with_task_before(
    mut arguments: Value,
    answers: &Map<String, Value>,
) -> BeforeTask {
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

pub(super) async fn tool_with_task(arguments: Value, ctx: ToolContext) -> Step<ToolOutcome> {
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
}
