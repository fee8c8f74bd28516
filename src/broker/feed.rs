//! The change feed: one tailer per process reads new `task_progress` and
//! `task_events` rows and broadcasts them, so waiters (tasks/result streams,
//! running jobs) never poll the database each.
//!
//! The tailer reads through the storage driver's [`ChangeFeed`]: it wakes
//! on a tick, when the driver says another process committed a change of
//! the feed's interest, or at once when this process kicks it after a write
//! of its own (unless the driver hears this process's commits as it hears
//! the others': then one wake per commit); and it reads rows only when the
//! feed's version says something committed.
//!
//! A server's feed follows every change (its clients may wait on any task),
//! though not every change wakes it at once (below). A worker process's
//! feed follows only cancellations and answers (what its running jobs wait
//! on): other processes' creations and completions do not wake it, it
//! catches up on a slow tick, and it reads only the cancels and answers
//! (not every task's changes and progress), so adding worker processes does
//! not add work to every task. Claimers are woken apart, only when a
//! job became claimable ([`Feed::queued`]); the signal names the worker
//! processes to claim at once (both drivers: those serving the jobs' tools,
//! by their room), and the others hear it as [`Feed::queued_for_others`]
//! and look a moment later.
//!
//! A server's tailer is woken at once only for the changes this process
//! acts on, where the driver's signals name the task (PostgreSQL): a task
//! watched here ([`Feed::watch_task`]: a waiting tasks/result, a
//! subscriptions/listen stream, a running job), an owner followed here
//! ([`Feed::follow_owner`]: a GET stream), or everything while something
//! follows every change ([`Feed::follow_everything`]: a console stream).
//! The others' status changes are read together about once a second, and
//! their progress only along with progress that concerns this process, so
//! that a broker's reads do not grow with the tasks other brokers serve.
//!
//! The feed also keeps, for a while, the rows of the tasks this process
//! created with a job due now ([`Feed::remember_created`], `created.rs`),
//! and counts them as watched (their changes by other processes are read at
//! once): until this process publishes a change of such a task, the row as
//! created (or as it ended) is the row as it is, and the first look of a
//! `tasks/result` takes it instead of reading the task again
//! ([`Feed::take_created`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::created::CreatedRows;
use crate::store::{
    ChangeFeed, ClaimerId, Concerned, FeedInterest, ProgressEvent, QueuedJobs, Signal, Store,
    StoreError, TaskEvent, TaskOutcome, TaskRow,
};

/// One change the feed reports.
#[derive(Debug, Clone)]
pub enum FeedEvent {
    /// A status transition (a `task_events` row).
    Status(TaskEvent),
    /// A progress report of a running task (a `task_progress` row).
    Progress(ProgressEvent),
    /// This process just committed a change of the task's status (say, its
    /// outcome): waiters in this process may look at once, before the
    /// tailer delivers the matching `Status`. With the outcome when it was
    /// the task's end and someone here waits for it: the waiter needs not
    /// read the task again.
    Written(Arc<str>, Option<Arc<Ended>>),
}

/// A task's end as this process committed it.
#[derive(Debug)]
pub struct Ended {
    /// What was recorded.
    pub outcome: TaskOutcome,
    /// When (the task's lastUpdatedAt), ms.
    pub at: i64,
}

impl FeedEvent {
    /// The task it concerns.
    pub fn task_id(&self) -> &str {
        match self {
            Self::Status(e) => &e.task_id,
            Self::Progress(p) => &p.task_id,
            Self::Written(task_id, _) => task_id,
        }
    }
}

/// Rows read per query while catching up.
const BATCH: i64 = 1000;
/// Quiet ticks before the tailer looks at its slowest (every 10 quiet ticks
/// add one tick to the wait, up to 5 ticks).
const IDLE_STEPS: u32 = 40;

/// Who watches one task's events: (watch id, where they go).
type TaskWatchers = HashMap<Arc<str>, Vec<(u64, mpsc::UnboundedSender<Arc<FeedEvent>>)>>;

/// What follows more than single tasks: owners (how many follow each) and
/// followers of every change.
#[derive(Debug, Default)]
struct Followers {
    owners: Mutex<HashMap<String, usize>>,
    everything: AtomicUsize,
}

