//! When a 2025-11-25 session expires (H-5): unused for the idle time
//! (`--session-idle`), unless it owns a task whose ttl has not run out.
//! The front end's session cache, the live-session count and the
//! maintenance sweeper all ask this one rule.

use std::time::Duration;

use super::records::SessionRecords;
use crate::store::StoreError;

/// How often (ms) at most a session's use is written, whatever the idle
/// time.
const TOUCH_EVERY_MS: i64 = 60_000;

/// The expiry rule of sessions, for one idle time.
#[derive(Debug, Clone, Copy)]
pub struct SessionExpiry {
    /// Unused this long, a session is idle.
    idle_ms: i64,
}

impl SessionExpiry {
    /// Sessions unused for `idle` are idle.
    pub fn new(idle: Duration) -> Self {
        Self {
            idle_ms: i64::try_from(idle.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// The idle time in milliseconds, for the store's sweep and count.
    pub fn idle_ms(&self) -> i64 {
        self.idle_ms
    }

    /// Whether a session last used at `last_used` is idle at `now`.
    pub fn is_idle(&self, last_used: i64, now: i64) -> bool {
        now - last_used > self.idle_ms
    }

    /// Whether a use at `now` of a session whose use was last written at
    /// `last_written` is to be written: often enough that an active session
    /// never looks idle, to this server, another one or the sweeper.
    pub fn touch_due(&self, last_written: i64, now: i64) -> bool {
        now - last_written > (self.idle_ms / 4).min(TOUCH_EVERY_MS)
    }

    /// Whether session `id`, last used at `last_used`, has expired at
    /// `now`: idle, and owning no task whose ttl has not run out.
    pub async fn expired(
        &self,
        records: &SessionRecords,
        id: &str,
        last_used: i64,
        now: i64,
    ) -> Result<bool, StoreError> {
        Ok(self.is_idle(last_used, now) && !records.session_owns_open_tasks(id, now).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_only_beyond_the_idle_time() {
        let expiry = SessionExpiry::new(Duration::from_secs(10));
        assert!(!expiry.is_idle(1_000, 11_000));
        assert!(expiry.is_idle(1_000, 11_001));
    }

    #[test]
    fn uses_are_written_within_a_quarter_of_the_idle_time_and_a_minute() {
        let short = SessionExpiry::new(Duration::from_secs(4));
        assert!(!short.touch_due(0, 1_000));
        assert!(short.touch_due(0, 1_001));
        let long = SessionExpiry::new(Duration::from_secs(3_600));
        assert!(!long.touch_due(0, 60_000));
        assert!(long.touch_due(0, 60_001));
    }
}
