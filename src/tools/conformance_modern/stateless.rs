//! Fixtures of the server-stateless scenarios and of
//! http-custom-header-server-validation (SEP-2243).

use serde_json::{Value, json};

use super::asks::{Step, ask, sampling, str_arg};
use crate::tools::{LogLevel, ToolContext, ToolOutcome};

pub(super) async fn missing_capability(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    let params = sampling("Say hello to the conformance suite.", 50);
    ask(&ctx, "sampling_request", "sampling/createMessage", params).await?;
    Ok(ToolOutcome::text("Success"))
}

pub(super) async fn streaming_elicitation(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    ctx.progress(1.0, Some(1.0), Some("streaming".into()));
    Ok(ToolOutcome::text("Streaming complete"))
}

pub(super) async fn logging_tool(_: Value, ctx: ToolContext) -> Step<ToolOutcome> {
    ctx.log(LogLevel::Info, json!("Logging evaluated"));
    Ok(ToolOutcome::text("Logging evaluated"))
}

pub(super) async fn header_param(arguments: Value, _: ToolContext) -> Step<ToolOutcome> {
    let region = str_arg(&arguments, "region").unwrap_or_default();
    Ok(ToolOutcome::text(format!("region: {region}")))
}
