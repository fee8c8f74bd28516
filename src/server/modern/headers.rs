//! The HTTP headers a 2026-07-28 request must agree with its body on
//! (SEP-2243): `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` (the tool
//! of tools/call, the task of tasks/*), and `Mcp-Param-<Name>` for tool
//! arguments marked `x-mcp-header` in the tool's inputSchema. Names are
//! case-insensitive, values exact after trimming spaces; a value of the
//! form `=?base64?...?=` is base64, decoded strictly. Any disagreement is
//! -32020 with HTTP 400.
//!
//! A header that disagrees with the body is always refused. A header that
//! is absent is refused only where every client library we test sends it
//! (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` of tools/call), or in
//! [`Presence::Strict`] mode (`--strict-headers`), which restores the
//! SEP's presence rules for deployments behind gateways that route on
//! headers. The broker is the final server and reads the body, so an
//! absent header cannot mislead it; but the official Python SDK (2.3)
//! sends no `Mcp-Name` on tasks/*, and no `Mcp-Param-*` header for a tool
//! it has not listed first.

use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

use super::{Refusal, Request};
use crate::mcp::VERSION_HEADER;
use crate::mcp::modern;
use crate::server::AppState;

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, Refusal> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim_matches([' ', '\t'])))
            .map_err(|_| mismatch(format!("header {name} is not visible ASCII"))),
    }
}

/// Which absent headers are refused (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Presence {
    /// Only those every tested client library sends (the default).
    #[default]
    Lenient,
    /// Every header the SEP requires (`--strict-headers`).
    Strict,
}

fn mismatch(message: String) -> Refusal {
    Refusal::rpc(modern::header_mismatch(format!(
        "Header mismatch: {message}"
    )))
}

/// `MCP-Protocol-Version`, required on every request.
pub fn version(headers: &HeaderMap) -> Result<String, Refusal> {
    match header(headers, VERSION_HEADER)? {
        Some(v) => Ok(v.to_owned()),
        None => Err(mismatch(format!(
            "the MCP-Protocol-Version header is required (MCP {} requests send the version in \
             the header and in _meta)",
            modern::VERSION
        ))),
    }
}

/// `Mcp-Method`, required and equal to the body's method.
pub fn check_method(headers: &HeaderMap, method: &str) -> Result<(), Refusal> {
    match header(headers, modern::METHOD_HEADER)? {
        Some(h) if h == method => Ok(()),
        Some(h) => Err(mismatch(format!(
            "Mcp-Method is '{h}' but the body's method is '{method}'"
        ))),
        None => Err(mismatch(format!(
            "the Mcp-Method header is required (here: {method})"
        ))),
    }
}

/// `Mcp-Name` against the body's `what`; an absent header passes unless
/// `required`.
fn check_name(
    headers: &HeaderMap,
    what: &str,
    expected: &str,
    required: bool,
) -> Result<(), Refusal> {
    match header(headers, modern::NAME_HEADER)? {
        Some(h) if h == expected => Ok(()),
        Some(h) => Err(mismatch(format!(
            "Mcp-Name is '{h}' but the body's {what} is '{expected}'"
        ))),
        None if !required => Ok(()),
        None => Err(mismatch(format!(
            "the Mcp-Name header is required (here: the {what}, '{expected}'; this broker runs \
             with --strict-headers)"
        ))),
    }
}

/// `Mcp-Name` of tasks/get, tasks/update and tasks/cancel: the taskId
/// (required only when `Strict`). A body without a taskId is left to the
/// method's own params check.
pub fn check_task_name(
    headers: &HeaderMap,
    params: Option<&Value>,
    presence: Presence,
) -> Result<(), Refusal> {
    match params.and_then(|p| p.get("taskId")).and_then(Value::as_str) {
        Some(task_id) => check_name(headers, "taskId", task_id, presence == Presence::Strict),
        None => Ok(()),
    }
}

