//! Background services of a broker process: the ttl purger (T-33, T-34,
//! and the retention rules of issue 27),
//! the rescuer of jobs whose worker lease expired, the forgetting of gone
//! workers and of signing keys no state may use, and (in servers) the
//! sweeper of idle sessions.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Broker;
use crate::clock::now_ms;
use crate::defaults;
use crate::store::{PurgeReport, QueuedJobs, RescueReport, Store, StoreError};

/// Timing of the maintenance services.
#[derive(Debug, Clone, Copy)]
pub struct MaintenanceConfig {
    /// How often tasks past their ttl are purged.
    pub purge_every: Duration,
    /// Rows deleted per purge transaction (keeps write locks short).
    pub purge_batch: i64,
    /// How often expired leases are looked for.
    pub rescue_every: Duration,
    /// Delay before a rescued job runs again, times its attempt number.
    pub retry_backoff: Duration,
    /// Sessions idle this long that own no unexpired task are ended and
    /// deleted on each purge tick; `None` (worker processes) sweeps none.
    pub session_idle: Option<Duration>,
}

impl MaintenanceConfig {
    /// Defaults for a lease of `lease`: rescue checks four times per lease.
    pub fn for_lease(lease: Duration, session_idle: Option<Duration>) -> Self {
        Self {
            session_idle,
            purge_every: Duration::from_secs(5),
            purge_batch: defaults::PURGE_BATCH,
            rescue_every: (lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(5)),
            retry_backoff: Duration::from_millis(500),
        }
    }
}

/// Run the purger and the rescuer until `shutdown`.
pub async fn run(broker: Broker, config: MaintenanceConfig, shutdown: CancellationToken) {
    let mut purge = tokio::time::interval(config.purge_every);
    let mut rescue = tokio::time::interval(config.rescue_every);
    let mut dead = tokio::time::interval(config.rescue_every * 4);
    purge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rescue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let backoff_ms = i64::try_from(config.retry_backoff.as_millis()).unwrap_or(i64::MAX);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = purge.tick() => {
                purge_expired(&broker, config.purge_batch).await;
                if let Some(idle) = config.session_idle {
                    sweep_sessions(&broker, idle, config.purge_batch).await;
                }
            }
            _ = rescue.tick() => match broker.store().job_rescue_expired(backoff_ms, now_ms()).await {
                Ok(report) if report != RescueReport::default() => {
                    let metrics = crate::metrics::get();
                    metrics.leases_expired(report.requeued, report.failed.len() as u64, report.closed);
                    for tool in &report.failed {
                        metrics.task_finished(tool, "failed");
                    }
                    tracing::warn!(requeued = report.requeued, failed = report.failed.len(),
                                   closed = report.closed, "lease recovery: expired leases taken back");
                    broker.feed().kick_statuses();
                    if report.requeued > 0 {
                        broker.job_queued().notify_one();
                        broker.feed().announce_queued(&QueuedJobs::untold(usize::try_from(report.requeued).unwrap_or(usize::MAX)));
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "lease recovery failed"),
            },
            _ = dead.tick() => {
                match broker.store().worker_mark_dead(now_ms()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(workers = n, "workers stopped heartbeating: marked dead"),
                    Err(e) => tracing::warn!(error = %e, "marking dead workers failed"),
                }
                let before = now_ms().saturating_sub(defaults::WORKER_RETENTION.as_millis() as i64);
                match broker.store().worker_purge_gone(before).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(workers = n, "forgot worker pools gone for a week"),
                    Err(e) => tracing::warn!(error = %e, "purging gone workers failed"),
                }
                if let Err(e) = broker.signing_keys().purge(now_ms()).await {
                    tracing::warn!(error = %e, "purging old request-state keys failed");
                }
            }
        }
    }
}

/// End idle sessions that own no unexpired task, and delete ended ones.
async fn sweep_sessions(broker: &Broker, idle: Duration, batch: i64) {
    let idle_ms = super::SessionExpiry::new(idle).idle_ms();
    match broker
        .store()
        .session_expire_idle(idle_ms, now_ms(), batch)
        .await
    {
        Ok((0, 0)) => {}
        Ok((ended, deleted)) => {
            tracing::info!(
                ended,
                deleted,
                "idle sessions expired, ended sessions purged"
            )
        }
        Err(e) => tracing::warn!(error = %e, "session sweep failed"),
    }
}

/// Progress rows are kept this long for waiters to read.
const KEEP_PROGRESS_MS: i64 = 10 * 60 * 1000;

async fn purge_expired(broker: &Broker, batch: i64) {
    if let Err(e) = broker
        .store()
        .task_progress_prune(now_ms() - KEEP_PROGRESS_MS)
        .await
    {
        tracing::warn!(error = %e, "progress prune failed");
    }
    let purged = purge_until_done(broker.store(), batch, |report| {
        crate::metrics::get().tasks_expired(report);
        if report.total() > 0 {
            tracing::info!(
                deleted = report.deleted,
                archived = report.archived,
                kept = report.kept,
                "expired tasks purged (deleted, archived, or kept by a retention rule)"
            );
        }
    })
    .await;
    if let Err(e) = purged {
        tracing::warn!(error = %e, "ttl purge failed");
    }
}

/// Purge passes of up to `batch` tasks each (see
/// [`TaskStore::task_purge`](crate::store::TaskStore::task_purge)) until one
/// is not full, calling `each` with every pass's report; the sum.
pub async fn purge_until_done(
    store: &Store,
    batch: i64,
    mut each: impl FnMut(&PurgeReport),
) -> Result<PurgeReport, StoreError> {
    let mut total = PurgeReport::default();
    loop {
        let report = store.task_purge(now_ms(), batch).await?;
        each(&report);
        total += report;
        // Each half of a pass reads at most `batch` rows: another pass
        // only when one was full.
        if report.total() < u64::try_from(batch).unwrap_or(0) {
            return Ok(total);
        }
    }
}
