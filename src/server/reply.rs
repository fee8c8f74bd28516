//! What a request answers, whichever handler made it: a finished result, or
//! a future with notifications on the way ([`Reply`]), and the items of a
//! request's SSE stream ([`StreamItem`]). The transport streams or awaits
//! it; handlers (dispatch, plain calls, the 2026 front end) only build it.

use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::mcp::RpcError;

/// Something to put on a request's SSE stream before its response.
#[derive(Debug)]
pub enum StreamItem {
    /// A notification or a request to the client.
    Message(Value),
    /// End the client's current connection; it resumes with Last-Event-ID.
    Close,
}

/// The outcome of one request.
pub enum Reply {
    /// Known now: the `result` object, or an error object.
    Done(Result<Value, Value>),
    /// Known later. `items` go on the SSE stream first (dropped for a JSON
    /// response); `outcome` resolves to the result or error object.
    Later {
        /// Messages while waiting.
        items: Option<mpsc::UnboundedReceiver<StreamItem>>,
        /// The eventual result (Ok) or error object (Err).
        outcome: BoxFuture<'static, Result<Value, Value>>,
        /// Whether the work goes on when the connection drops (resumable
        /// with Last-Event-ID), or stops with it.
        resumable: bool,
    },
}

impl Reply {
    /// Known now: an error.
    pub(super) fn err(e: RpcError) -> Self {
        Self::Done(Err(e.to_json()))
    }
}
