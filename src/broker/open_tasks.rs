//! The limit of open tasks per requestor (T-38) without a count query per
//! creation. Only creations raise an owner's open count, and they pass
//! here, so after a count an owner may make some creations before the next
//! one: the headroom (the limit less the count) when this process makes
//! every creation, since "the count + the creations since" is an upper
//! bound; when that allowance is spent the count is read again (finished
//! tasks drop out).
//!
//! On a database that brokers on many machines share (PostgreSQL), others
//! create too: there a process takes only a share of the headroom,
//! [`SHARED_SHARE`]th of it, before it counts again. Near the limit the
//! share is one creation, so every creation counts; far from it a count is
//! read every few thousand creations instead of at each. Up to
//! [`SHARED_SHARE`] brokers together stay within the headroom they counted.

use std::collections::HashMap;
use std::sync::Mutex;

/// Owners remembered at most; beyond, the allowances are forgotten (each
/// is read again on its owner's next creation).
const MAX_OWNERS: usize = 10_000;

/// On a shared database, the part of the headroom one process may take
/// between counts (one sixteenth).
pub(super) const SHARED_SHARE: i64 = 16;

/// Creations an owner may still make before the next count, per owner.
#[derive(Debug)]
pub(super) struct OpenTasks {
    limit: i64,
    /// How many processes may share the headroom: 1 alone,
    /// [`SHARED_SHARE`] on a shared database.
    share: i64,
    allowances: Mutex<HashMap<String, i64>>,
}

impl OpenTasks {
    /// `shared`: other processes create tasks in the same database.
    pub(super) fn new(limit: i64, shared: bool) -> Self {
        Self {
            limit,
            share: if shared { SHARED_SHARE } else { 1 },
            allowances: Mutex::new(HashMap::new()),
        }
    }

    /// Take a creation from the owner's allowance; false means: count.
    pub(super) fn try_reserve(&self, owner: &str) -> bool {
        let mut allowances = self.allowances.lock().unwrap_or_else(|e| e.into_inner());
        match allowances.get_mut(owner) {
            Some(left) if *left > 0 => {
                *left -= 1;
                true
            }
            _ => false,
        }
    }

    /// `open` was just counted and is under the limit: take a creation, and
    /// set what is left of the owner's allowance.
    pub(super) fn reserve_counted(&self, owner: &str, open: i64) {
        let left = (self.limit - open) / self.share - 1;
        let mut allowances = self.allowances.lock().unwrap_or_else(|e| e.into_inner());
        if allowances.len() >= MAX_OWNERS && !allowances.contains_key(owner) {
            allowances.clear();
        }
        allowances.insert(owner.to_owned(), left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t38_alone_counts_again_when_the_headroom_is_spent() {
        let open = OpenTasks::new(3, false);
        assert!(!open.try_reserve("a"), "unknown owner: count first");
        open.reserve_counted("a", 1);
        assert!(open.try_reserve("a"));
        assert!(
            !open.try_reserve("a"),
            "count + creations reached the limit: count again"
        );
        open.reserve_counted("a", 0);
        assert!(open.try_reserve("a"));
        assert!(open.try_reserve("a"));
        assert!(!open.try_reserve("a"));
        assert!(!open.try_reserve("b"));
    }

    #[test]
    fn t38_shared_database_takes_a_share_of_the_headroom() {
        let open = OpenTasks::new(3, true);
        open.reserve_counted("a", 0);
        assert!(
            !open.try_reserve("a"),
            "near the limit every creation counts"
        );

        let limit = 100_000;
        let open = OpenTasks::new(limit, true);
        open.reserve_counted("a", 0);
        let mut made = 1;
        while open.try_reserve("a") {
            made += 1;
        }
        assert_eq!(
            made,
            limit / SHARED_SHARE,
            "one share of the headroom, then count"
        );
        // Sixteen brokers that each counted the same headroom stay within it.
        assert!(made * SHARED_SHARE <= limit);
        open.reserve_counted("a", limit - SHARED_SHARE);
        assert!(
            !open.try_reserve("a"),
            "one share left: count at each creation"
        );
    }
}
