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
//!
//! Each scenario family has its file (`stateless.rs`, `input_required.rs`,
//! `tasks.rs`); what they share to ask the client and read its answers is
//! `asks.rs`; this file holds the definitions the suite sees.

mod asks;
mod input_required;
mod stateless;
mod tasks;

use std::sync::Arc;

use serde_json::json;

use super::conformance::Fixture;
use super::{TaskSupport, Tool};
use asks::run;
use input_required::{
    irr_capabilities, irr_elicitation, irr_list_roots, irr_multi_round, irr_multiple_inputs,
    irr_request_state, irr_sampling, irr_tampered_state,
};
use stateless::{header_param, logging_tool, missing_capability, streaming_elicitation};
use tasks::{
    MAX_COMPUTE_SECONDS, confirm_delete, failing_job, greet, multi_input, protocol_error_job,
    slow_compute, tool_with_task, tool_with_task_before,
};

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
