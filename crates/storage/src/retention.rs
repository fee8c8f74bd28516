//! Retention of tasks past their ttl (issue 27 item 3): what happens to a
//! task row once its ttl has passed, decided here once for both drivers.
//!
//! A task's rule is fixed when it is created, like its ttl, and stored on
//! its row ([`Retention`]): how long after it finished a completed, failed
//! or cancelled task is kept, and whether it goes to the archive table
//! rather than being deleted. Past its ttl a task is never served again
//! (T-33: clients are told it expired); a rule only keeps its row for
//! operators (`sqlite3`/`psql`, `taskbroker tasks list --db`). The purge
//! looks at each task once when its ttl passes ([`fate`]): a row to keep
//! gets `keep_until` and leaves the ttl index, so later passes read only
//! rows that are due, in bounded batches.

/// How long a task is kept after it finished, by status, and where it
/// goes then. `None`: not kept past its ttl.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// A completed task, ms after it completed.
    pub completed_ms: Option<i64>,
    /// A failed task, ms after it failed.
    pub failed_ms: Option<i64>,
    /// A cancelled task, ms after it was cancelled.
    pub cancelled_ms: Option<i64>,
    /// Moved to `tasks_archive` (with its status history) instead of
    /// deleted.
    pub archive: bool,
}

impl Retention {
    /// How long a task that ended in `status` is kept after it ended;
    /// `None` for a status without a rule or a task not yet finished.
    pub fn keep_ms(&self, status: &str) -> Option<i64> {
        match status {
            "completed" => self.completed_ms,
            "failed" => self.failed_ms,
            "cancelled" => self.cancelled_ms,
            _ => None,
        }
    }
}

/// A task the purge looks at: past its ttl and not yet decided, or kept
/// and now due; the columns of its row, as either driver reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionCandidate {
    /// `tasks.seq`.
    pub seq: i64,
    /// `tasks.tool`.
    pub tool: String,
    /// `tasks.status`.
    pub status: String,
    /// `tasks.updated_at`: for a terminal task, when it finished.
    pub updated_at: i64,
    /// `tasks.keep_until`: set once a rule kept it past its ttl.
    pub keep_until: Option<i64>,
    /// `tasks.retain_completed_ms`.
    pub retain_completed_ms: Option<i64>,
    /// `tasks.retain_failed_ms`.
    pub retain_failed_ms: Option<i64>,
    /// `tasks.retain_cancelled_ms`.
    pub retain_cancelled_ms: Option<i64>,
    /// `tasks.archive`.
    pub archive: bool,
}

impl RetentionCandidate {
    /// Its rule.
    pub fn retention(&self) -> Retention {
        Retention {
            completed_ms: self.retain_completed_ms,
            failed_ms: self.retain_failed_ms,
            cancelled_ms: self.retain_cancelled_ms,
            archive: self.archive,
        }
    }
}

/// What the purge does with a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Kept (for operators only) until this time, ms.
    Keep {
        /// Removed then.
        until: i64,
    },
    /// Moved to `tasks_archive`.
    Archive,
    /// Deleted with its rows.
    Delete,
}

/// What happens now to `task`, past its ttl or kept until now: kept while
/// its status's rule says so (counted from when it finished), else
/// archived or deleted as its rule says. A task not finished when its ttl
/// passes has no rule that keeps it.
pub fn fate(task: &RetentionCandidate, now: i64) -> Fate {
    let until = task.keep_until.or_else(|| {
        task.retention()
            .keep_ms(&task.status)
            .map(|keep| task.updated_at.saturating_add(keep))
    });
    match until {
        Some(until) if until > now => Fate::Keep { until },
        _ if task.archive => Fate::Archive,
        _ => Fate::Delete,
    }
}

/// The writes of one purge pass, by fate.
#[derive(Debug, Default)]
pub struct PurgePlan {
    /// `(seq, keep_until)` of the tasks to keep.
    pub keep: Vec<(i64, i64)>,
    /// Tasks to copy to the archive (then delete).
    pub archive: Vec<i64>,
    /// Tasks to delete without a copy.
    pub delete: Vec<i64>,
}

