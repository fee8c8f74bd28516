//! The limit of open tasks per requestor (T-38) without a count query per
//! creation. Only creations raise an owner's open count, and they pass
//! here, so "the count when last read + the creations since" is an upper
//! bound: while it stays under the limit a creation needs no query; when
//! it reaches the limit the count is read again (finished tasks drop out).
//!
//! That holds only while this process makes every creation. On a database
//! that brokers on many machines share (PostgreSQL), others create too, so
//! there every creation counts.

use std::collections::HashMap;
use std::sync::Mutex;

/// Owners remembered at most; beyond, the bounds are forgotten (each is
/// read again on its owner's next creation).
const MAX_OWNERS: usize = 10_000;

/// Upper bounds of open tasks, per owner.
#[derive(Debug)]
pub(super) struct OpenTasks {
    limit: i64,
    /// Other processes create tasks in the same database: never trust a
    /// bound, always count.
    shared: bool,
    bounds: Mutex<HashMap<String, i64>>,
}

impl OpenTasks {
    pub(super) fn new(limit: i64, shared: bool) -> Self {
        Self {
            limit,
            shared,
            bounds: Mutex::new(HashMap::new()),
        }
    }

    /// Take a slot if the bound says one is free; false means: count.
    pub(super) fn try_reserve(&self, owner: &str) -> bool {
        if self.shared {
            return false;
        }
        let mut bounds = self.bounds.lock().unwrap_or_else(|e| e.into_inner());
        match bounds.get_mut(owner) {
            Some(bound) if *bound < self.limit => {
                *bound += 1;
                true
            }
            _ => false,
        }
    }

    /// `open` was just counted and is under the limit: take a slot.
    pub(super) fn reserve_counted(&self, owner: &str, open: i64) {
        if self.shared {
            return;
        }
        let mut bounds = self.bounds.lock().unwrap_or_else(|e| e.into_inner());
        if bounds.len() >= MAX_OWNERS && !bounds.contains_key(owner) {
            bounds.clear();
        }
        bounds.insert(owner.to_owned(), open + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t38_bound_counts_creations_until_the_limit() {
        let open = OpenTasks::new(3, false);
        assert!(!open.try_reserve("a"), "unknown owner: count first");
        open.reserve_counted("a", 1);
        assert!(open.try_reserve("a"));
        assert!(
            !open.try_reserve("a"),
            "bound reached the limit: count again"
        );
        open.reserve_counted("a", 0);
        assert!(open.try_reserve("a"));
        assert!(!open.try_reserve("b"));
    }

    #[test]
    fn t38_shared_database_counts_every_creation() {
        let open = OpenTasks::new(3, true);
        open.reserve_counted("a", 0);
        assert!(!open.try_reserve("a"), "other brokers create too: count");
    }
}
