//! SQL for `request_state_keys`: the keys every broker on the database
//! signs MCP 2026-07-28 request states with.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::PostgresStore;

#[async_trait]
impl KeyStore for PostgresStore {
    async fn request_state_key_get_or_create(
        &self,
        epoch: i64,
        candidate: &[u8],
        now: i64,
    ) -> Result<Vec<u8>, StoreError> {
        // A no-op update on conflict returns the row that won.
        let secret = sqlx::query_scalar!(
            "INSERT INTO request_state_keys (epoch, secret, created_at) VALUES ($1, $2, $3)
             ON CONFLICT (epoch) DO UPDATE SET secret = request_state_keys.secret
             RETURNING secret",
            epoch,
            candidate,
            now
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(secret)
    }

    async fn request_state_key_get(&self, epoch: i64) -> Result<Option<Vec<u8>>, StoreError> {
        let secret = sqlx::query_scalar!(
            "SELECT secret FROM request_state_keys WHERE epoch = $1",
            epoch
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(secret)
    }

    async fn request_state_key_purge(&self, before_epoch: i64) -> Result<u64, StoreError> {
        let done = sqlx::query!(
            "DELETE FROM request_state_keys WHERE epoch < $1",
            before_epoch
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}
