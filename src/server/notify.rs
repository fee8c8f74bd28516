//! notifications/tasks/status on the sessions' GET streams (T-31): one
//! notifier per process follows the change feed, whose rows carry the task
//! as it was after each change, so no query is made per notification.
//!
//! A GET stream's event ids are `g-<feed position>`: a client that
//! reconnects with `Last-Event-ID` gets the changes of its tasks after that
//! position, read from the database (so a restart loses none), then the
//! rest live. `notifications/tools/list_changed` goes to every GET stream
//! when the tools served change (upstream servers), and to every 2026
//! `subscriptions/listen` stream that asked for it
//! ([`SessionStreams::tools_served`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::dispatch::task_json;
use super::sse::UNPOSITIONED;
use crate::broker::{Broker, FeedEvent, task_at_event};
use crate::mcp;
use crate::tools::ToolCatalog;

/// One open GET stream: (feed position, notification) pairs go to it.
type Listener = mpsc::UnboundedSender<(i64, Value)>;

/// The open GET streams, by task owner.
///
/// A status change goes on exactly one stream (the transport forbids
/// broadcasting a message): the task's open tasks/result stream if there is
/// one, else the owner's GET streams.
#[derive(Debug, Default)]
pub struct SessionStreams {
    streams: Mutex<HashMap<String, Vec<Listener>>>,
    /// Tasks with a tasks/result stream open now, and how many.
    watched: Mutex<HashMap<String, usize>>,
    /// Status changes a tasks/result stream already delivered, though the
    /// feed has not brought them yet (the stream looked at the row as soon
    /// as this process wrote it): (task, status) -> when.
    delivered: Mutex<Delivered>,
    /// Counts the changes of the tools served that clients can see.
    tools_served: watch::Sender<u64>,
}

/// Status changes already delivered, and when they were last swept.
#[derive(Debug)]
struct Delivered {
    /// (task, status, its lastUpdatedAt) -> when the stream ended.
    entries: HashMap<(String, String, i64), Instant>,
    swept: Instant,
}

impl Default for Delivered {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            swept: Instant::now(),
        }
    }
}

/// How long a delivered status waits for its feed event (which normally
/// comes within milliseconds; when it came first, the entry is never used).
const DELIVERED_KEEP: Duration = Duration::from_secs(10);

/// Marks a task as watched by a tasks/result stream while it lives.
#[derive(Debug)]
pub struct Watch {
    streams: Arc<SessionStreams>,
    task_id: String,
    /// The status notifications that stream sent: (status, lastUpdatedAt).
    sent: Mutex<Vec<(String, i64)>>,
}

impl Watch {
    /// The stream sent a status notification of the task: `status` as of
    /// `updated_at` (one change: the feed event has the same time).
    pub fn sent_status(&self, status: &str, updated_at: i64) {
        self.sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((status.to_owned(), updated_at));
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut watched = self
            .streams
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = watched.get_mut(&self.task_id) {
            *n -= 1;
            if *n == 0 {
                watched.remove(&self.task_id);
            }
        }
        drop(watched);
        let sent = std::mem::take(&mut *self.sent.lock().unwrap_or_else(|p| p.into_inner()));
        if !sent.is_empty() {
            let mut delivered = self
                .streams
                .delivered
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            // Sweep at most once per DELIVERED_KEEP: O(1) per stream.
            if now.duration_since(delivered.swept) >= DELIVERED_KEEP {
                delivered
                    .entries
                    .retain(|_, at| now.duration_since(*at) < DELIVERED_KEEP);
                delivered.swept = now;
            }
            for (status, at) in sent {
                delivered
                    .entries
                    .insert((self.task_id.clone(), status, at), now);
            }
        }
    }
}

