//! Whose a task is: the one rule for the `tasks.owner` value. With tokens,
//! the principal owns its tasks in both protocol generations (T-36);
//! without, a 2025-11-25 session owns its tasks (T-37), and a 2026-07-28
//! task belongs to no one ([`Owner::stateless`]): its id is the capability.

use std::fmt;

/// A task owner, as stored (`principal:<name>`, `session:<id>` or
/// `stateless`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner(String);

const PRINCIPAL: &str = "principal:";
const SESSION: &str = "session:";
const STATELESS: &str = "stateless";

impl Owner {
    /// The tasks of an authenticated principal.
    pub fn principal(name: &str) -> Self {
        Self(format!("{PRINCIPAL}{name}"))
    }

    /// The tasks of a 2025-11-25 session without tokens.
    pub fn session(id: &str) -> Self {
        Self(format!("{SESSION}{id}"))
    }

    /// Tasks created without tokens and without a session (2026-07-28):
    /// whoever holds such a task's id may read and cancel it.
    pub fn stateless() -> Self {
        Self(STATELESS.to_owned())
    }

    /// The owner a stored row names.
    pub fn from_stored(stored: String) -> Self {
        Self(stored)
    }

    /// The stored form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The principal, when a principal owns the tasks.
    pub fn principal_name(&self) -> Option<&str> {
        self.0.strip_prefix(PRINCIPAL)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_stored_form_and_only_principals_a_name() {
        assert_eq!(Owner::principal("alice").as_str(), "principal:alice");
        assert_eq!(Owner::principal("alice").principal_name(), Some("alice"));
        assert_eq!(Owner::session("s1").as_str(), "session:s1");
        assert_eq!(Owner::session("s1").principal_name(), None);
        assert_eq!(Owner::stateless().as_str(), "stateless");
        assert_eq!(
            Owner::from_stored("principal:bob".into()),
            Owner::principal("bob")
        );
    }
}
