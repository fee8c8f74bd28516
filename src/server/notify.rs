//! notifications/tasks/status on the sessions' GET streams (T-31): one
//! notifier per process follows the change feed and reads a changed task
//! once, only when its owner has a GET stream open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::dispatch::task_json;
use crate::broker::{Broker, FeedEvent};
use crate::mcp;

/// The open GET streams, by task owner.
#[derive(Debug, Default)]
pub struct SessionStreams {
    streams: Mutex<HashMap<String, Vec<mpsc::UnboundedSender<Value>>>>,
}

impl SessionStreams {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<mpsc::UnboundedSender<Value>>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new GET stream of `owner`: messages for it arrive on the receiver.
    pub fn attach(&self, owner: &str) -> mpsc::UnboundedReceiver<Value> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().entry(owner.to_owned()).or_default().push(tx);
        rx
    }

    fn has(&self, owner: &str) -> bool {
        self.lock()
            .get(owner)
            .is_some_and(|v| v.iter().any(|tx| !tx.is_closed()))
    }

    /// Send to every open GET stream of `owner`, forgetting closed ones.
    fn send(&self, owner: &str, message: &Value) {
        let mut map = self.lock();
        if let Some(senders) = map.get_mut(owner) {
            senders.retain(|tx| tx.send(message.clone()).is_ok());
            if senders.is_empty() {
                map.remove(owner);
            }
        }
    }
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
            if change.owner.is_empty() || !streams.has(&change.owner) {
                continue;
            }
            match broker.tasks_get(&change.owner, &change.task_id).await {
                Ok(task) => {
                    let note = mcp::notification("notifications/tasks/status", task_json(&task));
                    streams.send(&change.owner, &note);
                }
                Err(e) => {
                    tracing::debug!(task_id = %change.task_id, error = %e, "no status notification")
                }
            }
        }
    })
}
