//! How a tool's jobs wait in the queue: the priority its calls get, the
//! highest one a call may ask for, and how far ahead a call may ask its
//! start to be put (issue 27 item 2). Priorities are integers, higher
//! first, or names for the common ones ([`PRIORITY_NAMES`]).

use std::time::Duration;

use serde_json::Value;

use crate::defaults;

/// The named priorities and their values: `normal` is what a call gets
/// unless its tool's config says otherwise.
pub const PRIORITY_NAMES: &[(&str, i64)] = &[
    ("lowest", -20),
    ("low", -10),
    ("normal", 0),
    ("high", 10),
    ("highest", 20),
];

/// The range a priority given as a number must fall in.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -100..=100;

/// What a tool's config allows its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePolicy {
    /// The priority of a call that asks for none.
    pub priority: i64,
    /// The highest a call may ask for (a call may always ask for less).
    pub max_priority: i64,
    /// The furthest ahead a call may put its start.
    pub max_delay: Duration,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        Self {
            priority: 0,
            max_priority: 0,
            max_delay: defaults::MAX_START_DELAY,
        }
    }
}

/// The queue settings of one section as written (unset: the default, or
/// what an enclosing section says).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueSettings {
    /// Priority of calls that ask for none.
    pub priority: Option<i64>,
    /// The highest a call may ask for.
    pub max_priority: Option<i64>,
    /// The furthest ahead a call may put its start.
    pub max_delay: Option<Duration>,
}

impl QueueSettings {
    /// `self`, with what it leaves unset taken from `fallback`.
    pub fn or(self, fallback: Self) -> Self {
        Self {
            priority: self.priority.or(fallback.priority),
            max_priority: self.max_priority.or(fallback.max_priority),
            max_delay: self.max_delay.or(fallback.max_delay),
        }
    }

    /// The policy: defaults for what is unset; a call may always ask for
    /// its tool's own priority.
    pub fn policy(self) -> QueuePolicy {
        let default = QueuePolicy::default();
        let priority = self.priority.unwrap_or(default.priority);
        QueuePolicy {
            priority,
            max_priority: self.max_priority.unwrap_or(priority).max(priority),
            max_delay: self.max_delay.unwrap_or(default.max_delay),
        }
    }
}

/// A priority given as a name or a whole number: its value, or why not.
pub fn parse_priority(value: &Value) -> Result<i64, String> {
    match value {
        Value::String(name) => PRIORITY_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                format!(
                    "unknown priority '{name}' (use one of {}, or a whole number from {} to {})",
                    names(),
                    PRIORITY_RANGE.start(),
                    PRIORITY_RANGE.end()
                )
            }),
        Value::Number(n) => n
            .as_i64()
            .filter(|p| PRIORITY_RANGE.contains(p))
            .ok_or_else(|| {
                format!(
                    "priority {n} is not a whole number from {} to {}",
                    PRIORITY_RANGE.start(),
                    PRIORITY_RANGE.end()
                )
            }),
        other => Err(format!(
            "priority {other} must be a name ({}) or a whole number",
            names()
        )),
    }
}

/// A priority as people read it: its name when it has one
/// (`high (10)`), else the number.
pub fn describe_priority(priority: i64) -> String {
    match PRIORITY_NAMES.iter().find(|(_, v)| *v == priority) {
        Some((name, value)) => format!("{name} ({value})"),
        None => priority.to_string(),
    }
}

fn names() -> String {
    PRIORITY_NAMES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_and_numbers_parse_and_the_rest_is_refused_by_name() {
        assert_eq!(parse_priority(&json!("high")), Ok(10));
        assert_eq!(parse_priority(&json!(-100)), Ok(-100));
        let unknown = parse_priority(&json!("urgent")).unwrap_err();
        assert!(
            unknown.contains("'urgent'") && unknown.contains("lowest, low"),
            "{unknown}"
        );
        assert!(parse_priority(&json!(101)).is_err());
        assert!(parse_priority(&json!(1.5)).is_err());
        assert!(parse_priority(&json!(null)).is_err());
        assert_eq!(describe_priority(10), "high (10)");
        assert_eq!(describe_priority(7), "7");
    }
}
