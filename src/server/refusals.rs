//! The broker's refusals as JSON-RPC errors of the 2025-11-25 front end:
//! the broker says what is wrong in domain terms, the wire shape is ours.

use crate::broker::BrokerError;
use serde_json::json;

use crate::mcp::{ErrorCode, RpcError};

/// A refusal that has a JSON-RPC form.
pub trait RpcRefusal {
    /// The JSON-RPC error for this refusal; `verb` prefixes task lookups
    /// ("Failed to retrieve task: Task not found").
    fn to_rpc(&self, verb: &str) -> RpcError;
}

impl RpcRefusal for BrokerError {
    /// The JSON-RPC error for this refusal; `verb` prefixes task lookups
    /// ("Failed to retrieve task: Task not found").
    fn to_rpc(&self, verb: &str) -> RpcError {
        match self {
            BrokerError::NotFound | BrokerError::Expired => {
                RpcError::invalid_params(format!("Failed to {verb} task: {self}"))
            }
            BrokerError::InvalidCursor
            | BrokerError::Terminal(_)
            | BrokerError::UnknownTool(_)
            | BrokerError::InvalidParams(_) => RpcError::invalid_params(self.to_string()),
            BrokerError::TaskForbidden(_) | BrokerError::TaskRequired(_) => {
                RpcError::new(ErrorCode::MethodNotFound, self.to_string())
            }
            // When to come back: in the data, and (see `json_response`)
            // in Retry-After.
            BrokerError::Limit(_, after) => {
                RpcError::new(ErrorCode::Other(-32000), self.to_string())
                    .with_data(json!({ "retryAfter": after.as_secs_f64().ceil().max(1.0) as u64 }))
            }
            BrokerError::Store(_) | BrokerError::ShuttingDown => RpcError::internal(),
        }
    }
}
