//! The audit trail (T-39): task creation, retrieval, cancellation and every
//! refused lookup, as structured tracing events with target `audit`
//! (principal, session, task id; time comes with every event), for both
//! protocol generations. Repeated
//! refused lookups by one requestor raise a warning.

use crate::broker::Owner;
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

/// Who did something: a 2025-11-25 session, or a 2026-07-28 request
/// (no session: its owner is its principal, or the stateless owner).
#[derive(Debug, Clone)]
pub struct Actor<'a> {
    /// The token's principal, if any.
    pub principal: Option<&'a str>,
    /// The session, if any.
    pub session: Option<&'a str>,
    /// Whose tasks it reaches: refused lookups are counted per owner.
    pub owner: String,
}

impl<'a> Actor<'a> {
    /// A request without a session, acting for `owner` (a principal, or
    /// the stateless owner).
    pub fn without_session(owner: &'a Owner) -> Self {
        Self {
            principal: owner.principal_name(),
            session: None,
            owner: owner.to_string(),
        }
    }
}

impl<'a> From<&'a Session> for Actor<'a> {
    fn from(session: &'a Session) -> Self {
        Self {
            principal: session.principal.as_deref(),
            session: Some(&session.id),
            owner: session.owner().to_string(),
        }
    }
}

impl Audit {
    /// A task operation that succeeded.
    pub fn record(&self, event: &'static str, session: &Session, task_id: &str, detail: &str) {
        self.record_by(&session.into(), event, task_id, detail);
    }

    /// A task operation that succeeded, by anyone.
    pub fn record_by(&self, who: &Actor<'_>, event: &'static str, task_id: &str, detail: &str) {
        tracing::info!(target: "audit", event, principal = who.principal.unwrap_or("-"),
                       session = who.session.unwrap_or("-"), task_id, detail, "audit");
    }

    /// A lookup refused as not found or expired (possibly someone else's
    /// task, or a guess).
    pub fn refused(&self, event: &'static str, session: &Session, task_id: &str, reason: &str) {
        self.refused_by(&session.into(), event, task_id, reason);
    }

    /// A refused lookup, by anyone; repeated ones raise a warning.
    pub fn refused_by(&self, who: &Actor<'_>, event: &'static str, task_id: &str, reason: &str) {
        let principal = who.principal.unwrap_or("-");
        let session = who.session.unwrap_or("-");
        tracing::info!(target: "audit", event, principal, session, task_id, reason,
                       "audit: refused");
        let now = Instant::now();
        let mut map = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 100_000 {
            map.retain(|_, (_, since)| now.duration_since(*since) < WINDOW);
        }
        let (count, since) = map.entry(who.owner.clone()).or_insert((0, now));
        if now.duration_since(*since) > WINDOW {
            *count = 0;
            *since = now;
        }
        *count += 1;
        if *count == WARN_AT || (*count > WARN_AT && count.is_power_of_two()) {
            tracing::warn!(target: "audit", principal, session, owner = %who.owner,
                           refused = *count, window_s = WINDOW.as_secs(),
                           "audit: repeated refused task lookups (guessing task ids?)");
        }
    }
}
