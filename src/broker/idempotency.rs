//! Idempotent creation (issue 27): a task call that carries a client's
//! idempotency key returns the task an earlier call with the same key made
//! (same owner, same tool) instead of making a second one, as long as that
//! task is kept (its ttl). A repeat with other arguments is refused. The
//! database's unique index is the rule, so two brokers (or two requests at
//! once) that both find no task cannot both create one: the second
//! creation fails, and it answers with the first one's task.

use serde_json::Value;

use super::{Broker, BrokerError};
use crate::clock::now_ms;
use crate::mcp::IDEMPOTENCY_KEY_META;
use crate::store::TaskRow;

/// The longest key accepted, in bytes.
pub const IDEMPOTENCY_KEY_MAX: usize = 255;

/// The key of a call's `_meta`, checked: None when absent; a key that is
/// not a non-empty string of at most [`IDEMPOTENCY_KEY_MAX`] bytes is
/// refused with a message that names it.
pub fn key_of(meta: Option<&Value>) -> Result<Option<&str>, BrokerError> {
    let Some(value) = meta.and_then(|m| m.get(IDEMPOTENCY_KEY_META)) else {
        return Ok(None);
    };
    match value.as_str() {
        Some(key) if !key.is_empty() && key.len() <= IDEMPOTENCY_KEY_MAX => Ok(Some(key)),
        _ => Err(BrokerError::InvalidParams(format!(
            "Invalid params: _meta[\"{IDEMPOTENCY_KEY_META}\"] must be a non-empty string of at most {IDEMPOTENCY_KEY_MAX} bytes"
        ))),
    }
}

impl Broker {
    /// The task an earlier call with `key` made for `owner` and `tool`, if
    /// it is kept: refused when that call's arguments differ, or when the
    /// task has expired (the key is free again once the task is deleted).
    pub(super) async fn idempotent_task(
        &self,
        owner: &str,
        tool: &str,
        key: &str,
        arguments: &Value,
    ) -> Result<Option<TaskRow>, BrokerError> {
        let Some(row) = self.store.task_by_idempotency_key(owner, tool, key).await? else {
            return Ok(None);
        };
        let same = serde_json::from_str::<Value>(&row.arguments).is_ok_and(|a| &a == arguments);
        if !same {
            return Err(BrokerError::InvalidParams(format!(
                "Invalid params: idempotency key '{key}' was used for task {} of tool '{tool}' with other arguments; \
                 use a new key for a new call",
                row.task_id
            )));
        }
        if row.expires_at.is_some_and(|at| at <= now_ms()) {
            return Err(BrokerError::InvalidParams(format!(
                "Invalid params: idempotency key '{key}' belongs to task {}, which has expired; use a new key",
                row.task_id
            )));
        }
        tracing::info!(task_id = %row.task_id, tool, "task call repeated with its idempotency key: the same task");
        Ok(Some(row))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_non_empty_strings_of_bounded_length() {
        assert_eq!(key_of(None).unwrap(), None);
        assert_eq!(key_of(Some(&json!({}))).unwrap(), None);
        let meta = json!({ IDEMPOTENCY_KEY_META: "order-42" });
        assert_eq!(key_of(Some(&meta)).unwrap(), Some("order-42"));
        for bad in [json!(""), json!(42), json!("x".repeat(256))] {
            let meta = json!({ IDEMPOTENCY_KEY_META: bad });
            assert!(matches!(
                key_of(Some(&meta)),
                Err(BrokerError::InvalidParams(_))
            ));
        }
    }
}
