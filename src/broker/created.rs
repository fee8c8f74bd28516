//! The rows of tasks this process created with a job due now, kept for a
//! short while so that the first look of their `tasks/result` reads
//! nothing: until this process sees a change of such a task, the row as
//! created is the row as it is; once this process sees the task end with
//! its outcome, the ended row is (a terminal task never changes again).
//! The feed keeps them up to date as it publishes changes
//! (`Feed::publish`), and reads at once the changes other processes make
//! to a task kept here (its driver's signal names the task, PostgreSQL) or
//! to any task (SQLite), so a kept row never outlives a change the feed
//! heard of: whoever runs the job (this process's pool, handed it in the
//! creating commit or claiming it later, or a worker process), the task's
//! status changes and its end reach this process's feed (a claim changes
//! no task row).
//!
//! A task is expected before its creating commit ([`CreatedRows::expect`])
//! and its row kept after it ([`CreatedRows::keep`]) only if no change of
//! it was published in between: whoever learns of a task from its commit
//! (another server's client, an idempotent retry) can change it no earlier
//! than that commit.
//!
//! Bounded: at most [`MAX_KEPT_ROWS`], each for at most [`KEEP_FOR`],
//! without the call's arguments (no look of a result uses them) and with an
//! ended task's result only up to [`KEPT_RESULT_BYTES`] (a larger one is
//! read); a row is taken by the first look of its `tasks/result`, so in a
//! broker whose clients ask for their results the map holds only the tasks
//! between their creation and that look.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store::{TaskOutcome, TaskRow};

/// Most rows kept (and tasks expected); past it the oldest go first.
const MAX_KEPT_ROWS: usize = 4096;
/// How long a row is kept at most: a client asks for its result at once or
/// reads the task when it comes back.
const KEEP_FOR: Duration = Duration::from_secs(10);
/// The largest result kept with an ended row, bytes of JSON text: a larger
/// one is read from the database when asked for.
const KEPT_RESULT_BYTES: usize = 4096;

/// What is kept of one task.
#[derive(Debug)]
enum Kept {
    /// Its creating commit is under way.
    Expected,
    /// Its row as it is.
    Row(Box<TaskRow>),
}

/// One task expected or kept.
#[derive(Debug)]
struct Entry {
    kept: Kept,
    /// When it was expected.
    at: Instant,
    /// Whether the driver's notice of its creation has passed
    /// ([`CreatedRows::concerns_notice`]).
    noticed: bool,
}

impl Entry {
    /// Within [`KEEP_FOR`] of being expected: past it, it is as if gone.
    fn fresh(&self) -> bool {
        self.at.elapsed() < KEEP_FOR
    }
}

/// Rows by task id, and the order they came in.
#[derive(Debug, Default)]
pub(super) struct CreatedRows {
    rows: HashMap<Arc<str>, Entry>,
    order: VecDeque<(Arc<str>, Instant)>,
}

impl CreatedRows {
    /// `task_id` is about to be created: a change of it published from now
    /// on means its row is not to be kept.
    pub(super) fn expect(&mut self, task_id: &str) {
        let now = Instant::now();
        self.drop_old(now);
        let task_id: Arc<str> = Arc::from(task_id);
        let entry = Entry {
            kept: Kept::Expected,
            at: now,
            noticed: false,
        };
        self.rows.insert(task_id.clone(), entry);
        self.order.push_back((task_id, now));
    }

    /// Keep `row`, just created, if it was expected and nothing changed it
    /// since.
    pub(super) fn keep(&mut self, row: &TaskRow) {
        if let Some(Entry {
            kept: kept @ Kept::Expected,
            ..
        }) = self.rows.get_mut(row.task_id.as_str())
        {
            *kept = Kept::Row(Box::new(TaskRow {
                arguments: String::new(),
                ..row.clone()
            }));
        }
    }

    /// Take the row of `task_id`, if kept.
    pub(super) fn take(&mut self, task_id: &str) -> Option<TaskRow> {
        let entry = self.rows.remove(task_id)?;
        let fresh = entry.fresh();
        match entry.kept {
            Kept::Row(row) if fresh => Some(*row),
            _ => None,
        }
    }

    /// Whether `task_id` is expected or its row kept (and not past
    /// [`KEEP_FOR`]: [`CreatedRows::take`] would not give it).
    pub(super) fn has(&self, task_id: &str) -> bool {
        self.rows.get(task_id).is_some_and(Entry::fresh)
    }

    /// Whether a notice from the driver that `task_id` changed concerns
    /// this process for its kept row: the first notice after the task was
    /// expected is its own creation's (the driver notifies in commit order,
    /// and nothing changes a task before the commit that creates it), which
    /// changes nothing kept; a later one may be another process's change.
    pub(super) fn concerns_notice(&mut self, task_id: &str) -> bool {
        match self.rows.get_mut(task_id) {
            Some(e) if e.fresh() => std::mem::replace(&mut e.noticed, true),
            _ => false,
        }
    }

    /// The task ended with `outcome` at `at`: its row is now the ended one,
    /// for good.
    pub(super) fn ended(&mut self, task_id: &str, outcome: &TaskOutcome, at: i64) {
        match self.rows.get_mut(task_id) {
            Some(Entry {
                kept: Kept::Row(row),
                ..
            }) if outcome.result.len() <= KEPT_RESULT_BYTES => {
                **row = (**row).clone().ended_with(outcome, at);
            }
            Some(_) => {
                self.rows.remove(task_id);
            }
            None => {}
        }
    }

