//! The audit trail (T-39): task creation, retrieval, cancellation and every
//! refused lookup, as structured tracing events with target `audit`
//! (principal, session, task id; time comes with every event). Repeated
//! refused lookups by one requestor raise a warning.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::sessions::Session;

/// Refused lookups within this window are counted together.
const WINDOW: Duration = Duration::from_secs(60);
/// This many refused lookups in a window raise a warning.
const WARN_AT: u32 = 10;

/// Counts refused lookups per requestor.
#[derive(Debug, Default)]
pub struct Audit {
    refused: Mutex<HashMap<String, (u32, Instant)>>,
}

fn principal(session: &Session) -> &str {
    session.principal.as_deref().unwrap_or("-")
}

impl Audit {
    /// A task operation that succeeded.
    pub fn record(&self, event: &'static str, session: &Session, task_id: &str, detail: &str) {
        tracing::info!(target: "audit", event, principal = principal(session), session = %session.id,
                       task_id, detail, "audit");
    }

    /// A lookup refused as not found or expired (possibly someone else's
    /// task, or a guess).
    pub fn refused(&self, event: &'static str, session: &Session, task_id: &str, reason: &str) {
        tracing::info!(target: "audit", event, principal = principal(session), session = %session.id,
                       task_id, reason, "audit: refused");
        let owner = session.owner();
        let now = Instant::now();
        let mut map = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 100_000 {
            map.retain(|_, (_, since)| now.duration_since(*since) < WINDOW);
        }
        let (count, since) = map.entry(owner.clone()).or_insert((0, now));
        if now.duration_since(*since) > WINDOW {
            *count = 0;
            *since = now;
        }
        *count += 1;
        if *count == WARN_AT || (*count > WARN_AT && count.is_power_of_two()) {
            tracing::warn!(target: "audit", principal = principal(session), session = %session.id, owner,
                           refused = *count, window_s = WINDOW.as_secs(),
                           "audit: repeated refused task lookups (guessing task ids?)");
        }
    }
}