/// `Mcp-Name` (the tool) and the `Mcp-Param-*` headers of tools/call.
pub fn check_call(
    state: &AppState,
    headers: &HeaderMap,
    request: &Request<'_>,
) -> Result<(), Refusal> {
    let Some(name) = request
        .params
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
    else {
        return Ok(());
    };
    check_name(headers, "tool name", name, true)?;
    let presence = state.config.header_presence;
    let tools = state.broker.tools();
    let Some(tool) = tools.get(name) else {
        return Ok(());
    };
    let arguments = request.params.and_then(|p| p.get("arguments"));
    let Some(properties) = tool
        .definition()
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
    else {
        return Ok(());
    };
    for (param, schema) in properties {
        let Some(suffix) = schema.get("x-mcp-header").and_then(Value::as_str) else {
            continue;
        };
        let header_name = format!("mcp-param-{}", suffix.to_ascii_lowercase());
        let given = header(headers, &header_name)?;
        let argument = arguments
            .and_then(|a| a.get(param))
            .filter(|v| !v.is_null());
        check_param(&header_name, param, given, argument, presence)?;
    }
    Ok(())
}

/// One `Mcp-Param-*` header against its argument; an absent header
/// passes unless `Strict`.
fn check_param(
    header_name: &str,
    param: &str,
    given: Option<&str>,
    argument: Option<&Value>,
    presence: Presence,
) -> Result<(), Refusal> {
    let (given, argument) = match (given, argument) {
        (None, None) => return Ok(()),
        (None, Some(_)) if presence == Presence::Lenient => return Ok(()),
        (Some(_), None) => {
            return Err(mismatch(format!(
                "{header_name} is set but the argument '{param}' is absent"
            )));
        }
        (None, Some(_)) => {
            return Err(mismatch(format!(
                "{header_name} is required: the argument '{param}' is marked x-mcp-header (this \
                 broker runs with --strict-headers)"
            )));
        }
        (Some(g), Some(a)) => (g, a),
    };
    let value = match given
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    {
        Some(encoded) => {
            let bytes = STANDARD.decode(encoded).map_err(|_| {
                mismatch(format!("{header_name} is not valid base64 ('{encoded}')"))
            })?;
            String::from_utf8(bytes)
                .map_err(|_| mismatch(format!("{header_name} does not decode to UTF-8 text")))?
        }
        None => given.to_owned(),
    };
    let agrees = match argument {
        Value::String(s) => *s == value,
        Value::Number(n) => value
            .parse::<f64>()
            .ok()
            .zip(n.as_f64())
            .is_some_and(|(a, b)| a == b),
        Value::Bool(b) => value == if *b { "true" } else { "false" },
        _ => false,
    };
    if agrees {
        Ok(())
    } else {
        Err(mismatch(format!(
            "{header_name} is '{value}' but the argument '{param}' is {argument}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check_param(
        header_name: &str,
        param: &str,
        given: Option<&str>,
        argument: Option<&Value>,
    ) -> Result<(), Refusal> {
        super::check_param(header_name, param, given, argument, Presence::Strict)
    }

    #[test]
    fn param_headers_decode_base64_strictly_and_compare() {
        let hello = json!("Hello");
        assert!(check_param("h", "p", Some("=?base64?SGVsbG8=?="), Some(&hello)).is_ok());
        assert!(check_param("h", "p", Some("=?base64?SGVsbG8?="), Some(&hello)).is_err());
        assert!(check_param("h", "p", Some("=?base64?SGVs!!!bG8=?="), Some(&hello)).is_err());
        let literal = json!("SGVsbG8=");
        assert!(check_param("h", "p", Some("SGVsbG8="), Some(&literal)).is_ok());
        let prefix_only = json!("=?base64?SGVsbG8=");
        assert!(check_param("h", "p", Some("=?base64?SGVsbG8="), Some(&prefix_only)).is_ok());
        assert!(check_param("h", "p", None, Some(&hello)).is_err());
        assert!(check_param("h", "p", None, None).is_ok());
        assert!(check_param("h", "p", Some("1.0"), Some(&json!(1))).is_ok());
        assert!(check_param("h", "p", Some("true"), Some(&json!(true))).is_ok());
    }

    #[test]
    fn lenient_presence_accepts_an_absent_param_header_never_a_wrong_one() {
        let hello = json!("Hello");
        let lenient = |given| super::check_param("h", "p", given, Some(&hello), Presence::Lenient);
        assert!(lenient(None).is_ok());
        assert!(lenient(Some("Hello")).is_ok());
        assert!(lenient(Some("Bye")).is_err());
        assert!(super::check_param("h", "p", Some("x"), None, Presence::Lenient).is_err());
    }
}
