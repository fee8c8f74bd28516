//! Bookkeeping the front ends keep through the broker: sessions and
//! tokens. Each handle gives its holder one entity of storage and nothing
//! else, so the HTTP layer never holds the whole store.

use std::ops::Deref;

use crate::store::{SessionStore, Store, TokenStore};

/// Sessions (2025-11-25): create, look up, touch, end, count.
#[derive(Clone, Debug)]
pub struct SessionRecords(Store);

impl SessionRecords {
    pub(super) fn new(store: Store) -> Self {
        Self(store)
    }
}

impl Deref for SessionRecords {
    type Target = dyn SessionStore;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// Bearer tokens: create, look up, list, revoke, note a use.
#[derive(Clone, Debug)]
pub struct TokenRecords(Store);

impl TokenRecords {
    pub(super) fn new(store: Store) -> Self {
        Self(store)
    }
}

impl Deref for TokenRecords {
    type Target = dyn TokenStore;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}
