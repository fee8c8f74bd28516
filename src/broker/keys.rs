//! The signing keys every broker on the database shares. They sign what a
//! client carries from one request to the next (the `requestState` of MCP
//! 2026-07-28 multi-round calls), so that a retry may reach any broker
//! process on the database, or this one after a restart.
//!
//! Keys rotate: one per period of [`defaults::REQUEST_STATE_KEY_PERIOD`]
//! (its number, the *epoch*, is the time divided by the period). The first
//! process that signs in a period makes its key, and the database keeps
//! the first of several made at once. A state signed in one period is
//! accepted through the next (the overlap), so it lives at least one
//! period and at most two; a key one period ahead is accepted too, for a
//! broker whose clock runs a little ahead. Keys are read once per process
//! and kept in memory; maintenance deletes those no state may use any
//! more.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::defaults;
use crate::store::{Store, StoreError};

/// Bytes in a key.
pub const KEY_BYTES: usize = 32;

/// One period's key.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey {
    /// Its period.
    pub epoch: i64,
    /// The secret.
    pub secret: Arc<[u8; KEY_BYTES]>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey(epoch {}, ..)", self.epoch)
    }
}

/// The keys of this database, as far as this process has read them.
#[derive(Debug)]
pub struct SigningKeys {
    store: Store,
    /// Length of a period, ms.
    period_ms: i64,
    /// Keys read so far, by epoch (at most the accepted window's few).
    known: Mutex<BTreeMap<i64, SigningKey>>,
}

/// Why no key opens a state.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Signed in a period whose key is no longer accepted (or never was).
    #[error("signed too long ago (keys rotate every {0} h)")]
    Expired(i64),
    /// The database could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The operating system gave no randomness.
    #[error("drawing a key from the OS: {0}")]
    Random(String),
}

impl SigningKeys {
    /// The keys of `store`, rotating every [`defaults::REQUEST_STATE_KEY_PERIOD`].
    pub fn new(store: Store) -> Self {
        Self::with_period(store, defaults::REQUEST_STATE_KEY_PERIOD.as_millis() as i64)
    }

    /// With a period of `period_ms` (tests).
    pub fn with_period(store: Store, period_ms: i64) -> Self {
        Self {
            store,
            period_ms: period_ms.max(1),
            known: Mutex::new(BTreeMap::new()),
        }
    }

    /// The period `now` falls in.
    pub fn epoch(&self, now: i64) -> i64 {
        now.div_euclid(self.period_ms)
    }

    /// The key to sign with now: this period's, made if no process has.
    pub async fn current(&self, now: i64) -> Result<SigningKey, KeyError> {
        let epoch = self.epoch(now);
        if let Some(key) = self.cached(epoch) {
            return Ok(key);
        }
        let mut candidate = [0u8; KEY_BYTES];
        getrandom::fill(&mut candidate).map_err(|e| KeyError::Random(e.to_string()))?;
        let secret = self
            .store
            .request_state_key_get_or_create(epoch, &candidate, now)
            .await?;
        Ok(self.remember(epoch, &secret)?)
    }

    /// The key of `epoch`, if a state signed then is still accepted now.
    pub async fn for_epoch(&self, epoch: i64, now: i64) -> Result<SigningKey, KeyError> {
        let current = self.epoch(now);
        if !(current - 1..=current + 1).contains(&epoch) {
            return Err(KeyError::Expired(self.period_ms / 3_600_000));
        }
        if let Some(key) = self.cached(epoch) {
            return Ok(key);
        }
        match self.store.request_state_key_get(epoch).await? {
            Some(secret) => Ok(self.remember(epoch, &secret)?),
            None => Err(KeyError::Expired(self.period_ms / 3_600_000)),
        }
    }

    /// Delete the keys no state may use any more; how many went. One
    /// period more is kept than this clock accepts, so a broker whose clock
    /// runs ahead never deletes a key the others still accept.
    pub async fn purge(&self, now: i64) -> Result<u64, StoreError> {
        let oldest_kept = self.epoch(now) - 2;
        self.lock().retain(|&epoch, _| epoch >= oldest_kept);
        self.store.request_state_key_purge(oldest_kept).await
    }

    fn cached(&self, epoch: i64) -> Option<SigningKey> {
        self.lock().get(&epoch).cloned()
    }

    fn remember(&self, epoch: i64, secret: &[u8]) -> Result<SigningKey, StoreError> {
        let secret: [u8; KEY_BYTES] = secret.try_into().map_err(|_| {
            StoreError::Decode(format!(
                "request_state_keys epoch {epoch}: {} bytes, expected {KEY_BYTES}",
                secret.len()
            ))
        })?;
        let key = SigningKey {
            epoch,
            secret: Arc::new(secret),
        };
        self.lock().insert(epoch, key.clone());
        Ok(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i64, SigningKey>> {
        // The map is only ever left whole: a panic elsewhere cannot leave
        // it half-written.
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
