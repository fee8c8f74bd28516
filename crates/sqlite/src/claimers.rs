//! Which worker processes a queued job's wake-up names (issue 26): as
//! PostgreSQL's notification does (migration V15 there), a process that
//! queues jobs names as many live worker processes as jobs (at most
//! [`MAX_NAMED`]) in the queue's wake file; only they claim at once, the
//! others look a moment later if still idle. With no live worker process
//! known, the poke names no one and every claimer looks, as before.
//!
//! The live worker processes (kind `process`, state `live`, heartbeat
//! within half their lease) are read at most once per [`FRESH_FOR`], in
//! the background: a poke never waits for a read. Names are taken in turn
//! from that list, so consecutive pokes spread over every worker. A worker
//! that started since the last read is not named until the next one (it
//! hears the pokes for others and looks a moment later); one that stopped
//! since is named in vain (the others look a moment later).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::SqlitePool;
use taskbroker_storage::NAMED_CLAIMERS;

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
    ids: Vec<String>,
    read_at: Option<Instant>,
    reading: bool,
    next: usize,
}

impl Claimers {
    /// The payload of a poke for `jobs` queued jobs: `claim:` and the ids
    /// of the workers whose turn it is, or empty (everyone) when no live
    /// worker process is known. Starts a read of them in the background
    /// when the last one is stale.
    pub(crate) fn payload(self: &Arc<Self>, jobs: usize, read: &SqlitePool) -> String {
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
        let n = jobs.clamp(1, MAX_NAMED).min(known.ids.len());
        if n == 0 {
            return String::new();
        }
        let mut payload = String::from(NAMED_CLAIMERS);
        for i in 0..n {
            if i > 0 {
                payload.push(' ');
            }
            let at = (known.next + i) % known.ids.len();
            payload.push_str(&known.ids[at]);
        }
        known.next = (known.next + n) % known.ids.len();
        payload
    }

    async fn refresh(&self, read: &SqlitePool) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let ids = sqlx::query_scalar!(
            "SELECT worker_id FROM workers
              WHERE kind = 'process' AND state = 'live' AND heartbeat_at + lease_ms / 2 > ?
              ORDER BY worker_id",
            now
        )
        .fetch_all(read)
        .await;
        let Ok(mut known) = self.state.lock() else {
            return;
        };
        known.reading = false;
        match ids {
            Ok(ids) => {
                known.ids = ids;
                known.read_at = Some(Instant::now());
            }
            Err(e) => {
                // Named no one until a read succeeds: every claimer looks.
                tracing::debug!(error = %e, "live worker processes not read; queued jobs wake every claimer");
                known.ids.clear();
                known.read_at = Some(Instant::now());
            }
        }
    }
}
