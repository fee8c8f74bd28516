//! Server-Sent Events responses (H-4): a priming event (an id and an empty
//! data field) first, keep-alive comments while waiting, then the messages.
//!
//! Framed by hand rather than with axum's `Sse`, which drops an empty data
//! field and so cannot write the priming event the spec asks for.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::mpsc;

use super::reply::StreamItem;

/// Whether the request's Accept header takes `media` (or anything).
pub(super) fn accepts(headers: &HeaderMap, media: &str) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    accept.split(',').any(|part| {
        let m = part.split(';').next().unwrap_or("").trim();
        m.eq_ignore_ascii_case(media) || m == "*/*"
    })
}

/// Event ids are `<stream>-<n>`, with a random stream id per response.
fn stream_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The priming event (H-4): an id, `retry`, and an empty data field.
pub(super) fn priming_event(id: &str, retry_ms: u64) -> Bytes {
    Bytes::from(format!("id: {id}\nretry: {retry_ms}\ndata: \n\n"))
}

/// One JSON-RPC message as an SSE event with `id`.
pub(super) fn message_event(id: &str, message: &Value) -> Bytes {
    // serde_json never emits a raw newline, so one data line suffices.
    Bytes::from(format!("id: {id}\nevent: message\ndata: {message}\n\n"))
}

/// Numbers the messages of one stream: `<random stream id>-<n>`.
pub(super) struct Numbered {
    stream: String,
    n: u64,
}

impl Numbered {
    /// A fresh stream id, counting from 1.
    pub(super) fn new() -> Self {
        Self {
            stream: stream_id(),
            n: 0,
        }
    }
    /// The next message as an SSE event.
    pub(super) fn event(&mut self, message: &Value) -> Bytes {
        self.n += 1;
        message_event(&format!("{}-{}", self.stream, self.n), message)
    }
}

/// A comment that keeps an idle connection open.
pub(super) const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

fn priming(stream: &str) -> Bytes {
    priming_event(&format!("{stream}-0"), RETRY_MS)
}

/// `retry` (ms) announced by non-resumable request streams.
const RETRY_MS: u64 = 1000;

fn message(stream: &str, n: u64, message: &Value) -> Bytes {
    message_event(&format!("{stream}-{n}"), message)
}

/// An SSE response with `stream` as its body.
pub(super) fn sse_response(
    stream: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Stream `notifications` as they come, then the message `last` resolves
/// to, with a keep-alive comment every `keep_alive` of silence.
pub fn respond(
    keep_alive: Duration,
    notifications: Option<mpsc::UnboundedReceiver<StreamItem>>,
    last: impl Future<Output = Value> + Send + 'static,
) -> Response {
    let stream = async_stream::stream! {
        let id = stream_id();
        yield Ok::<_, Infallible>(priming(&id));
        let mut n = 0u64;
        let mut notifications = notifications;
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
        tokio::pin!(last);
        loop {
            enum Next { Note(Value), Last(Value), Tick, Closed }
            let next = tokio::select! {
                biased;
                note = async { match notifications.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                } } => match note {
                    Some(StreamItem::Message(v)) => Next::Note(v),
                    // This stream is not resumable: it is not closed early.
                    Some(StreamItem::Close) => continue,
                    None => Next::Closed,
                },
                value = &mut last => Next::Last(value),
                _ = ticker.tick() => Next::Tick,
            };
            match next {
                Next::Note(note) => { n += 1; yield Ok(message(&id, n, &note)); }
                Next::Closed => notifications = None,
                Next::Tick => yield Ok(Bytes::from_static(KEEP_ALIVE)),
                Next::Last(value) => {
                    // Progress sent before the result goes out first.
                    if let Some(rx) = notifications.as_mut() {
                        while let Ok(item) = rx.try_recv() {
                            if let StreamItem::Message(note) = item {
                                n += 1;
                                yield Ok(message(&id, n, &note));
                            }
                        }
                    }
                    n += 1;
                    yield Ok(message(&id, n, &value));
                    break;
                }
            }
        }
    };
    sse_response(stream)
}

/// The feed position of a message on a session's GET stream that is not a
/// status change ([`session_stream`] numbers it with the last position).
pub const UNPOSITIONED: i64 = -1;

/// A session's GET stream: the priming event (id `g-<from>`, with `retry`),
/// the `replay`ed messages, then `live` ones newer than those, each with id
/// `g-<feed position>` ([`UNPOSITIONED`] ones with the last), and
/// keep-alives in between.
pub fn session_stream(
    keep_alive: Duration,
    retry_ms: u64,
    from: i64,
    replay: Vec<(i64, Value)>,
    mut live: mpsc::UnboundedReceiver<(i64, Value)>,
) -> Response {
    let stream = async_stream::stream! {
        yield Ok::<_, Infallible>(priming_event(&format!("g-{from}"), retry_ms));
        let mut last = from;
        for (id, m) in replay {
            last = last.max(id);
            yield Ok(message_event(&format!("g-{id}"), &m));
        }
        loop {
            tokio::select! {
                next = live.recv() => match next {
                    // Not a status change (tools/list_changed): no feed
                    // position of its own; a resume goes on from `last`.
                    Some((UNPOSITIONED, m)) => {
                        yield Ok(message_event(&format!("g-{last}"), &m));
                    }
                    // Already replayed (the live feed was attached first).
                    Some((id, _)) if id <= last => {}
                    Some((id, m)) => {
                        last = id;
                        yield Ok(message_event(&format!("g-{id}"), &m));
                    }
                    None => break,
                },
                _ = tokio::time::sleep(keep_alive) => yield Ok(Bytes::from_static(KEEP_ALIVE)),
            }
        }
    };
    sse_response(stream)
}
