//! `GET /ui/api/events`: the change feed as server-sent events, for the
//! console's live pages. One subscription to the process's feed (which
//! reads the database once for every listener): status changes of every
//! owner's tasks as `status`, progress reports as `progress`, and `lag`
//! when this listener fell behind (the page then reads afresh). Each
//! stream takes one place among the server's SSE streams.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use super::Console;
use super::access;
use super::pages::secure;
use crate::broker::FeedEvent;
use crate::server::hold_while_streaming;
use crate::store::TaskStatus;

/// The stream, for operators.
pub async fn stream(State(console): State<Console>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(denied) = access::check(&console, &headers, &uri).await {
        return secure(
            (
                denied.status,
                axum::Json(json!({ "error": denied.message })),
            )
                .into_response(),
        );
    }
    let app = &console.app;
    let Some(slot) = app.open_streams.acquire() else {
        return secure(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(json!({ "error": format!(
                    "Service Unavailable: {} SSE streams are open, the maximum (--max-sse-streams)",
                    app.open_streams.max()
                )})),
            )
                .into_response(),
        );
    };
    let mut feed = app.broker.feed().subscribe();
    let stopping = console.stopping.clone();
    let events = async_stream::stream! {
        loop {
            let next = tokio::select! {
                next = feed.recv() => next,
                () = stopping.cancelled() => break,
            };
            match next {
                Ok(event) => {
                    if let Some(e) = to_event(&event) {
                        yield Ok::<Event, Infallible>(e);
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    yield Ok(Event::default().event("lag").data(missed.to_string()));
                }
                Err(RecvError::Closed) => break,
            }
        }
    };
    let response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(app.config.keep_alive))
        .into_response();
    hold_while_streaming(secure(response), slot)
}

/// The SSE event of one feed event; None for this process's own "written"
/// hints (the matching status change follows).
fn to_event(event: &FeedEvent) -> Option<Event> {
    match event {
        FeedEvent::Status(e) => Some(
            Event::default().event("status").data(
                json!({
                    "taskId": e.task_id,
                    "from": e.from_status.map(TaskStatus::as_str),
                    "to": e.to_status.as_str(),
                    "message": e.message,
                    "at": e.at,
                    "owner": e.owner,
                })
                .to_string(),
            ),
        ),
        FeedEvent::Progress(p) => Some(
            Event::default().event("progress").data(
                json!({
                    "taskId": p.task_id,
                    "progress": p.progress,
                    "total": p.total,
                    "message": p.message,
                })
                .to_string(),
            ),
        ),
        FeedEvent::Written(_) => None,
    }
}
