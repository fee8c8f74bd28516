//! Execution slots of one worker pool: a cap per process (`--workers`,
//! `--concurrency`) and, for tools that set one, a cap per tool
//! (`concurrency`). A running job holds one process slot and, if its tool
//! is capped, one of its tool's slots; a job waiting for its client's input
//! holds none. A tool's limit across every process (`global_concurrency`)
//! is not counted here but in the claim itself, in the database.
//!
//! Claims reserve first, then claim: a [`Reservation`] holds the free slots
//! and says how many jobs of each tool a claim may take
//! ([`ToolQuota`]); each claimed job then takes its [`Slot`] out of it, and
//! what is not used goes back when the reservation is dropped. The slots
//! jobs hold are counted ([`Slots::held`]: a worker process reports them
//! in its heartbeat, and claim signals name it by its room, the cap less
//! them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::store::ToolQuota;
use crate::tools::ToolDefinition;

/// The limits of one tool in this pool.
#[derive(Debug)]
struct ToolLimit {
    /// Its per-process limit as defined (to tell a changed definition).
    concurrency: Option<usize>,
    /// Its own slots, when it has a per-process limit.
    local: Option<Arc<Semaphore>>,
    /// Its limit across every process.
    global: Option<i64>,
}

/// A pool's slots.
#[derive(Debug)]
pub struct Slots {
    /// Jobs this process runs at once, whatever their tools.
    process: Arc<Semaphore>,
    /// Every tool the pool serves (it claims no other); upstream servers'
    /// tools come and go while the pool runs ([`Slots::serve`]).
    tools: RwLock<HashMap<String, ToolLimit>>,
    /// Woken whenever a running job gives its slot back, so an idle pool
    /// that could not claim for lack of a tool's slot looks again.
    freed: Arc<Notify>,
    /// The process cap.
    cap: usize,
    /// The slots running jobs hold now.
    held: Arc<Held>,
}

/// How many slots running jobs hold (a job waiting for its client holds
/// none), and word when that reaches the cap or leaves it.
#[derive(Debug)]
struct Held {
    count: AtomicUsize,
    cap: usize,
    fullness: Notify,
}

impl Held {
    fn take(self: &Arc<Self>) -> Arc<Self> {
        if self.count.fetch_add(1, Ordering::Relaxed) + 1 == self.cap {
            self.fullness.notify_one();
        }
        self.clone()
    }

    fn give_back(&self) {
        if self.count.fetch_sub(1, Ordering::Relaxed) == self.cap {
            self.fullness.notify_one();
        }
    }
}

/// Slots held for a claim in flight.
#[derive(Debug)]
pub struct Reservation {
    process: Option<OwnedSemaphorePermit>,
    tools: HashMap<String, OwnedSemaphorePermit>,
    quotas: Vec<ToolQuota>,
    /// Some served tool had no free slot.
    capped: bool,
    freed: Arc<Notify>,
    held: Arc<Held>,
}

/// The slot a running job holds; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    process: Option<OwnedSemaphorePermit>,
    tool: Option<OwnedSemaphorePermit>,
    freed: Arc<Notify>,
    held: Arc<Held>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The count first (it never exceeds the cap), then the permits,
        // then the word: whoever wakes finds them free.
        self.held.give_back();
        drop(self.tool.take());
        drop(self.process.take());
        self.freed.notify_one();
    }
}

