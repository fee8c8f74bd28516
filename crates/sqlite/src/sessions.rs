//! SQL for `sessions`.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::SqliteStore;

#[async_trait]
impl SessionStore for SqliteStore {
    /// Record a new session.
    async fn session_create(&self, new: &NewSession, now: i64) -> Result<(), StoreError> {
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
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// A session by id, ended or not.
    async fn session_get(&self, session_id: &str) -> Result<Option<SessionRow>, StoreError> {
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
    async fn session_end(&self, session_id: &str, now: i64) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "UPDATE sessions SET ended_at = ? WHERE session_id = ? AND ended_at IS NULL",
            now,
            session_id
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Note that the session is still in use.
    async fn session_touch(&self, session_id: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE sessions SET last_seen_at = ? WHERE session_id = ? AND last_seen_at < ?",
            now,
            session_id,
            now
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// How many sessions are live: not ended, and used within `idle_ms`
    /// or owning a task whose ttl has not run out. An idle session stops
    /// counting the moment its time is up, before the sweeper ends it.
    async fn session_count_live(&self, idle_ms: i64, now: i64) -> Result<i64, StoreError> {
        let cutoff = now.saturating_sub(idle_ms);
        let n = sqlx::query_scalar!(
            r#"SELECT count(*) AS "n!: i64" FROM sessions s
                WHERE s.ended_at IS NULL
                  AND (s.last_seen_at > ?1
                       OR EXISTS (SELECT 1 FROM tasks t
                                   WHERE t.session_id = s.session_id
                                     AND (t.expires_at IS NULL OR t.expires_at > ?2)))"#,
            cutoff,
            now
        )
        .fetch_one(&self.read)
        .await?;
        Ok(n)
    }

    /// Whether a session owns a task whose ttl has not run out (it then
    /// does not expire however long it is idle).
    async fn session_owns_open_tasks(
        &self,
        session_id: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let owns = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM tasks
                               WHERE session_id = ?1 AND (expires_at IS NULL OR expires_at > ?2))
                      AS "owns!: bool""#,
            session_id,
            now
        )
        .fetch_one(&self.read)
        .await?;
        Ok(owns)
    }

    /// The session sweeper: end up to `batch` sessions idle for `idle_ms`
    /// that own no unexpired task, then delete up to `batch` ended sessions
    /// that own none (their tasks' rows stay until their own ttl). Returns
    /// (ended, deleted).
    async fn session_expire_idle(
        &self,
        idle_ms: i64,
        now: i64,
        batch: i64,
    ) -> Result<(u64, u64), StoreError> {
        let cutoff = now.saturating_sub(idle_ms);
        let ended = sqlx::query!(
            "UPDATE sessions SET ended_at = ?1
              WHERE session_id IN (
                    SELECT s.session_id FROM sessions s
                     WHERE s.ended_at IS NULL AND s.last_seen_at <= ?2
                       AND NOT EXISTS (SELECT 1 FROM tasks t
                                        WHERE t.session_id = s.session_id
                                          AND (t.expires_at IS NULL OR t.expires_at > ?1))
                     LIMIT CAST(?3 AS INTEGER))",
            now,
            cutoff,
            batch
        )
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected();
        let deleted = sqlx::query!(
            "DELETE FROM sessions
              WHERE session_id IN (
                    SELECT s.session_id FROM sessions s
                     WHERE s.ended_at IS NOT NULL
                       AND NOT EXISTS (SELECT 1 FROM tasks t
                                        WHERE t.session_id = s.session_id
                                          AND (t.expires_at IS NULL OR t.expires_at > ?1))
                     LIMIT CAST(?2 AS INTEGER))",
            now,
            batch
        )
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected();
        Ok((ended, deleted))
    }
}
