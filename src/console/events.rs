//! `GET /ui/api/events`: the change feed as server-sent events, for the
//! console's live pages. One subscription to the process's feed (which
//! reads the database once for every listener), sent in batches: at most
//! one `changes` event per [`WINDOW`], with the status changes of every
//! owner's tasks (the newest [`CAP`]) and the latest progress of each task
//! that reported (at most [`CAP`] tasks), and how many were left out
//! (`dropped`; the page then reads afresh). A busy broker changes thousands
//! of tasks a second: one write per change would cost it more than the
//! pages need. Each stream takes one place among the server's SSE streams.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::Console;
use super::access;
use super::api::error;
use super::pages::secure;
use crate::broker::FeedEvent;
use crate::server::hold_while_streaming;
use crate::store::TaskStatus;

/// The stream, for operators.
pub async fn stream(State(console): State<Console>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(denied) = access::check(&console, &headers, &uri).await {
        return error(denied.status, &denied.message);
    }
    let app = &console.app;
    let Some(slot) = app.open_streams.acquire() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "Service Unavailable: {} SSE streams are open, the maximum (--max-sse-streams)",
                app.open_streams.max()
            ),
        );
    };
    let mut feed = app.broker.feed().subscribe();
    let following = app.broker.feed().follow_everything();
    let stopping = console.stopping.clone();
    let events = async_stream::stream! {
        let mut batch = Batch::default();
        let mut tick = tokio::time::interval(WINDOW);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                next = feed.recv() => match next {
                    Ok(event) => batch.add(&event),
                    Err(RecvError::Lagged(missed)) => batch.dropped += missed,
                    Err(RecvError::Closed) => break,
                },
                _ = tick.tick() => {
                    if let Some(data) = batch.take() {
                        yield Ok::<Event, Infallible>(Event::default().event("changes").data(data));
                    }
                }
                () = stopping.cancelled() => break,
            }
        }
    };
    let response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(app.config.keep_alive))
        .into_response();
    hold_while_streaming(secure(response), (slot, following))
}

/// How often a stream sends what changed, at most.
pub const WINDOW: Duration = Duration::from_millis(250);
/// Status changes, and tasks with progress, per batch at most.
pub const CAP: usize = 200;

/// What changed since the last `changes` event.
#[derive(Debug, Default)]
struct Batch {
    status: VecDeque<Value>,
    /// The latest report of each task, in the order they first reported.
    progress: Vec<Value>,
    /// Where each task's report is in `progress`.
    reported: HashMap<String, usize>,
    dropped: u64,
}

impl Batch {
    fn add(&mut self, event: &FeedEvent) {
        match event {
            FeedEvent::Status(e) => {
                if self.status.len() == CAP {
                    self.status.pop_front();
                    self.dropped += 1;
                }
                self.status.push_back(json!({
                    "taskId": e.task_id,
                    "from": e.from_status.map(TaskStatus::as_str),
                    "to": e.to_status.as_str(),
                    "message": e.message,
                    "at": e.at,
                    "owner": e.owner,
                }));
            }
            FeedEvent::Progress(p) => {
                let report = json!({
                    "taskId": p.task_id,
                    "progress": p.progress,
                    "total": p.total,
                    "message": p.message,
                });
                if let Some(slot) = self
                    .reported
                    .get(&p.task_id)
                    .and_then(|&at| self.progress.get_mut(at))
                {
                    *slot = report;
                } else if self.progress.len() < CAP {
                    self.reported.insert(p.task_id.clone(), self.progress.len());
                    self.progress.push(report);
                } else {
                    self.dropped += 1;
                }
            }
            // This process's own hint; the matching status change follows.
            FeedEvent::Written(..) => {}
        }
    }

    /// The event's data, and a fresh batch; None when nothing changed.
    fn take(&mut self) -> Option<String> {
        if self.status.is_empty() && self.progress.is_empty() && self.dropped == 0 {
            return None;
        }
        let batch = std::mem::take(self);
        Some(
            json!({
                "status": Vec::from(batch.status),
                "progress": batch.progress,
                "dropped": batch.dropped,
            })
            .to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ProgressEvent, TaskEvent};

    fn status(n: usize) -> FeedEvent {
        FeedEvent::Status(TaskEvent {
            outcome: None,
            id: n as i64,
            task_id: format!("t{n}"),
            from_status: None,
            to_status: TaskStatus::Working,
            owner: "o".into(),
            message: None,
            at: 0,
            created_at: 0,
            ttl_ms: None,
            poll_interval_ms: None,
            tool_error: false,
        })
    }

    #[test]
    fn a_batch_keeps_the_newest_changes_and_counts_the_rest() {
        let mut b = Batch::default();
        assert_eq!(b.take(), None);
        for n in 0..CAP + 5 {
            b.add(&status(n));
        }
        for p in [1.0, 2.0] {
            b.add(&FeedEvent::Progress(ProgressEvent {
                id: 1,
                task_id: "t1".into(),
                progress: p,
                total: None,
                message: None,
            }));
        }
        let data: Value = serde_json::from_str(&b.take().unwrap()).unwrap();
        let status = data["status"].as_array().unwrap();
        assert_eq!(status.len(), CAP);
        assert_eq!(status[0]["taskId"], "t5");
        assert_eq!(data["dropped"], 5);
        assert_eq!(
            data["progress"],
            json!([{"taskId": "t1", "progress": 2.0, "total": null, "message": null}])
        );
        assert_eq!(b.take(), None, "taken");
    }
}
