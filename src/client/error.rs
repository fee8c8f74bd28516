//! What can go wrong talking to an MCP server, and the exit code each
//! failure maps to.

use super::input::InputError;
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
    /// The broker wants a bearer token (HTTP 401): none was sent, or the
    /// one sent is unknown, revoked or expired.
    #[error("{}", unauthorized_advice(*.token_sent))]
    Unauthorized {
        /// Whether the request carried a token (`--token`, `TASKBROKER_TOKEN`).
        token_sent: bool,
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
    /// A question of the tool could not be answered (no terminal and no
    /// `--input`, an `--input` that does not fit, a kind of request this
    /// client does not serve).
    #[error("{0}")]
    Input(#[from] InputError),
}

/// What a 401 means to the person at the command line, and what to do.
fn unauthorized_advice(token_sent: bool) -> &'static str {
    if token_sent {
        "the broker refused the token (HTTP 401: unknown, revoked or expired): \
         pass a valid one with --token TOKEN or TASKBROKER_TOKEN \
         (`taskbroker token list` shows which are valid)"
    } else {
        "the broker requires a token (HTTP 401): pass --token TOKEN or set \
         TASKBROKER_TOKEN (`taskbroker token create --principal NAME` on the \
         broker's database makes one)"
    }
}

impl McpError {
    /// The error for a non-2xx HTTP answer: 401 becomes
    /// [`McpError::Unauthorized`], which says how to pass a token.
    pub fn http(status: u16, message: String, token_sent: bool) -> Self {
        if status == 401 {
            Self::Unauthorized { token_sent }
        } else {
            Self::Http { status, message }
        }
    }

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
            Self::Input(InputError::Unsupported { .. }) => EXIT_FAILURE,
            Self::Input(_) => EXIT_USAGE,
            _ => EXIT_UNREACHABLE,
        }
    }
}
