//! What becomes of a tool's tasks once their ttl has passed (issue 27
//! item 3): `retain_completed`, `retain_failed`, `retain_cancelled` and
//! `archive`, set for every tool in `[server]` and per tool in `[[tool]]`,
//! `[[upstream]]` and `[upstream.tools.X]`. The rule a task gets is fixed
//! when it is created and stored on its row (the purge applies it, in
//! whichever process runs it).

use std::time::Duration;

use taskbroker_storage::Retention;

/// The retention settings of one section as written (unset: what an
/// enclosing section says, else not kept past the ttl and deleted).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RetentionSettings {
    /// How long a completed task is kept after it completed.
    pub completed: Option<Duration>,
    /// How long a failed task is kept after it failed.
    pub failed: Option<Duration>,
    /// How long a cancelled task is kept after it was cancelled.
    pub cancelled: Option<Duration>,
    /// Moved to the archive table instead of deleted.
    pub archive: Option<bool>,
}

impl RetentionSettings {
    /// `self`, with what it leaves unset taken from `fallback`.
    pub fn or(self, fallback: Self) -> Self {
        Self {
            completed: self.completed.or(fallback.completed),
            failed: self.failed.or(fallback.failed),
            cancelled: self.cancelled.or(fallback.cancelled),
            archive: self.archive.or(fallback.archive),
        }
    }

    /// The rule stored on a task.
    pub fn rule(self) -> Retention {
        let ms = |d: Option<Duration>| d.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Retention {
            completed_ms: ms(self.completed),
            failed_ms: ms(self.failed),
            cancelled_ms: ms(self.cancelled),
            archive: self.archive.unwrap_or(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_setting_wins_and_the_rest_falls_back() {
        let server = RetentionSettings {
            completed: Some(Duration::from_secs(60)),
            failed: Some(Duration::from_secs(600)),
            archive: Some(true),
            ..Default::default()
        };
        let tool = RetentionSettings {
            failed: Some(Duration::from_secs(5)),
            archive: Some(false),
            ..Default::default()
        };
        assert_eq!(
            tool.or(server).rule(),
            Retention {
                completed_ms: Some(60_000),
                failed_ms: Some(5_000),
                cancelled_ms: None,
                archive: false,
            }
        );
        assert_eq!(RetentionSettings::default().rule(), Retention::default());
    }
}
