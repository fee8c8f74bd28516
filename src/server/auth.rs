//! Bearer-token authentication (H-13) and principals (T-36).
//!
//! A token reads `tbk_<id>_<secret>`: the id finds the row, the secret is
//! checked against its stored SHA-256 in constant time. Only hashes are
//! stored. With any token in the database, every request needs a valid one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, Uri, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::broker::records::TokenRecords;
use crate::clock::now_ms;
use crate::store::StoreError;

const PREFIX: &str = "tbk_";

/// Who a request is: the principal of its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// Why a request is not authenticated.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Tokens are configured and the request has none.
    #[error("Unauthorized: this broker requires a bearer token (Authorization: Bearer ...)")]
    Missing,
    /// The token is malformed, unknown, revoked or expired.
    #[error("Unauthorized: invalid, revoked or expired token")]
    Invalid,
    /// A token in the URL, where logs and proxies keep it.
    #[error(
        "Bad Request: tokens are never accepted in the query string; use the Authorization header"
    )]
    InQuery,
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A new token: (id, the whole token to hand out once, the secret's hash).
pub fn mint() -> Result<(String, String, [u8; 32]), getrandom::Error> {
    let mut id = [0u8; 9];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id)?;
    getrandom::fill(&mut secret)?;
    let id = URL_SAFE_NO_PAD.encode(id).replace(['-', '_'], "x");
    let secret = URL_SAFE_NO_PAD.encode(secret);
    let hash = hash_secret(&secret);
    Ok((id.clone(), format!("{PREFIX}{id}_{secret}"), hash))
}

fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Refuse tokens in the query string (`access_token=`, `token=`).
pub fn check_query(uri: &Uri) -> Result<(), AuthError> {
    let Some(query) = uri.query() else {
        return Ok(());
    };
    let named = query.split('&').any(|pair| {
        let key = pair.split('=').next().unwrap_or("").to_ascii_lowercase();
        matches!(
            key.as_str(),
            "access_token" | "token" | "bearer" | "authorization"
        )
    });
    if named {
        Err(AuthError::InQuery)
    } else {
        Ok(())
    }
}

/// How long a request may trust the last look at whether tokens exist.
const PRESENCE_FRESH: Duration = Duration::from_millis(20);

/// Whether any token exists, as last read. Requests reuse a look up to
/// [`PRESENCE_FRESH`] old (without this, every unauthenticated request cost
/// a query); `initialize` asks for a fresh one, so once `token create`
/// returns no new session opens without a token. One look at a time:
/// requests that find the last one stale while another is under way wait
/// for its answer instead of each reading (under load a stale look met
/// every request in flight at once).
#[derive(Debug, Default)]
pub struct TokenPresence {
    /// The last look: when it began, and what it read.
    last: Mutex<Option<(Instant, bool)>>,
    /// Held while a look reads.
    reading: tokio::sync::Mutex<()>,
}

impl TokenPresence {
    /// Whether tokens exist: read afresh if `fresh` (a look that began
    /// after this call), else maybe the last look.
    pub async fn tokens_exist(
        &self,
        store: &TokenRecords,
        fresh: bool,
    ) -> Result<bool, StoreError> {
        let asked = Instant::now();
        let usable = |at: Instant| {
            if fresh {
                at >= asked
            } else {
                at.elapsed() < PRESENCE_FRESH
            }
        };
        if let Some(exist) = self.last_if(usable) {
            return Ok(exist);
        }
        let _one = self.reading.lock().await;
        // The look that held the lock meanwhile may answer this call too.
        if let Some(exist) = self.last_if(usable) {
            return Ok(exist);
        }
        let at = Instant::now();
        let exist = store.tokens_exist().await?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, exist));
        Ok(exist)
    }

    /// What the last look read, if `usable` says its start will do.
    fn last_if(&self, usable: impl Fn(Instant) -> bool) -> Option<bool> {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.filter(|(at, _)| usable(*at)).map(|(_, exist)| exist)
    }
}

/// The request's principal: None when no token is configured and none is
/// sent; an error when one is needed and missing or not valid.
pub async fn authenticate(
    presence: &TokenPresence,
    store: &TokenRecords,
    headers: &HeaderMap,
) -> Result<Option<Principal>, AuthError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().map_err(|_| AuthError::Invalid))
        .transpose()?;
    let Some(value) = presented else {
        return if presence.tokens_exist(store, false).await? {
            Err(AuthError::Missing)
        } else {
            Ok(None)
        };
    };
    let token = bearer(value).ok_or(AuthError::Invalid)?;
    Ok(Some(Principal(verify(store, token).await?.principal)))
}

/// The token of an `Authorization: Bearer <token>` value.
pub fn bearer(value: &str) -> Option<&str> {
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
}

/// A token that checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Whom it acts as.
    pub principal: String,
    /// May open the web console.
    pub operator: bool,
}

/// Check a whole token (`tbk_<id>_<secret>`): known, secret matching,
/// neither revoked nor expired; notes its use (at most once a minute).
pub async fn verify(store: &TokenRecords, token: &str) -> Result<Verified, AuthError> {
    let (id, secret) = token
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once('_'))
        .ok_or(AuthError::Invalid)?;
    let Some(row) = store.token_get(id).await? else {
        return Err(AuthError::Invalid);
    };
    let matches: bool = hash_secret(secret).ct_eq(row.secret_hash.as_slice()).into();
    let now = now_ms();
    if !matches || row.revoked_at.is_some() || row.expires_at.is_some_and(|at| at <= now) {
        return Err(AuthError::Invalid);
    }
    if row.last_used_at.is_none_or(|at| now - at > 60_000) {
        store.token_touch(id, now).await?;
    }
    Ok(Verified {
        principal: row.principal,
        operator: row.operator,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_parse_and_hash() {
        let (id, token, hash) = mint().unwrap();
        let rest = token.strip_prefix(PREFIX).unwrap();
        let (tid, secret) = rest.split_once('_').unwrap();
        assert_eq!(tid, id);
        assert!(!id.contains('_'));
        assert_eq!(hash_secret(secret), hash);
        assert!(secret.len() >= 43, "256 random bits");
    }

    #[test]
    fn h13_query_string_tokens_are_refused() {
        assert!(check_query(&"/mcp?access_token=x".parse().unwrap()).is_err());
        assert!(check_query(&"/mcp?a=1&TOKEN=x".parse().unwrap()).is_err());
        assert!(check_query(&"/mcp?a=1".parse().unwrap()).is_ok());
        assert!(check_query(&"/mcp".parse().unwrap()).is_ok());
    }
}
