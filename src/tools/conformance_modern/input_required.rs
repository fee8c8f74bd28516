//! Fixtures of the input-required-result-* scenarios (SEP-2322,
//! multi-round requests): each asks in one or more `input_required` rounds.

use serde_json::{Value, json};

use super::asks::{
    NAME_QUESTION, Step, accepted_str, accepted_true, ask, elicit, form, sampling, summary,
};
use crate::mcp::ErrorCode;
use crate::tools::{ToolContext, ToolOutcome};

pub(super) async fn irr_elicitation(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let answer = elicit(&ctx, "user_name", NAME_QUESTION, &[("name", "string")]).await?;
    let name = accepted_str(&answer, "name")?;
    Ok(ToolOutcome::text(format!("Hello, {name}!")))
}

pub(super) async fn irr_sampling(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let params = sampling("What is the capital of France?", 100);
    let answer = ask(&ctx, "sample_request", "sampling/createMessage", params).await?;
    Ok(ToolOutcome::text(format!(
        "Sampling result: {}",
        sampled_text(&answer)
    )))
}

pub(super) fn sampled_text(answer: &Value) -> &str {
    answer
        .pointer("/content/text")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

pub(super) fn root_count(answer: &Value) -> usize {
    answer
        .get("roots")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

pub(super) async fn irr_list_roots(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let answer = ask(&ctx, "roots_request", "roots/list", json!({})).await?;
    Ok(ToolOutcome::text(format!(
        "Found {} root(s)",
        root_count(&answer)
    )))
}

/// Asks to confirm (key `confirm`, `{ok: boolean}`); `done` if confirmed.
pub(super) async fn confirm(ctx: &ToolContext, done: &str) -> Step<ToolOutcome> {
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

pub(super) async fn irr_request_state(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    confirm(&ctx, "state-ok: requestState validated").await
}

pub(super) async fn irr_tampered_state(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    confirm(&ctx, "integrity-ok: state verified").await
}

pub(super) async fn irr_multiple_inputs(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
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

pub(super) async fn irr_multi_round(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
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

pub(super) async fn irr_capabilities(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
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