impl PurgePlan {
    /// The fate of each of `candidates` at `now`.
    pub fn of(candidates: impl IntoIterator<Item = RetentionCandidate>, now: i64) -> Self {
        let mut plan = Self::default();
        for task in candidates {
            match fate(&task, now) {
                Fate::Keep { until } => plan.keep.push((task.seq, until)),
                Fate::Archive => plan.archive.push(task.seq),
                Fate::Delete => plan.delete.push(task.seq),
            }
        }
        plan
    }

    /// The tasks that leave `tasks`: archived ones and deleted ones.
    pub fn gone(&self) -> Vec<i64> {
        self.archive.iter().chain(&self.delete).copied().collect()
    }

    /// What the pass did once its writes commit.
    pub fn report(&self) -> PurgeReport {
        PurgeReport {
            deleted: self.delete.len() as u64,
            archived: self.archive.len() as u64,
            kept: self.keep.len() as u64,
        }
    }
}

/// Row keys as one JSON array, for SQLite's `json_each`.
#[cfg(feature = "sqlx")]
pub fn json_ids(ids: &[i64]) -> String {
    serde_json::Value::from(ids.to_vec()).to_string()
}

/// `(seq, keep_until)` pairs as a JSON array of two-element arrays, for
/// SQLite's `json_each`.
#[cfg(feature = "sqlx")]
pub fn json_pairs(pairs: &[(i64, i64)]) -> String {
    serde_json::Value::from(
        pairs
            .iter()
            .map(|&(a, b)| serde_json::Value::from(vec![a, b]))
            .collect::<Vec<_>>(),
    )
    .to_string()
}

/// What one purge pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Tasks deleted with their rows.
    pub deleted: u64,
    /// Tasks moved to the archive.
    pub archived: u64,
    /// Tasks past their ttl given a `keep_until` by their rule.
    pub kept: u64,
}

impl std::ops::AddAssign for PurgeReport {
    fn add_assign(&mut self, other: Self) {
        self.deleted += other.deleted;
        self.archived += other.archived;
        self.kept += other.kept;
    }
}

impl PurgeReport {
    /// Tasks the pass looked at.
    pub fn total(&self) -> u64 {
        self.deleted + self.archived + self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(status: &str, retention: Retention, keep_until: Option<i64>) -> RetentionCandidate {
        RetentionCandidate {
            seq: 1,
            tool: "t".into(),
            status: status.into(),
            updated_at: 1_000,
            keep_until,
            retain_completed_ms: retention.completed_ms,
            retain_failed_ms: retention.failed_ms,
            retain_cancelled_ms: retention.cancelled_ms,
            archive: retention.archive,
        }
    }

    #[test]
    fn a_rule_keeps_its_status_from_when_the_task_finished() {
        let rule = Retention {
            failed_ms: Some(500),
            ..Retention::default()
        };
        assert_eq!(
            fate(&task("failed", rule, None), 1_200),
            Fate::Keep { until: 1_500 }
        );
        assert_eq!(fate(&task("failed", rule, None), 1_500), Fate::Delete);
        assert_eq!(fate(&task("completed", rule, None), 1_200), Fate::Delete);
        // Not finished when its ttl passed: no rule keeps it.
        assert_eq!(fate(&task("working", rule, None), 1_200), Fate::Delete);
        // Decided once: keep_until, not the rule, says when it goes.
        assert_eq!(
            fate(&task("failed", rule, Some(9_000)), 1_500),
            Fate::Keep { until: 9_000 }
        );
        let archive = Retention {
            archive: true,
            ..rule
        };
        assert_eq!(
            fate(&task("failed", archive, Some(1_500)), 1_500),
            Fate::Archive
        );
        assert_eq!(
            fate(&task("cancelled", archive, None), 1_200),
            Fate::Archive
        );
    }
}
