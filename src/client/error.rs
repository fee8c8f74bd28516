//! What can go wrong talking to an MCP server, and the exit code each
//! failure maps to.

use crate::mcp::RpcError;

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the tool failed (`isError`, a failed or cancelled task, a
/// JSON-RPC error answer).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: the command line was wrong (clap uses it too).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the server could not be reached, or spoke something else.
pub const EXIT_UNREACHABLE: u8 = 3;
/// Exit code: interrupted with Ctrl-C (128 + SIGINT).
pub const EXIT_INTERRUPTED: u8 = 130;

/// A failed exchange with an MCP server.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The server answered with a JSON-RPC error.
    #[error("{} (JSON-RPC error {})", .0.message, .0.code.code())]
    Rpc(RpcError),
    /// The server refused the HTTP request (e.g. 404: unknown session).
    #[error("HTTP {status}: {message}")]
    Http {
        /// The HTTP status code.
        status: u16,
        /// The JSON-RPC error message of the body, or the body itself.
        message: String,
    },
    /// No connection could be made.
    #[error("cannot reach {url}: {reason}")]
    Connect {
        /// The endpoint.
        url: String,
        /// Why, with its causes.
        reason: String,
    },
    /// The connection failed after it was made (reset, timeout, ...).
    #[error("connection to the server failed: {0}")]
    Transport(String),
    /// The server's answer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl McpError {
    /// The JSON-RPC error, when the server answered with one.
    pub fn rpc(&self) -> Option<&RpcError> {
        match self {
            Self::Rpc(e) => Some(e),
            _ => None,
        }
    }

    /// The process exit code for this failure: answers from the server
    /// (a JSON-RPC error, an unknown session) are failures (1); everything
    /// else means the server could not be used (3).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Rpc(_) => EXIT_FAILURE,
            Self::Http { status: 404, .. } => EXIT_FAILURE,
            _ => EXIT_UNREACHABLE,
        }
    }
}