impl Followers {
    fn lock_owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn follow(&self, owner: &str) -> bool {
        self.everything.load(Ordering::Acquire) > 0 || self.lock_owners().contains_key(owner)
    }
}

/// Keeps an owner, or every change, followed until dropped (see
/// [`Feed::follow_owner`], [`Feed::follow_everything`]).
#[derive(Debug)]
pub struct Following {
    followers: Arc<Followers>,
    /// None: every change.
    owner: Option<String>,
}

impl Drop for Following {
    fn drop(&mut self) {
        match &self.owner {
            None => {
                self.followers.everything.fetch_sub(1, Ordering::AcqRel);
            }
            Some(owner) => {
                let mut owners = self.followers.lock_owners();
                if let Some(n) = owners.get_mut(owner) {
                    *n -= 1;
                    if *n == 0 {
                        owners.remove(owner);
                    }
                }
            }
        }
    }
}

/// Handle to the feed: subscribe to all events or to one task's, or kick
/// the tailer.
#[derive(Debug, Clone)]
pub struct Feed {
    events: broadcast::Sender<Arc<FeedEvent>>,
    /// One task's events go only to its watchers (waiting tasks/result
    /// calls, running jobs): an event wakes those, not every waiter.
    watchers: Arc<Mutex<TaskWatchers>>,
    next_watch: Arc<AtomicU64>,
    /// Tasks created here with a job due now, as created (or as they
    /// ended), while no other change of them was published (see
    /// [`Feed::remember_created`]).
    created: Arc<Mutex<CreatedRows>>,
    /// Owners and streams that follow more than single tasks.
    followers: Arc<Followers>,
    kick: Arc<Notify>,
    /// A kick came after a commit that may have written progress: the
    /// tailer reads progress whatever the store says.
    progress_kicked: Arc<AtomicBool>,
    /// Told after this process commits, to tell the other processes.
    store: Arc<OnceLock<Store>>,
    /// What wakes the tailer (set when it starts).
    interest: Arc<OnceLock<FeedInterest>>,
    /// The driver does not hear this process's own commits, so kicks wake
    /// the tailer (set when it starts).
    kicks_wake: Arc<OnceLock<bool>>,
    /// Counts the signals heard that a job became claimable (any process:
    /// a new task, or one given back or rescued) and that ask this process
    /// to claim (they name no claimer, or name this one).
    queued: watch::Sender<u64>,
    /// Counts those that named other worker processes to claim at once.
    queued_for_others: watch::Sender<u64>,
    /// Where the driver reads this process's worker id (set when the
    /// tailer starts, where signals name claimers).
    claimer: Arc<OnceLock<ClaimerId>>,
}