    /// Something else changed the task: its row is no longer known. Its
    /// end, once recorded, is the last change there is.
    pub(super) fn changed(&mut self, task_id: &str) {
        let ended = matches!(
            self.rows.get(task_id),
            Some(Entry { kept: Kept::Row(row), .. }) if row.status.is_terminal()
        );
        if !ended {
            self.rows.remove(task_id);
        }
    }

    /// Forget `task_id`.
    pub(super) fn forget(&mut self, task_id: &str) {
        self.rows.remove(task_id);
    }

    /// Drop rows kept too long, and the oldest past [`MAX_KEPT_ROWS`].
    fn drop_old(&mut self, now: Instant) {
        while let Some((task_id, at)) = self.order.front() {
            let full = self.order.len() >= MAX_KEPT_ROWS;
            if !full && now.duration_since(*at) < KEEP_FOR {
                break;
            }
            // The entry of the task expected then (not a later one of the
            // same id, which has its own place in the order).
            if self.rows.get(task_id).is_some_and(|e| e.at == *at) {
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

    /// `task_id` expected, then created as `row(task_id)`.
    fn created(rows: &mut CreatedRows, task_id: &str) {
        rows.expect(task_id);
        rows.keep(&row(task_id));
    }

    #[test]
    fn a_row_is_taken_once_without_its_arguments() {
        let mut rows = CreatedRows::default();
        created(&mut rows, "a");
        let taken = rows.take("a").unwrap();
        assert_eq!(taken.arguments, "");
        assert_eq!(taken.status, TaskStatus::Working);
        assert!(rows.take("a").is_none(), "a second look reads the task");
    }

    #[test]
    fn a_change_forgets_a_working_row_but_not_an_ended_one() {
        let mut rows = CreatedRows::default();
        created(&mut rows, "a");
        rows.changed("a");
        assert!(rows.take("a").is_none());

        created(&mut rows, "b");
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
        created(&mut rows, "a");
        rows.ended("a", &outcome(&"x".repeat(KEPT_RESULT_BYTES + 1)), 20);
        assert!(rows.take("a").is_none());
    }

    #[test]
    fn the_oldest_rows_go_past_the_bound() {
        let mut rows = CreatedRows::default();
        for i in 0..MAX_KEPT_ROWS + 10 {
            created(&mut rows, &format!("t{i}"));
        }
        assert!(rows.rows.len() <= MAX_KEPT_ROWS);
        assert!(rows.order.len() <= MAX_KEPT_ROWS);
        assert!(rows.take("t0").is_none(), "the first went first");
        assert!(rows.take(&format!("t{}", MAX_KEPT_ROWS + 9)).is_some());
    }

    #[test]
    fn a_task_expected_or_kept_concerns_the_feed_until_taken_and_unwatched() {
        let feed = crate::broker::Feed::new();
        let concerned = feed.concerned();
        assert!(!concerned("a", "alice"));
        // From before its creating commit: the notice of its creation (the
        // first) is passed over, a later one (another process's change of
        // it) read at once.
        feed.expect_created("a");
        feed.remember_created(&row("a"));
        assert!(!concerned("a", "alice"), "its creation's notice");
        assert!(concerned("a", "alice"));
        assert!(concerned("a", "alice"));
        // tasks/result watches it, then takes the row.
        let watch = feed.watch_task("a");
        assert!(feed.take_created("a").is_some());
        assert!(concerned("a", "alice"), "watched");
        drop(watch);
        assert!(!concerned("a", "alice"), "neither kept nor watched");
    }

    #[test]
    fn the_feed_forgets_a_kept_row_at_a_change_and_keeps_its_end() {
        let feed = crate::broker::Feed::new();
        feed.expect_created("a");
        feed.remember_created(&row("a"));
        feed.written("a");
        assert!(feed.take_created("a").is_none(), "changed: read again");

        feed.expect_created("b");
        feed.remember_created(&row("b"));
        feed.ended("b", || outcome("{}"), 20);
        let ended = feed.take_created("b").unwrap();
        assert_eq!(ended.status, TaskStatus::Completed);
        assert_eq!(ended.result.as_deref(), Some("{}"));
    }

    #[test]
    fn a_change_during_the_creating_commit_keeps_nothing() {
        let mut rows = CreatedRows::default();
        rows.expect("a");
        rows.changed("a");
        rows.keep(&row("a"));
        assert!(rows.take("a").is_none());

        rows.expect("b");
        rows.ended("b", &outcome("{}"), 20);
        rows.keep(&row("b"));
        assert!(rows.take("b").is_none());

        // Never expected (not handed off): nothing kept.
        rows.keep(&row("c"));
        assert!(rows.take("c").is_none());
    }

    #[test]
    fn a_task_expected_again_keeps_its_newer_place() {
        let mut rows = CreatedRows::default();
        created(&mut rows, "a");
        let first = rows.order.front().map(|(_, at)| *at).unwrap();
        rows.forget("a");
        // Another instant for the second place.
        std::thread::sleep(Duration::from_millis(2));
        created(&mut rows, "a");
        // The first place goes when it is old; the row of the second stays.
        rows.drop_old(first + KEEP_FOR);
        assert!(rows.has("a"));
        assert_eq!(rows.order.len(), 1);
    }
}
