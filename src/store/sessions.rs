//! SQL for `sessions`.

use super::{Store, StoreError};

/// A stored MCP session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// The Mcp-Session-Id value.
    pub session_id: String,
    /// Negotiated protocol version.
    pub protocol_version: String,
    /// The client's `clientInfo` (JSON text).
    pub client_info: String,
    /// The client's declared capabilities (JSON text).
    pub client_capabilities: String,
    /// When initialize made it, ms.
    pub created_at: i64,
    /// Last request seen (updated at most once a minute), ms.
    pub last_seen_at: i64,
    /// Set by DELETE: the session is over.
    pub ended_at: Option<i64>,
    /// The principal that opened it (None without authentication).
    pub principal: Option<String>,
}

/// What initialize stores.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// Random id.
    pub session_id: String,
    /// Negotiated protocol version.
    pub protocol_version: String,
    /// `clientInfo` as JSON text.
    pub client_info: String,
    /// `capabilities` as JSON text.
    pub client_capabilities: String,
    /// The authenticated principal, if any.
    pub principal: Option<String>,
}

impl Store {
    /// Record a new session.
    pub async fn session_create(&self, new: &NewSession, now: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO sessions (session_id, protocol_version, client_info, client_capabilities,
                                   created_at, last_seen_at, principal)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
            new.session_id,
            new.protocol_version,
            new.client_info,
            new.client_capabilities,
            now,
            now,
            new.principal
        )
        .execute(&self.write)
        .await?;
        Ok(())
    }

    /// A session by id, ended or not.
    pub async fn session_get(&self, session_id: &str) -> Result<Option<SessionRow>, StoreError> {
        let row = sqlx::query_as!(
            SessionRow,
            "SELECT session_id, protocol_version, client_info, client_capabilities,
                    created_at, last_seen_at, ended_at, principal
               FROM sessions WHERE session_id = ?",
            session_id
        )
        .fetch_optional(&self.read)
        .await?;
        Ok(row)
    }

    /// End a session (DELETE). Returns false when it was unknown or already
    /// ended.
    pub async fn session_end(&self, session_id: &str, now: i64) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "UPDATE sessions SET ended_at = ? WHERE session_id = ? AND ended_at IS NULL",
            now,
            session_id
        )
        .execute(&self.write)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Note that the session is still in use.
    pub async fn session_touch(&self, session_id: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE sessions SET last_seen_at = ? WHERE session_id = ? AND last_seen_at < ?",
            now,
            session_id,
            now
        )
        .execute(&self.write)
        .await?;
        Ok(())
    }
}