fn permits(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Slots {
    /// Slots for a pool of `cap` jobs at once serving `tools`.
    pub fn new<'a>(cap: usize, tools: impl IntoIterator<Item = &'a ToolDefinition>) -> Self {
        let cap = cap.max(1);
        let slots = Self {
            process: Arc::new(Semaphore::new(cap)),
            tools: RwLock::new(HashMap::new()),
            freed: Arc::new(Notify::new()),
            cap,
            held: Arc::new(Held {
                count: AtomicUsize::new(0),
                cap,
                fullness: Notify::new(),
            }),
        };
        slots.serve(tools);
        slots
    }

    /// Serve exactly `tools` from now on: new tools get their slots, gone
    /// ones are no longer claimed, and a tool whose limits did not change
    /// keeps its slots (and the jobs holding them). Jobs of a tool whose
    /// per-process limit changed finish under the old one.
    pub fn serve<'a>(&self, tools: impl IntoIterator<Item = &'a ToolDefinition>) {
        let mut served = self.tools.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = HashMap::new();
        for def in tools {
            let global = def.global_concurrency.map(i64::from);
            let limit = match served.remove(&def.name) {
                Some(limit) if limit.concurrency == def.concurrency => {
                    ToolLimit { global, ..limit }
                }
                _ => ToolLimit {
                    concurrency: def.concurrency,
                    local: def
                        .concurrency
                        .filter(|n| *n < self.cap)
                        .map(|n| Arc::new(Semaphore::new(n.max(1)))),
                    global,
                },
            };
            next.insert(def.name.clone(), limit);
        }
        *served = next;
        // A new tool may have work queued already.
        self.freed.notify_one();
    }

    /// The names of the tools served, sorted.
    pub fn served(&self) -> Vec<String> {
        let tools = self.tools.read().unwrap_or_else(PoisonError::into_inner);
        let mut names: Vec<String> = tools.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// The process cap.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// How many slots running jobs hold now (a job waiting for its
    /// client's answer holds none).
    pub fn held(&self) -> usize {
        self.held.count.load(Ordering::Relaxed)
    }

    /// Resolves when the slots held reached the cap or left it since the
    /// last call (the pool filled up or has room again).
    pub async fn fullness_changed(&self) {
        self.held.fullness.notified().await;
    }

    /// Resolves when a running job has given its slot back since the last
    /// call.
    pub async fn freed(&self) {
        self.freed.notified().await;
    }

    /// Reserve what is free now for a claim of at most `max` jobs; `None`
    /// when no job of any tool could be taken.
    pub fn try_reserve(&self, max: usize) -> Option<Reservation> {
        let n = self.process.available_permits().min(max);
        if n == 0 {
            return None;
        }
        let process = self
            .process
            .clone()
            .try_acquire_many_owned(permits(n))
            .ok()?;
        self.reserve_tools(process)
    }

    /// Wait for a free process slot, then reserve what is free for a claim
    /// of at most `max` jobs. `None` when no tool has a free slot.
    pub async fn reserve(&self, max: usize) -> Option<Reservation> {
        let mut process = self.process.clone().acquire_owned().await.ok()?;
        let more = self.process.available_permits().min(max.saturating_sub(1));
        if more > 0
            && let Ok(extra) = self.process.clone().try_acquire_many_owned(permits(more))
        {
            process.merge(extra);
        }
        self.reserve_tools(process)
    }

    fn reserve_tools(&self, process: OwnedSemaphorePermit) -> Option<Reservation> {
        let n = process.num_permits();
        let mut held = HashMap::new();
        let tools = self.tools.read().unwrap_or_else(PoisonError::into_inner);
        let mut quotas = Vec::with_capacity(tools.len());
        for (name, limit) in tools.iter() {
            let free = match &limit.local {
                None => n,
                Some(sem) => {
                    let k = sem.available_permits().min(n);
                    match sem.clone().try_acquire_many_owned(permits(k)) {
                        Ok(p) if k > 0 => {
                            held.insert(name.clone(), p);
                            k
                        }
                        _ => 0,
                    }
                }
            };
            if free > 0 {
                quotas.push(ToolQuota {
                    tool: name.clone(),
                    free: i64::try_from(free).unwrap_or(i64::MAX),
                    global: limit.global,
                });
            }
        }
        let reservation = Reservation {
            process: Some(process),
            tools: held,
            capped: quotas.len() < tools.len(),
            quotas,
            freed: self.freed.clone(),
            held: self.held.clone(),
        };
        (!reservation.quotas.is_empty()).then_some(reservation)
    }

    /// Wait for a slot for one job of `tool` (its tool's slot first, the
    /// scarcer one, then the process's).
    pub async fn acquire(&self, tool: &str) -> Option<Slot> {
        let local = self
            .tools
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(tool)
            .and_then(|l| l.local.clone());
        let tool_permit = match local {
            Some(sem) => Some(sem.acquire_owned().await.ok()?),
            None => None,
        };
        let process = self.process.clone().acquire_owned().await.ok()?;
        Some(Slot {
            process: Some(process),
            tool: tool_permit,
            freed: self.freed.clone(),
            held: self.held.take(),
        })
    }
}

