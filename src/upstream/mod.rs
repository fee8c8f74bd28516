//! The client side of MCP: the broker speaking to MCP servers people
//! already run ("upstream servers", issue 25), so that their tools can be
//! served as durable tasks.
//!
//! - `wire`: a connection whatever carries it: requests matched to answers
//!   by id, the server's own requests and notifications handed on, every
//!   open request failed when it ends.
//! - [`stdio`]: the server as a child process (its own process group, tied
//!   to this process's life), newline-delimited JSON-RPC on its
//!   stdin/stdout, its stderr in the log.
//! - [`http`]: the server at a URL (Streamable HTTP): each message a POST,
//!   answers as JSON or an SSE stream, the server's session id kept.
//! - [`session`]: MCP on that connection: the handshake, the
//!   server's capabilities, `tools/list`, tool calls whose progress, logs
//!   and questions reach the caller's [`CallHandler`], cancellation, and
//!   the upstream's own tasks.
//! - [`stateless`]: what MCP 2026-07-28 changes on that session (chosen
//!   by the config, or by the server's answer to `server/discover`):
//!   `_meta` on every request, questions as input requests, the tasks
//!   extension, `subscriptions/listen`.
//! - [`spec`], [`link`], [`tool`]: an `[[upstream]]` as configured, the
//!   link that keeps its connection up and its tools served, and the
//!   `Tool` each of its tools becomes.
//!
//! One [`Session`] is one connection: a worker holds one per upstream and
//! runs many calls over it at once (`Session` is `Clone`; a stdio server's
//! process is killed when the last clone is dropped).
//!
//! Bad input from an upstream (a line that is not JSON, an answer to an id
//! never asked, a message of no known shape) is logged once per kind per
//! connection, at debug level after that, and never ends the connection.

pub mod http;
pub mod link;
pub mod session;
pub mod spec;
pub mod stateless;
pub mod stdio;
pub mod tool;
mod wire;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::mcp::RpcError;

pub use http::{HttpProtocol, HttpSpec};
pub use link::{Link, LinkState, LinkStatus, Upstreams};
pub use session::{AnswerFuture, CallHandler, ServerRequest, Session, SessionOptions};
pub use spec::{Retry, ToolSettings, Transport, UpstreamSpec};
pub use stdio::StdioSpec;

/// Why a request to an upstream did not give a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The upstream answered with a JSON-RPC error (kept whole: code,
    /// message, data).
    #[error("upstream '{upstream}' answered error {}: {}", .error.code.code(), .error.message)]
    Upstream {
        /// The upstream's name.
        upstream: Arc<str>,
        /// Its error, as sent.
        error: RpcError,
    },
    /// The connection ended (the process exited, or closed its stdout)
    /// before the answer came.
    #[error("connection to upstream '{upstream}' lost: {reason}")]
    Lost {
        /// The upstream's name.
        upstream: Arc<str>,
        /// What ended it (with the exit status when known).
        reason: Arc<str>,
    },
    /// No answer within the request's timeout (the request was cancelled
    /// upstream).
    #[error("upstream '{upstream}' did not answer {method} within {}", humantime::format_duration(*.after))]
    TimedOut {
        /// The upstream's name.
        upstream: Arc<str>,
        /// The method asked.
        method: String,
        /// The timeout.
        after: Duration,
    },
    /// The caller cancelled the request; `notifications/cancelled` was sent.
    #[error("the request to upstream '{upstream}' was cancelled")]
    Cancelled {
        /// The upstream's name.
        upstream: Arc<str>,
    },
    /// The upstream asked a question (a 2026-07-28 input request) that
    /// got no answer to send back: the call cannot go on.
    #[error("upstream '{upstream}' asked {method}, which got no answer: {}", .error.message)]
    Unanswered {
        /// The upstream's name.
        upstream: Arc<str>,
        /// What it asked.
        method: String,
        /// Why there is no answer.
        error: Box<RpcError>,
    },
    /// The upstream answered, but not in a shape this client can use.
    #[error("upstream '{upstream}' answered {method} with {what}")]
    Malformed {
        /// The upstream's name.
        upstream: Arc<str>,
        /// The method asked.
        method: String,
        /// What was wrong with the answer.
        what: String,
    },
}

/// Why an upstream could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The program could not be started (missing, not executable, ...).
    #[error("upstream '{upstream}': cannot start {program:?}: {source}")]
    Spawn {
        /// The upstream's name.
        upstream: Arc<str>,
        /// `argv[0]`.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// An HTTP upstream's settings cannot make a request (a header that
    /// is not one).
    #[error("upstream '{upstream}': {reason}")]
    Http {
        /// The upstream's name.
        upstream: Arc<str>,
        /// Why.
        reason: String,
    },
    /// The spec names no program.
    #[error("upstream '{upstream}': no command to start")]
    NoCommand {
        /// The upstream's name.
        upstream: Arc<str>,
    },
    /// `initialize` failed; `noticed` tells what the upstream wrote that
    /// was not MCP, if anything (a server that prints garbage).
    #[error("initialize failed: {error}{noticed}")]
    Initialize {
        /// Why.
        error: CallError,
        /// `"; it wrote ..."`, or empty.
        noticed: String,
    },
    /// `server/discover` failed (the server was told to speak
    /// 2026-07-28).
    #[error("server/discover failed: {error}")]
    Discover {
        /// Why.
        error: CallError,
    },
    /// The upstream answered a protocol version this client does not speak.
    #[error(
        "upstream '{upstream}' speaks MCP {answered}, which taskbroker does not (it speaks 2026-07-28, {})",
        session::KNOWN_PROTOCOL_VERSIONS.join(", ")
    )]
    Version {
        /// The upstream's name.
        upstream: Arc<str>,
        /// The version it answered.
        answered: String,
    },
}

/// Bad input from one upstream, logged at warn level the first time of
/// each kind and at debug level after that, so that a broken server
/// cannot flood the log.
#[derive(Debug)]
pub(crate) struct BadInputLog {
    /// The upstream's name.
    upstream: Arc<str>,
    /// Kinds already warned about, and the first detail seen (for errors
    /// such as a failed initialize).
    seen: Mutex<(HashSet<&'static str>, Option<String>)>,
}

impl BadInputLog {
    pub(crate) fn new(upstream: Arc<str>) -> Self {
        Self {
            upstream,
            seen: Mutex::new((HashSet::new(), None)),
        }
    }

    /// Log one piece of bad input of `kind`.
    pub(crate) fn report(&self, kind: &'static str, detail: &str) {
        let first = match self.seen.lock() {
            Ok(mut seen) => {
                if seen.1.is_none() {
                    seen.1 = Some(format!("{kind}: {detail}"));
                }
                seen.0.insert(kind)
            }
            Err(_) => false,
        };
        if first {
            tracing::warn!(upstream = %self.upstream, kind, detail, "bad input from the upstream (ignored; further ones of this kind at debug level)");
        } else {
            tracing::debug!(upstream = %self.upstream, kind, detail, "bad input from the upstream (ignored)");
        }
    }

    /// The first bad input seen, if any.
    pub(crate) fn first(&self) -> Option<String> {
        self.seen.lock().ok().and_then(|seen| seen.1.clone())
    }
}

/// At most this many bytes of something an upstream sent go into a log
/// line or an error message.
const QUOTE_MAX: usize = 200;

/// `bytes` as text for a log line, cut at [`QUOTE_MAX`].
pub(crate) fn quote(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.into_owned(),
    }
}
