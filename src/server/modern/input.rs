//! Questions to an MCP 2026-07-28 client (elicitation, sampling, roots),
//! asked by a plain call's `input_required` or a task's `inputRequests`:
//! the capability each needs, and whether an answer fits its question.

use serde_json::{Value, json};

use crate::mcp::{self, RpcError};

/// Refuse an answer whose shape does not fit the request it answers.
pub(super) fn check_answer(key: &str, method: &str, answer: &Value) -> Result<(), RpcError> {
    let bad = |what: &str| {
        Err(RpcError::invalid_params(format!(
            "Invalid params: inputResponses.{key} answers {method} but {what}"
        )))
    };
    if !answer.is_object() {
        return bad("is not an object");
    }
    match method {
        "elicitation/create" => match answer.get("action").and_then(Value::as_str) {
            Some("accept" | "decline" | "cancel") => Ok(()),
            _ => bad("has no action of accept, decline or cancel"),
        },
        "sampling/createMessage" => {
            if answer.get("role").is_some_and(Value::is_string)
                && answer.get("content").is_some()
                && answer.get("model").is_some_and(Value::is_string)
            {
                Ok(())
            } else {
                bad("lacks role, content or model")
            }
        }
        "roots/list" => {
            if answer.get("roots").is_some_and(Value::is_array) {
                Ok(())
            } else {
                bad("has no roots array")
            }
        }
        _ => Ok(()),
    }
}

/// The capability a request to the client needs, as a ClientCapabilities
/// object, when the client did not declare it.
pub(super) fn undeclared(capabilities: &Value, method: &str, params: &Value) -> Option<Value> {
    let (name, declared) = match method {
        "roots/list" => ("roots", capabilities.get("roots").is_some()),
        "elicitation/create" => (
            "elicitation",
            mcp::client_supports(capabilities, method, params),
        ),
        "sampling/createMessage" => (
            "sampling",
            mcp::client_supports(capabilities, method, params),
        ),
        _ => return None,
    };
    (!declared).then(|| json!({ name: {} }))
}
