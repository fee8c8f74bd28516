//! The rows of tasks this process created and runs in its own pool, kept
//! for a short while so that the first look of their `tasks/result` reads
//! nothing: until this process sees a change of such a task, the row as
//! created is the row as it is; once this process itself ends the task,
//! the ended row is (a terminal task never changes again). The feed keeps
//! them up to date as it publishes changes (`Feed::publish`).
//!
//! Bounded: at most [`KEPT`] rows, each for at most [`KEEP_FOR`], without
//! the call's arguments (no look of a result uses them) and with an ended
//! task's result only up to [`KEPT_RESULT_BYTES`] (a larger one is read);
//! a row is taken by the first look of its `tasks/result`, so in a broker
//! whose clients ask for their results the map holds only the tasks
//! between their creation and that look.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{TaskOutcome, TaskRow};

/// Most rows kept; past it the oldest go first.
const KEPT: usize = 4096;
/// How long a row is kept at most: a client asks for its result at once or
/// reads the task when it comes back.
const KEEP_FOR: Duration = Duration::from_secs(10);

/// The largest result kept with an ended row, bytes of JSON text (the
/// change feed's reads carry outcomes up to the same size).
const KEPT_RESULT_BYTES: usize = 4096;

/// Rows by task id, and the order they came in.
#[derive(Debug, Default)]
pub(super) struct CreatedRows {
    rows: HashMap<Arc<str>, (TaskRow, Instant)>,
    order: VecDeque<(Arc<str>, Instant)>,
}

impl CreatedRows {
    /// Keep `row` (just created) from now.
    pub(super) fn keep(&mut self, row: &TaskRow) {
        let now = Instant::now();
        self.drop_old(now);
        let task_id: Arc<str> = Arc::from(row.task_id.as_str());
        let row = TaskRow {
            arguments: String::new(),
            ..row.clone()
        };
        self.rows.insert(task_id.clone(), (row, now));
        self.order.push_back((task_id, now));
    }

    /// Take the row of `task_id`, if kept.
    pub(super) fn take(&mut self, task_id: &str) -> Option<TaskRow> {
        let (row, at) = self.rows.remove(task_id)?;
        (at.elapsed() < KEEP_FOR).then_some(row)
    }

    /// Whether a row of `task_id` is kept.
    pub(super) fn has(&self, task_id: &str) -> bool {
        self.rows.contains_key(task_id)
    }

    /// This process ended the task with `outcome` at `at`: its row is now
    /// the ended one, for good.
    pub(super) fn ended(&mut self, task_id: &str, outcome: &TaskOutcome, at: i64) {
        if outcome.result.len() > KEPT_RESULT_BYTES {
            self.rows.remove(task_id);
        } else if let Some((row, _)) = self.rows.get_mut(task_id) {
            *row = row.clone().ended_with(outcome, at);
        }
    }

    /// Something else changed the task: its row is no longer known.
    /// Its end, once recorded, is the last change there is.
    pub(super) fn changed(&mut self, task_id: &str) {
        if self
            .rows
            .get(task_id)
            .is_some_and(|(row, _)| !row.status.is_terminal())
        {
            self.rows.remove(task_id);
        }
    }

    /// Forget `task_id`.
    pub(super) fn forget(&mut self, task_id: &str) {
        self.rows.remove(task_id);
    }

    /// Drop rows kept too long, and the oldest past [`KEPT`].
    fn drop_old(&mut self, now: Instant) {
        while let Some((task_id, at)) = self.order.front() {
            let full = self.order.len() >= KEPT;
            if !full && now.duration_since(*at) < KEEP_FOR {
                break;
            }
            // The entry of the row kept then (not a later one of the same
            // id, which has its own place in the order).
            if self.rows.get(task_id).is_some_and(|(_, kept)| kept == at) {
                self.rows.remove(task_id);
            }
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use super::*;
    use crate::store::{ResultKind, TaskStatus};

    fn row(task_id: &str) -> TaskRow {
        TaskRow {
            seq: 1,
            task_id: task_id.to_owned(),
            owner: "alice".to_owned(),
            tool: "sleep".to_owned(),
            arguments: r#"{"seconds":0}"#.to_owned(),
            status: TaskStatus::Working,
            status_message: None,
            created_at: 10,
            updated_at: 10,
            ttl_ms: None,
            expires_at: None,
            poll_interval_ms: None,
            progress_token: None,
            result: None,
            result_kind: None,
            tool_error: false,
        }
    }

    fn outcome(result: &str) -> TaskOutcome {
        TaskOutcome {
            status: TaskStatus::Completed,
            status_message: None,
            result: result.to_owned(),
            result_kind: ResultKind::Result,
            tool_error: false,
        }
    }

    #[test]
    fn a_row_is_taken_once_without_its_arguments() {
        let mut rows = CreatedRows::default();
        rows.keep(&row("a"));
        let taken = rows.take("a").unwrap();
        assert_eq!(taken.arguments, "");
        assert_eq!(taken.status, TaskStatus::Working);
        assert!(rows.take("a").is_none(), "a second look reads the task");
    }

    #[test]
    fn a_change_forgets_a_working_row_but_not_an_ended_one() {
        let mut rows = CreatedRows::default();
        rows.keep(&row("a"));
        rows.changed("a");
        assert!(rows.take("a").is_none());

        rows.keep(&row("b"));
        rows.ended("b", &outcome(r#"{"content":[]}"#), 20);
        rows.changed("b");
        let ended = rows.take("b").unwrap();
        assert_eq!(ended.status, TaskStatus::Completed);
        assert_eq!(ended.result.as_deref(), Some(r#"{"content":[]}"#));
        assert_eq!(ended.updated_at, 20);
    }

    #[test]
    fn an_end_with_a_large_result_is_read_instead() {
        let mut rows = CreatedRows::default();
        rows.keep(&row("a"));
        rows.ended("a", &outcome(&"x".repeat(KEPT_RESULT_BYTES + 1)), 20);
        assert!(rows.take("a").is_none());
    }

    #[test]
    fn the_oldest_rows_go_past_the_bound() {
        let mut rows = CreatedRows::default();
        for i in 0..KEPT + 10 {
            rows.keep(&row(&format!("t{i}")));
        }
        assert!(rows.rows.len() <= KEPT);
        assert!(rows.order.len() <= KEPT);
        assert!(rows.take("t0").is_none(), "the first went first");
        assert!(rows.take(&format!("t{}", KEPT + 9)).is_some());
    }
}
