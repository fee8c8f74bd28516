//! Wakes claimers when a job queued to start later becomes due: this
//! process's pool at once, other processes with `Signal::Due` (the queue
//! wake file, or a notification on `taskbroker_queued`). The times are those of the jobs this
//! process queued; jobs queued elsewhere (or before a restart) are found by
//! the pools' idle looks, within `idle_max` of their start.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::Feed;
use crate::clock::now_ms;

/// The start times still to come, and the task that waits for them.
#[derive(Debug)]
pub struct StartAlarm {
    times: Mutex<BTreeSet<i64>>,
    changed: Notify,
}

impl StartAlarm {
    /// An alarm whose task wakes `job_queued` and announces on `feed` at
    /// each start time set.
    pub fn spawn(job_queued: Arc<Notify>, feed: Feed) -> Arc<Self> {
        let alarm = Arc::new(Self {
            times: Mutex::default(),
            changed: Notify::new(),
        });
        tokio::spawn(ring(alarm.clone(), job_queued, feed));
        alarm
    }

    /// Ring at `at` (ms since the epoch).
    pub fn set(&self, at: i64) {
        let earliest = {
            let mut times = self.times.lock().unwrap_or_else(|p| p.into_inner());
            times.insert(at);
            times.first() == Some(&at)
        };
        if earliest {
            self.changed.notify_one();
        }
    }

    /// Whether any time has passed (those are dropped), and the earliest
    /// still to come.
    fn next(&self, now: i64) -> (bool, Option<i64>) {
        let mut times = self.times.lock().unwrap_or_else(|p| p.into_inner());
        let later = times.split_off(&(now + 1));
        let passed = !times.is_empty();
        *times = later;
        (passed, times.first().copied())
    }
}

/// The alarm's task, for the process's life: sleep to the earliest time
/// and wake the claimers.
async fn ring(alarm: Arc<StartAlarm>, job_queued: Arc<Notify>, feed: Feed) {
    loop {
        let (passed, next) = alarm.next(now_ms());
        if passed {
            job_queued.notify_one();
            feed.announce_due();
        }
        // A time set meanwhile left a permit: the wait ends at once.
        match next {
            Some(at) => {
                let wait = Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0));
                tokio::select! {
                    _ = alarm.changed.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            None => alarm.changed.notified().await,
        }
    }
}