impl Reservation {
    /// How many jobs of each tool the claim may take.
    pub fn quotas(&self) -> &[ToolQuota] {
        &self.quotas
    }

    /// Whether some tool the pool serves had no free slot (so a slot coming
    /// back is worth another claim).
    pub fn capped(&self) -> bool {
        self.capped
    }

    /// How many jobs the claim may take in all.
    pub fn len(&self) -> usize {
        self.process.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot of one claimed job of `tool`, out of the reservation;
    /// `None` if the claim took more than it reserved (it never should).
    pub fn take(&mut self, tool: &str) -> Option<Slot> {
        let tool_permit = match self.tools.get_mut(tool) {
            Some(permit) => Some(permit.split(1)?),
            None => None,
        };
        let process = self.process.as_mut()?.split(1)?;
        Some(Slot {
            process: Some(process),
            tool: tool_permit,
            freed: self.freed.clone(),
            held: self.held.take(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_held_count_running_jobs_and_say_when_full_or_not() {
        let slots = Slots::new(2, &[]);
        assert_eq!(slots.held(), 0);
        let one = slots.acquire("any").await.unwrap();
        assert_eq!(slots.held(), 1);
        let two = slots.acquire("any").await.unwrap();
        assert_eq!(slots.held(), 2);
        // Reached the cap: word.
        tokio::time::timeout(std::time::Duration::from_secs(5), slots.fullness_changed())
            .await
            .expect("full");
        drop(one);
        assert_eq!(slots.held(), 1);
        // Left the cap: word again.
        tokio::time::timeout(std::time::Duration::from_secs(5), slots.fullness_changed())
            .await
            .expect("room again");
        drop(two);
        assert_eq!(slots.held(), 0);
    }
    use crate::tools::TaskSupport;
    use serde_json::json;

    fn def(name: &str, concurrency: Option<usize>) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            output_schema: None,
            task_support: TaskSupport::Optional,
            max_attempts: 1,
            concurrency,
            global_concurrency: None,
            queue: Default::default(),
            retention: Default::default(),
            extra: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_capped_tool_gets_its_own_quota_and_slots_come_back() {
        let defs = [def("build", Some(2)), def("echo", None)];
        let slots = Slots::new(10, &defs);
        let mut r = slots.try_reserve(10).unwrap();
        let quota = |r: &Reservation, tool: &str| {
            r.quotas().iter().find(|q| q.tool == tool).map(|q| q.free)
        };
        assert_eq!(r.len(), 10);
        assert_eq!(quota(&r, "build"), Some(2));
        assert_eq!(quota(&r, "echo"), Some(10));
        let a = r.take("build").unwrap();
        let b = r.take("build").unwrap();
        assert!(r.take("build").is_none(), "never more than reserved");
        drop(r);
        let r = slots.try_reserve(10).unwrap();
        assert_eq!(r.len(), 8);
        assert_eq!(quota(&r, "build"), None, "both build slots are taken");
        drop(r);
        drop(a);
        let r = slots.try_reserve(10).unwrap();
        assert_eq!(quota(&r, "build"), Some(1));
        drop((b, r));
        let held = slots.acquire("build").await.unwrap();
        let _second = slots.acquire("build").await.unwrap();
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), slots.acquire("build"))
                .await
                .is_err(),
            "a third build waits for a slot"
        );
        drop(held);
        assert!(slots.acquire("build").await.is_some());
    }
}
