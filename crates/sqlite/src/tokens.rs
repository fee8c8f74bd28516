//! SQL for `tokens`: bearer tokens, stored as hashes.

use async_trait::async_trait;
use taskbroker_storage::*;

use crate::SqliteStore;

#[async_trait]
impl TokenStore for SqliteStore {
    /// Store a new token.
    async fn token_create(&self, token: &NewToken, now: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "INSERT INTO tokens (token_id, principal, secret_hash, created_at, expires_at, operator) VALUES (?, ?, ?, ?, ?, ?)",
            token.token_id,
            token.principal,
            token.secret_hash,
            now,
            token.expires_at,
            token.operator
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// One token by id.
    async fn token_get(&self, token_id: &str) -> Result<Option<TokenRow>, StoreError> {
        let row = sqlx::query_as!(
            TokenRow,
            r#"SELECT token_id, principal, secret_hash, created_at, expires_at, revoked_at, last_used_at,
                      operator AS "operator: bool"
               FROM tokens WHERE token_id = ?"#,
            token_id
        )
        .fetch_optional(&self.read)
        .await?;
        Ok(row)
    }

    /// Every token, newest first.
    async fn token_list(&self) -> Result<Vec<TokenRow>, StoreError> {
        let rows = sqlx::query_as!(
            TokenRow,
            r#"SELECT token_id, principal, secret_hash, created_at, expires_at, revoked_at, last_used_at,
                      operator AS "operator: bool"
               FROM tokens ORDER BY created_at DESC"#
        )
        .fetch_all(&self.read)
        .await?;
        Ok(rows)
    }

    /// Revoke a token; false when unknown or already revoked.
    async fn token_revoke(&self, token_id: &str, now: i64) -> Result<bool, StoreError> {
        let done = sqlx::query!(
            "UPDATE tokens SET revoked_at = ? WHERE token_id = ? AND revoked_at IS NULL",
            now,
            token_id
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Whether any token exists (then every request must carry one).
    async fn tokens_exist(&self) -> Result<bool, StoreError> {
        let any = sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM tokens) AS "any!: bool""#)
            .fetch_one(&self.read)
            .await?;
        Ok(any)
    }

    /// Note a token's use.
    async fn token_touch(&self, token_id: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query!(
            "UPDATE tokens SET last_used_at = ? WHERE token_id = ?",
            now,
            token_id
        )
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }
}