impl SessionStreams {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Listener>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new GET stream of `owner`: messages for it arrive on the receiver.
    pub fn attach(&self, owner: &str) -> mpsc::UnboundedReceiver<(i64, Value)> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().entry(owner.to_owned()).or_default().push(tx);
        rx
    }

    /// A tasks/result stream watches `task_id` until the guard drops: its
    /// status changes go there, not to the GET streams.
    pub fn watch(self: &Arc<Self>, task_id: &str) -> Watch {
        *self
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(task_id.to_owned())
            .or_default() += 1;
        Watch {
            streams: self.clone(),
            task_id: task_id.to_owned(),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// Whether a tasks/result stream has (or had, ahead of the feed) the
    /// change of `task_id` to `status` at `at`.
    fn is_watched(&self, task_id: &str, status: &str, at: i64) -> bool {
        if self
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(task_id)
        {
            return true;
        }
        let mut delivered = self.delivered.lock().unwrap_or_else(|p| p.into_inner());
        if delivered.entries.is_empty() {
            return false;
        }
        delivered
            .entries
            .remove(&(task_id.to_owned(), status.to_owned(), at))
            .is_some()
    }

    fn has(&self, owner: &str) -> bool {
        self.lock()
            .get(owner)
            .is_some_and(|v| v.iter().any(|tx| !tx.is_closed()))
    }

    /// Changes (a count) each time the tools served change in a way
    /// clients can see: `subscriptions/listen` streams that asked for
    /// `toolsListChanged` wait on it.
    pub fn tools_served(&self) -> watch::Receiver<u64> {
        self.tools_served.subscribe()
    }

    /// Send to every open GET stream, whoever owns it, forgetting closed
    /// ones (a message with no feed position: [`UNPOSITIONED`]).
    fn broadcast(&self, message: &Value) {
        self.lock().retain(|_, senders| {
            senders.retain(|tx| tx.send((UNPOSITIONED, message.clone())).is_ok());
            !senders.is_empty()
        });
    }

    /// Send to every open GET stream of `owner`, forgetting closed ones.
    fn send(&self, owner: &str, id: i64, message: &Value) {
        let mut map = self.lock();
        if let Some(senders) = map.get_mut(owner) {
            senders.retain(|tx| tx.send((id, message.clone())).is_ok());
            if senders.is_empty() {
                map.remove(owner);
            }
        }
    }
}

/// `notifications/tasks/status` with the full Task (T-31), without
/// related-task _meta (T-30).
pub fn status_notification(task: &crate::broker::Task) -> Value {
    mcp::notification("notifications/tasks/status", task_json(task))
}

/// The feed position in a GET stream's event id (`g-<n>`).
pub fn parse_get_event_id(id: &str) -> Option<i64> {
    id.strip_prefix("g-")?.parse().ok()
}

/// Follow the change feed until `shutdown`, sending each status change to
/// its owner's GET streams.
pub fn spawn_status_notifier(
    broker: Broker,
    streams: Arc<SessionStreams>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut feed = broker.feed().subscribe();
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = feed.recv() => event,
            };
            let event = match event {
                Ok(e) => e,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "status notifier lagged: some notifications not sent"
                    );
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let FeedEvent::Status(change) = event.as_ref() else {
                continue;
            };
            if streams.is_watched(&change.task_id, change.to_status.as_str(), change.at)
                || !streams.has(&change.owner)
            {
                continue;
            }
            streams.send(
                &change.owner,
                change.id,
                &status_notification(&task_at_event(change)),
            );
        }
    })
}

/// Tell every open GET stream (and listen stream that asked)
/// `notifications/tools/list_changed` when the
/// tools served change (an upstream server started, stopped serving one,
/// or said its list changed), until `shutdown`. Only a change clients can
/// see counts: the same list served again says nothing.
pub fn spawn_tools_notifier(
    catalog: Arc<ToolCatalog>,
    streams: Arc<SessionStreams>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut changed = catalog.changed();
    let listing = |catalog: &ToolCatalog| {
        let listed: Vec<Value> = catalog
            .current()
            .definitions()
            .map(|d| d.to_json())
            .collect();
        Value::Array(listed).to_string()
    };
    let mut served = listing(&catalog);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                next = changed.changed() => if next.is_err() { return },
            }
            let now = listing(&catalog);
            if now != served {
                served = now;
                tracing::debug!(
                    "tools changed: notifications/tools/list_changed to the open GET streams"
                );
                streams.broadcast(&mcp::notification(
                    "notifications/tools/list_changed",
                    json!({}),
                ));
                streams.tools_served.send_modify(|count| *count += 1);
            }
        }
    })
}
