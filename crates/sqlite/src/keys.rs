//! SQL for `request_state_keys`: the keys every broker on the database
//! signs MCP 2026-07-28 request states with.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::SqliteStore;

#[async_trait]
impl KeyStore for SqliteStore {
    async fn request_state_key_get_or_create(
        &self,
        epoch: i64,
        candidate: &[u8],
        now: i64,
    ) -> Result<Vec<u8>, StoreError> {
        // A no-op update on conflict returns the row that won.
        let secret = sqlx::query_scalar!(
            "INSERT INTO request_state_keys (epoch, secret, created_at) VALUES (?, ?, ?)
             ON CONFLICT (epoch) DO UPDATE SET secret = request_state_keys.secret
             RETURNING secret",
            epoch,
            candidate,
            now
        )
        .fetch_one(&mut *self.writer().await?)
        .await?;
        Ok(secret)
    }

    async fn request_state_key_get(&self, epoch: i64) -> Result<Option<Vec<u8>>, StoreError> {
        let secret = sqlx::query_scalar!(
            "SELECT secret FROM request_state_keys WHERE epoch = ?",
            epoch
        )
        .fetch_optional(&self.read)
        .await?;
        Ok(secret)
    }

    async fn request_state_key_purge(&self, before_epoch: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "DELETE FROM request_state_keys WHERE epoch < ?",
            before_epoch
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(done.rows_affected())
    }
}
