//! Which MCP session a command line uses: `--session` if given, else the
//! session the client keeps for that broker in its state file (see
//! [`super::state`]), else a new one, which is then stored. Sessions the
//! client keeps are never ended, so a task started by one invocation can be
//! looked at by the next, across broker restarts.

use super::input::Answerer;
use super::state::CliState;
use super::{Connection, McpClient, McpError};

/// Where a client's session came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `--session ID` on the command line.
    Given,
    /// The session stored for this broker by an earlier invocation.
    Stored,
    /// Made by this invocation (and stored).
    New,
}

/// A client bound to the command line's session, and where it came from.
pub struct CliSession {
    /// The MCP client.
    pub client: McpClient,
    /// Where its session came from.
    pub origin: Origin,
    /// The state file entry of this broker.
    pub state: CliState,
}

impl CliSession {
    /// `--session`, else the stored session, else a new one (stored). A new
    /// session is made under the state file's lock, so two invocations that
    /// start at once share one session instead of each storing its own.
    /// The client answers the tool's questions with `answerer` (and a new
    /// session declares that it can). For `calls`, a stored session opened
    /// without declaring so (by an earlier version) is replaced by a new
    /// one: a tool's question would fail in it.
    pub async fn open(
        conn: &Connection,
        answerer: Answerer,
        calls: bool,
    ) -> Result<Self, McpError> {
        let state = CliState::for_connection(conn);
        let mut client = McpClient::new(conn.url.clone())?;
        client.set_token(conn.token.clone());
        client.set_answerer(answerer);
        if let Some(id) = &conn.session {
            client.use_session(id);
            return Ok(Self {
                client,
                origin: Origin::Given,
                state,
            });
        }
        let lock = state.lock().await;
        let stored = state.load();
        if let Some(id) = &stored.session {
            if stored.answers_questions || !calls {
                client.use_session(id);
                return Ok(Self {
                    client,
                    origin: Origin::Stored,
                    state,
                });
            }
            eprintln!(
                "taskbroker: the stored session {id} cannot answer a tool's questions (an \
                 earlier client made it); a new one replaces it (its tasks: --session {id})"
            );
        }
        client.initialize().await?;
        state.update(&lock, |b| {
            b.session = client.session_id().map(str::to_owned);
            b.answers_questions = true;
        });
        Ok(Self {
            client,
            origin: Origin::New,
            state,
        })
    }

    /// Whether `e` says the broker does not know our stored session (HTTP
    /// 404: its database was replaced, or the session was ended).
    pub fn lost_stored_session(&self, e: &McpError) -> bool {
        self.origin == Origin::Stored && is_unknown_session(e)
    }

    /// Replace a stored session the broker no longer knows by a new one, and
    /// store that (unless another invocation stored a newer one meanwhile:
    /// then use that one).
    pub async fn renew(&mut self) -> Result<(), McpError> {
        let stale = self.client.session_id().map(str::to_owned);
        let lock = self.state.lock().await;
        match self.state.load().session {
            Some(id) if Some(&id) != stale.as_ref() => self.client.use_session(&id),
            _ => {
                self.client.forget_session();
                self.client.initialize().await?;
                let id = self.client.session_id().map(str::to_owned);
                self.state.update(&lock, |b| {
                    b.session = id;
                    b.answers_questions = true;
                });
            }
        }
        self.origin = Origin::New;
        Ok(())
    }

    /// Drop the stored session (the broker no longer knows it), if it is
    /// still the one stored.
    pub async fn forget(&self) {
        let ours = self.client.session_id().map(str::to_owned);
        let lock = self.state.lock().await;
        self.state.update(&lock, |b| {
            if b.session == ours {
                b.session = None;
                b.answers_questions = false;
            }
        });
    }
}

/// HTTP 404 on a request with a session: the server does not know it.
pub fn is_unknown_session(e: &McpError) -> bool {
    matches!(e, McpError::Http { status: 404, .. })
}
