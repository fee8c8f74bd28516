//! Which worker processes a queued job's wake-up names (issue 26): as
//! PostgreSQL's notification does (migrations V15 and V19 there), a process
//! that queues jobs names, in the queue's wake file, as many live worker
//! processes serving their tools as it takes to run them (each has room
//! for its concurrency less the slots its jobs hold, at least one; at most
//! [`MAX_NAMED`] named; migration V20 here and there: the tools a worker
//! claims, as it reported them); only they claim at once, the others look a
//! moment later if still idle. With no live worker process known to serve
//! them, the poke names no one and every claimer looks, as before.
//!
//! The live worker processes (kind `process`, state `live`, heartbeat
//! within half their lease), their tools and the slots each reported its
//! jobs held at its last heartbeat are read at most once per [`FRESH_FOR`], in the
//! background: a poke never waits for a read. Names are taken in turn from
//! that list, those with room first, so consecutive pokes spread over
//! every worker. A worker that started since the last read is not named
//! until the next one (it hears the pokes for others and looks a moment
//! later); one that stopped since is named in vain (the others look a
//! moment later).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::SqlitePool;
use taskbroker_storage::{NAMED_CLAIMERS, QueuedJobs};

/// At most this many worker processes named per poke.
pub(crate) const MAX_NAMED: usize = 8;

/// How long a read of the live worker processes is used.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// The live worker processes, as last read, and whose turn is next.
#[derive(Debug, Default)]
pub(crate) struct Claimers {
    state: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// In `worker_id` order.
    live: Vec<Live>,
    read_at: Option<Instant>,
    reading: bool,
    next: usize,
}

impl Claimers {
    /// The payload of a poke for `jobs` queued: `claim:` and the ids of the
    /// workers serving their tools whose turn it is, as many as have room
    /// for the jobs, or empty (everyone) when no live worker process is
    /// known to serve them. Starts a read of them in the background when
    /// the last one is stale.
    pub(crate) fn payload(self: &Arc<Self>, jobs: &QueuedJobs, read: &SqlitePool) -> String {
        let Ok(mut known) = self.state.lock() else {
            return String::new();
        };
        let stale = known.read_at.is_none_or(|at| at.elapsed() >= FRESH_FOR);
        if stale
            && !known.reading
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            known.reading = true;
            let (me, pool) = (self.clone(), read.clone());
            runtime.spawn(async move { me.refresh(&pool).await });
        }
        let Some(named) = known.name(jobs) else {
            return String::new();
        };
        let mut payload = String::from(NAMED_CLAIMERS);
        for (i, at) in named.into_iter().enumerate() {
            if i > 0 {
                payload.push(' ');
            }
            payload.push_str(&known.live[at].worker_id);
        }
        payload
    }

    async fn refresh(&self, read: &SqlitePool) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let live = sqlx::query!(
            "SELECT worker_id, concurrency, jobs_running, tools FROM workers
              WHERE kind = 'process' AND state = 'live' AND heartbeat_at + lease_ms / 2 > ?
              ORDER BY worker_id",
            now
        )
        .fetch_all(read)
        .await
        .map(|rows| {
            rows.into_iter()
                .map(|r| Live {
                    worker_id: r.worker_id,
                    room: r.concurrency - r.jobs_running,
                    tools: r.tools.and_then(|t| serde_json::from_str(&t).ok()),
                })
                .collect()
        });
        let Ok(mut known) = self.state.lock() else {
            return;
        };
        known.reading = false;
        match live {
            Ok(live) => {
                known.live = live;
                known.read_at = Some(Instant::now());
            }
            Err(e) => {
                // Named no one until a read succeeds: every claimer looks.
                tracing::debug!(error = %e, "live worker processes not read; queued jobs wake every claimer");
                known.live.clear();
                known.read_at = Some(Instant::now());
            }
        }
    }
}

/// A live worker process as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Live {
    worker_id: String,
    /// Its concurrency less the slots it reported held (may be 0 or less:
    /// the report lags).
    room: i64,
    /// The tools it claims; None: it did not say (any).
    tools: Option<HashSet<String>>,
}

impl Live {
    /// Whether it may claim a job of `tool` (None: a tool not told).
    fn serves(&self, tool: Option<&str>) -> bool {
        match (&self.tools, tool) {
            (Some(tools), Some(tool)) => tools.contains(tool),
            _ => true,
        }
    }
}