impl Feed {
    /// A feed with no tailer yet (see [`Feed::spawn_tailer`]).
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        Self {
            events,
            watchers: Arc::default(),
            next_watch: Arc::default(),
            created: Arc::default(),
            followers: Arc::default(),
            kick: Arc::new(Notify::new()),
            progress_kicked: Arc::default(),
            store: Arc::new(OnceLock::new()),
            interest: Arc::new(OnceLock::new()),
            kicks_wake: Arc::new(OnceLock::new()),
            queued: watch::Sender::new(0),
            queued_for_others: watch::Sender::new(0),
            claimer: Arc::new(OnceLock::new()),
        }
    }

    /// Receive every event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<FeedEvent>> {
        self.events.subscribe()
    }

    /// Receive the events of `task_id` from now on, until the watch drops.
    pub fn watch_task(&self, task_id: &str) -> TaskWatch {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.next_watch.fetch_add(1, Ordering::Relaxed);
        let task_id: Arc<str> = Arc::from(task_id);
        self.lock_watchers()
            .entry(task_id.clone())
            .or_default()
            .push((id, tx));
        TaskWatch {
            rx,
            id,
            task_id,
            watchers: self.watchers.clone(),
        }
    }

    fn lock_watchers(&self) -> std::sync::MutexGuard<'_, TaskWatchers> {
        lock(&self.watchers)
    }

    /// Follow the changes of every task of `owner` (a GET stream sends them
    /// all) until the guard drops. Take it before reading where the stream
    /// starts: a change committed before that is read there.
    pub fn follow_owner(&self, owner: &str) -> Following {
        *self
            .followers
            .lock_owners()
            .entry(owner.to_owned())
            .or_default() += 1;
        Following {
            followers: self.followers.clone(),
            owner: Some(owner.to_owned()),
        }
    }

    /// Follow every change (a console stream shows them all) until the
    /// guard drops.
    pub fn follow_everything(&self) -> Following {
        self.followers.everything.fetch_add(1, Ordering::AcqRel);
        Following {
            followers: self.followers.clone(),
            owner: None,
        }
    }

    /// Whether a change of `task_id` (of `owner`) concerns this process:
    /// the driver wakes the tailer at once only for those. A task created
    /// here whose row is kept does (its row must not outlive a change),
    /// but for the notice of its creation (the first: see
    /// `CreatedRows::concerns_notice`), which changes nothing kept.
    pub(super) fn concerned(&self) -> Concerned {
        let watchers = self.watchers.clone();
        let followers = self.followers.clone();
        let created = self.created.clone();
        Arc::new(move |task_id: &str, owner: &str| {
            // First, so that the creation's notice is always the one taken.
            let kept = lock(&created).concerns_notice(task_id);
            kept || followers.follow(owner) || lock(&watchers).contains_key(task_id)
        })
    }

    /// `task_id` is about to be created with a job due now: a change of it
    /// published from now on means its row is not to be kept
    /// ([`Feed::remember_created`]).
    pub fn expect_created(&self, task_id: &str) {
        lock(&self.created).expect(task_id);
    }

    /// Keep `row`, a task just created with a job due now, for the first
    /// look of a `tasks/result`
    /// ([`Feed::take_created`]), unless a change of it was published since
    /// [`Feed::expect_created`]. Call it before the creator hears of the
    /// task. Its job may have started already (another process may claim
    /// it the moment it commits): a change published since the expectation
    /// forbids the keeping, so a row kept is never older than a change.
    pub fn remember_created(&self, row: &TaskRow) {
        lock(&self.created).keep(row);
    }

    /// Forget a task expected (its creation failed).
    pub fn forget_created(&self, task_id: &str) {
        lock(&self.created).forget(task_id);
    }

    /// The row of `task_id` as this process created it (without the
    /// call's arguments), if kept and no change of the task has been
    /// published since but its end (then the ended row); taken (a later
    /// look reads the task). Watch the task first ([`Feed::watch_task`]): a
    /// change published after this look then reaches the watch. A change
    /// committed by another process reaches it when this process's feed
    /// reads it: at once, since a kept task counts as watched where the
    /// driver's signals name the task (PostgreSQL), or, should the notice
    /// be lost (the listener reconnecting), with the feed's catch-up read
    /// within a second.
    pub fn take_created(&self, task_id: &str) -> Option<TaskRow> {
        lock(&self.created).take(task_id)
    }

    /// Send `event` to every subscriber and to its task's watchers. A
    /// change of a task (anything but its creation and its progress)
    /// updates or forgets its created row first.
    fn publish(&self, event: FeedEvent) {
        match &event {
            // Its end with what was recorded (read, perhaps before this
            // process's own word of it).
            FeedEvent::Status(TaskEvent {
                task_id,
                outcome: Some(outcome),
                at,
                ..
            }) => lock(&self.created).ended(task_id, outcome, *at),
            FeedEvent::Status(e) if e.from_status.is_some() => {
                lock(&self.created).changed(&e.task_id);
            }
            FeedEvent::Written(task_id, Some(ended)) => {
                lock(&self.created).ended(task_id, &ended.outcome, ended.at);
            }
            FeedEvent::Written(task_id, None) => lock(&self.created).changed(task_id),
            FeedEvent::Status(_) | FeedEvent::Progress(_) => {}
        }
        let event = Arc::new(event);
        if let Some(watchers) = self.lock_watchers().get(event.task_id()) {
            for (_, tx) in watchers {
                let _ = tx.send(event.clone());
            }
        }
        // No receivers is fine: nobody waits.
        let _ = self.events.send(event);
    }

    /// Watch for jobs becoming claimable (any process): `changed()`
    /// resolves once a signal came after the receiver last looked.
    pub fn queued(&self) -> watch::Receiver<u64> {
        self.queued.subscribe()
    }

    /// Watch for jobs queued that a signal asked other worker processes to
    /// claim at once (see [`ChangeFeed::queued_for_others`]).
    pub fn queued_for_others(&self) -> watch::Receiver<u64> {
        self.queued_for_others.subscribe()
    }

    /// This process claims as the worker `worker_id`: signals naming other
    /// claimers no longer count as [`Feed::queued`]. Once per process (the
    /// first pool's id stays).
    pub fn claim_as(&self, worker_id: &str) {
        if let Some(cell) = self.claimer.get() {
            let _ = cell.set(worker_id.to_owned());
        }
    }

    /// Tell the tailer this process just committed a change, progress
    /// maybe (a server's tailer reads it at once for its waiters), and the
    /// processes that follow every change.
    pub fn kick(&self) {
        if self.kicks_wake() {
            self.progress_kicked.store(true, Ordering::Release);
        }
        self.kick_statuses();
    }

    /// Whether a kick wakes the tailer: not on a feed that follows only
    /// cancels and answers, nor where the driver hears this process's
    /// commits itself (the kick would read the same commit again).
    fn kicks_wake(&self) -> bool {
        self.interest.get() != Some(&FeedInterest::Control)
            && self.kicks_wake.get().copied().unwrap_or(true)
    }

    /// [`Feed::kick`] after a commit that wrote no progress (statuses,
    /// jobs): the tailer reads progress only if the store says some came.
    pub fn kick_statuses(&self) {
        if self.kicks_wake() {
            self.kick.notify_one();
        }
        self.announce(Signal::Changed);
    }

    /// [`Feed::kick`] after a commit that cancelled a task or answered its
    /// request: the processes running tasks hear of it too.
    pub fn kick_control(&self) {
        self.kick();
        self.announce(Signal::Control);
    }

    /// Tell the claimers of every process that this one just made `jobs`
    /// claimable (this process's own pool is woken apart); where the
    /// driver can, the signal names as many worker processes serving their
    /// tools.
    pub fn announce_queued(&self, jobs: &QueuedJobs) {
        if let Some(store) = self.store.get() {
            store.announce_queued(jobs);
        }
    }

    /// Tell the claimers of every process that a slot of a tool limited
    /// across processes came back here.
    pub fn announce_slot_freed(&self) {
        self.announce(Signal::SlotFreed);
    }

    /// Tell the claimers of every process that a job queued here to start
    /// later is due.
    pub fn announce_due(&self) {
        self.announce(Signal::Due);
    }

    fn announce(&self, signal: Signal) {
        if let Some(store) = self.store.get() {
            store.announce(signal);
        }
    }

    /// Tell this process's waiters that the status of `task_id` was just
    /// committed here (the caller kicks the tailer, once per commit).
    pub fn written(&self, task_id: &str) {
        self.publish(FeedEvent::Written(Arc::from(task_id), None));
    }

    /// [`Feed::written`] for the task's end: `outcome` (made only if a
    /// waiter here watches the task, or its created row is kept) goes with
    /// it.
    pub fn ended(&self, task_id: &str, outcome: impl FnOnce() -> TaskOutcome, at: i64) {
        let watched = self.lock_watchers().contains_key(task_id);
        let wanted = watched || lock(&self.created).has(task_id);
        let ended = wanted.then(|| {
            Arc::new(Ended {
                outcome: outcome(),
                at,
            })
        });
        self.publish(FeedEvent::Written(Arc::from(task_id), ended));
    }

    /// Start the tailer, woken by the commits of `interest` and every
    /// `tick`: it runs until `shutdown`. A feed of [`FeedInterest::Control`]
    /// reads at every tick (its catch-up) and ignores this process's kicks.
    pub async fn spawn_tailer(
        &self,
        store: Store,
        interest: FeedInterest,
        tick: Duration,
        shutdown: CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>, StoreError> {
        let mut changes: Box<dyn ChangeFeed> =
            store.change_feed(interest, shutdown.clone()).await?;
        let control_only = interest == FeedInterest::Control;
        if !control_only {
            changes.wake_only_for(self.concerned());
        }
        let remote = changes.remote();
        let mut version = changes.version().await?;
        let _ = self.store.set(store);
        let _ = self.interest.set(interest);
        let _ = self.kicks_wake.set(!changes.hears_own_commits());
        // Claim signals: counted for the pool.
        if let Some(cell) = changes.claimer() {
            let _ = self.claimer.set(cell);
        }
        let queued = changes.queued();
        // Never notified where signals name no one.
        let for_others = changes.queued_for_others().unwrap_or_default();
        let counter = self.queued.clone();
        let others_counter = self.queued_for_others.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = queued.notified() => counter.send_modify(|n| *n += 1),
                    _ = for_others.notified() => others_counter.send_modify(|n| *n += 1),
                }
            }
        });
        let feed = self.clone();
        Ok(tokio::spawn(async move {
            let mut idle: u32 = 0;
            // A read failed: read again at the next tick even if nothing
            // new was committed (waiters do not poll).
            let mut behind = false;
            loop {
                let wait = if control_only {
                    tick
                } else {
                    tick * (1 + idle / 10)
                };
                let kicked = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = feed.kick.notified() => true,
                    _ = remote.notified() => false,
                    _ = tokio::time::sleep(wait) => control_only,
                };
                match changes.version().await {
                    Ok(v) if v == version && !kicked && !behind => {
                        // Nothing new: look less often, up to 5x the tick.
                        idle = (idle + 1).min(IDLE_STEPS);
                        continue;
                    }
                    Ok(v) => {
                        version = v;
                        idle = 0;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "change feed: version read failed");
                        continue;
                    }
                }
                let reread = std::mem::take(&mut behind);
                // Progress first: what a task reported before it ended is
                // delivered before its end. A control feed reads no
                // progress, and of the status changes only the cancels and
                // answers its running jobs wait on.
                // `|`, not `||`: the flag is taken and the store's progress
                // version noted even when another reason already says read.
                let progress = !control_only
                    && (feed.progress_kicked.swap(false, Ordering::AcqRel)
                        | changes.progress_may_have_changed()
                        | reread);
                if progress {
                    loop {
                        match changes.next_progress(BATCH).await {
                            Ok(rows) => {
                                let n = rows.len();
                                for row in rows {
                                    feed.publish(FeedEvent::Progress(row));
                                }
                                if (n as i64) < BATCH {
                                    break;
                                }
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "change feed: progress read failed");
                                behind = true;
                                break;
                            }
                        }
                    }
                }
                loop {
                    let read = if control_only {
                        changes.next_control_events(BATCH).await
                    } else {
                        changes.next_events(BATCH).await
                    };
                    match read {
                        Ok(rows) => {
                            let n = rows.len();
                            for row in rows {
                                feed.publish(FeedEvent::Status(row));
                            }
                            if (n as i64) < BATCH {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "change feed: read failed");
                            behind = true;
                            break;
                        }
                    }
                }
            }
        }))
    }
}

/// The events of one task (see [`Feed::watch_task`]).
#[derive(Debug)]
pub struct TaskWatch {
    rx: mpsc::UnboundedReceiver<Arc<FeedEvent>>,
    id: u64,
    task_id: Arc<str>,
    watchers: Arc<Mutex<TaskWatchers>>,
}

impl TaskWatch {
    /// The next event of the task.
    pub async fn recv(&mut self) -> Option<Arc<FeedEvent>> {
        self.rx.recv().await
    }
}

impl Drop for TaskWatch {
    fn drop(&mut self) {
        let mut watchers = lock(&self.watchers);
        if let Some(list) = watchers.get_mut(&self.task_id) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                watchers.remove(&self.task_id);
            }
        }
    }
}

impl Default for Feed {
    fn default() -> Self {
        Self::new()
    }
}

/// The feed's shared maps, even after a panic elsewhere held the lock.
fn lock<T>(map: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    map.lock().unwrap_or_else(|p| p.into_inner())
}
