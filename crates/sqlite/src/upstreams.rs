//! SQL for `upstreams`: the state of each upstream MCP server's link and
//! its last tool list, kept so that its tools stay served while it is
//! unreachable.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::SqliteStore;

#[async_trait]
impl UpstreamStore for SqliteStore {
    /// The kept tool list and when it was listed.
    async fn upstream_tools_saved(&self, name: &str) -> Result<Option<(String, i64)>, StoreError> {
        let row = sqlx::query!(
            r#"SELECT tools AS "tools!", listed_at AS "listed_at!" FROM upstreams
                WHERE name = ?1 AND tools IS NOT NULL AND listed_at IS NOT NULL"#,
            name
        )
        .fetch_optional(&self.read)
        .await?;
        Ok(row.map(|r| (r.tools, r.listed_at)))
    }

    /// Keep a tool list; a first row says the upstream is ready (it answered).
    async fn upstream_save_tools(
        &self,
        name: &str,
        tools: &str,
        served: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO upstreams (name, state, state_at, tools, served, listed_at)
             VALUES (?1, 'ready', ?4, ?2, ?3, ?4)
             ON CONFLICT (name) DO UPDATE
                SET tools = excluded.tools, served = excluded.served, listed_at = excluded.listed_at",
            name,
            tools,
            served,
            now
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// The names served changed; the kept tool list stays.
    async fn upstream_set_served(&self, name: &str, served: &str) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE upstreams SET served = ?2 WHERE name = ?1",
            name,
            served
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// Record a state (and a restart); the kept tool list stays.
    async fn upstream_set_state(
        &self,
        name: &str,
        state: &str,
        last_error: Option<&str>,
        restarted: bool,
        now: i64,
    ) -> Result<(), StoreError> {
        let restarts: i64 = restarted.into();
        sqlx::query!(
            "INSERT INTO upstreams (name, state, last_error, state_at, restarts)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (name) DO UPDATE
                SET state = excluded.state,
                    last_error = coalesce(excluded.last_error, upstreams.last_error),
                    state_at = excluded.state_at,
                    restarts = upstreams.restarts + excluded.restarts",
            name,
            state,
            last_error,
            now,
            restarts
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// Every upstream, by name.
    async fn upstreams_list(&self) -> Result<Vec<UpstreamRow>, StoreError> {
        let rows = sqlx::query_as!(
            UpstreamRow,
            "SELECT name, state, last_error, state_at, restarts, tools, served, listed_at
               FROM upstreams ORDER BY name"
        )
        .fetch_all(&self.read)
        .await?;
        Ok(rows)
    }
}