impl Known {
    /// Whose turn it is for `jobs` queued (indexes into `live`, in turn):
    /// for each tool, from the next in turn, those serving it with room
    /// until their room covers its jobs, then, if it does not, those
    /// reported full (each counted as room for one); at most
    /// [`MAX_NAMED`], the first for each tool before the others. None when
    /// no known worker serves them.
    fn name(&mut self, jobs: &QueuedJobs) -> Option<Vec<usize>> {
        let n = self.live.len();
        // Jobs per tool (None: tools not told).
        let mut wanted: BTreeMap<Option<&str>, i64> = BTreeMap::new();
        for tool in &jobs.tools {
            *wanted.entry(Some(tool.as_str())).or_default() += 1;
        }
        if jobs.untold > 0 || wanted.is_empty() {
            let untold = i64::try_from(jobs.untold.max(1)).unwrap_or(i64::MAX);
            *wanted.entry(None).or_default() += untold;
        }
        let in_turn = (0..n).map(|i| (self.next + i) % n);
        let order: Vec<usize> = in_turn
            .clone()
            .filter(|&at| self.live[at].room > 0)
            .chain(in_turn.filter(|&at| self.live[at].room <= 0))
            .collect();
        // Per worker, by its place in `order`: named, and first for a tool.
        let mut named = vec![None::<bool>; n];
        for (tool, want) in wanted {
            let mut covered = 0i64;
            for &at in order.iter().filter(|&&at| self.live[at].serves(tool)) {
                if covered >= want {
                    break;
                }
                let first = covered == 0;
                covered = covered.saturating_add(self.live[at].room.max(1));
                named[at] = Some(named[at].unwrap_or(false) || first);
            }
        }
        let mut chosen: Vec<(usize, usize)> = order
            .iter()
            .enumerate()
            .filter_map(|(place, &at)| named[at].map(|first| (usize::from(!first), place)))
            .collect();
        chosen.sort_unstable();
        chosen.truncate(MAX_NAMED);
        let mut places: Vec<usize> = chosen.into_iter().map(|(_, place)| place).collect();
        places.sort_unstable();
        // The next poke starts after the last one named.
        let &last = places.last()?;
        self.next = (order[last] + 1) % n;
        Some(places.into_iter().map(|place| order[place]).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(rooms: &[i64]) -> Known {
        Known {
            live: rooms
                .iter()
                .enumerate()
                .map(|(i, &room)| Live {
                    worker_id: format!("w{i}"),
                    room,
                    tools: None,
                })
                .collect(),
            ..Known::default()
        }
    }

    #[test]
    fn a_poke_for_fewer_jobs_than_a_worker_has_room_for_names_one_in_turn() {
        let mut k = known(&[8, 8, 8]);
        assert_eq!(k.name(&QueuedJobs::untold(3)), Some(vec![0]));
        assert_eq!(k.name(&QueuedJobs::untold(1)), Some(vec![1]));
        assert_eq!(k.name(&QueuedJobs::untold(8)), Some(vec![2]));
        assert_eq!(k.name(&QueuedJobs::untold(2)), Some(vec![0]));
    }

    #[test]
    fn workers_are_named_until_their_room_covers_the_jobs_those_reported_full_last() {
        // w0 full, w1 room 2, w2 room 3, w3 room 8.
        let mut k = known(&[0, 2, 3, 8]);
        assert_eq!(k.name(&QueuedJobs::untold(4)), Some(vec![1, 2]));
        // From w3 on: w3 covers 5.
        assert_eq!(k.name(&QueuedJobs::untold(5)), Some(vec![3]));
        // More jobs than all the room: every worker, the full one last.
        assert_eq!(k.name(&QueuedJobs::untold(100)), Some(vec![1, 2, 3, 0]));
    }

    #[test]
    fn no_more_than_max_named_and_no_one_when_none_is_known() {
        let mut k = known(&[1; 12]);
        assert_eq!(
            k.name(&QueuedJobs::untold(50)).map(|v| v.len()),
            Some(MAX_NAMED)
        );
        assert_eq!(known(&[]).name(&QueuedJobs::untold(3)), None);
    }

    /// `k` with worker `at` serving only `tools`.
    fn serving(mut k: Known, at: usize, tools: &[&str]) -> Known {
        k.live[at].tools = Some(tools.iter().map(|t| (*t).to_owned()).collect());
        k
    }

    fn of(tools: &[&str]) -> QueuedJobs {
        QueuedJobs {
            tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            untold: 0,
        }
    }

    #[test]
    fn a_job_names_only_workers_serving_its_tool_or_that_did_not_say() {
        // w0 serves build, w1 report, w2 both, w3 did not say.
        let k = serving(known(&[8, 8, 8, 8]), 0, &["build"]);
        let k = serving(k, 1, &["report"]);
        let mut k = serving(k, 2, &["build", "report"]);
        // Each report job, in turn: w1, w2, w3, then w1 again (never w0).
        let named: Vec<_> = (0..4).map(|_| k.name(&of(&["report"]))).collect();
        assert_eq!(
            named,
            [Some(vec![1]), Some(vec![2]), Some(vec![3]), Some(vec![1])]
        );
        // Jobs of tools not told go to anyone in turn.
        assert_eq!(k.name(&QueuedJobs::untold(1)), Some(vec![2]));
    }

    #[test]
    fn jobs_of_two_tools_name_a_worker_for_each_and_none_serving_names_no_one() {
        let k = serving(known(&[2, 2, 2]), 0, &["build"]);
        let k = serving(k, 1, &["report"]);
        let mut k = serving(k, 2, &["report"]);
        // 1 build (w0) and 3 report jobs (w1 covers 2, then w2).
        assert_eq!(
            k.name(&of(&["report", "build", "report", "report"])),
            Some(vec![0, 1, 2])
        );
        // Nobody known serves deploy: the poke names no one (all look).
        assert_eq!(k.name(&of(&["deploy"])), None);
    }

    #[test]
    fn past_the_cap_each_tool_keeps_a_worker_named() {
        // 12 workers of room 1 serving a; w11 alone serves b too.
        let mut k = serving(known(&[1; 12]), 11, &["a", "b"]);
        for at in 0..11 {
            k = serving(k, at, &["a"]);
        }
        let named = k.name(&of(&[&["a"; 12][..], &["b"]].concat())).unwrap();
        assert_eq!(named.len(), MAX_NAMED);
        assert!(named.contains(&11), "{named:?}");
    }
}
