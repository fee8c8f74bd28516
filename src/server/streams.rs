//! Resumable SSE streams (H-4).
//!
//! A request answered over SSE gets a stream: the work behind it runs on its
//! own and appends messages (notifications, requests to the client, and at
//! last the response) to the stream's buffer; HTTP connections read from the
//! buffer. A connection that drops, or that the server closes on purpose,
//! loses nothing: the client reconnects with GET and `Last-Event-ID`, and
//! gets exactly that stream's messages after the id, then the rest live.
//!
//! Event ids are `<stream>-<n>`: the stream id is random per stream, so ids
//! are unique per session and say which stream they belong to. Streams live
//! in memory; a finished stream is kept a while for late resumptions.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::response::Response;

use super::sse::{KEEP_ALIVE, message_event, priming_event, sse_response};
use serde_json::Value;
use tokio::sync::Notify;

/// How long a finished stream stays resumable: a client whose connection
/// dropped comes back within seconds (`retry` is 1 s). Every plain call
/// over SSE leaves one, so this bounds their memory: at 1,000 calls/s,
/// about 60,000 streams.
const KEEP_FINISHED: Duration = Duration::from_secs(60);
/// How often expired streams are swept (on the next open after this).
/// Sweeping on every open made each call scan every kept stream, so a
/// busy broker slowed down with its own history.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How long an unfinished stream nobody reads is kept.
const KEEP_IDLE: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
struct Buffer {
    /// Message n is `events[n - 1]`.
    events: Vec<Value>,
    /// The last message (the response) is in `events`.
    finished_at: Option<Instant>,
    /// Bumped to end the connections attached now.
    close_epoch: u64,
    /// Last time anything happened.
    touched: Option<Instant>,
}

/// One stream: its owner session and its buffer.
#[derive(Debug)]
pub struct Stream {
    /// Random id, the prefix of every event id.
    pub id: String,
    /// Only this session may resume it.
    pub session_id: String,
    buffer: Mutex<Buffer>,
    changed: Notify,
}

impl Stream {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Append a message (notification or request) to the stream.
    pub fn push(&self, message: Value) {
        let mut b = self.lock();
        b.events.push(message);
        b.touched = Some(Instant::now());
        drop(b);
        self.changed.notify_waiters();
    }

    /// Append the final message (the response): connections end after it.
    pub fn finish(&self, message: Value) {
        let mut b = self.lock();
        b.events.push(message);
        b.finished_at = Some(Instant::now());
        drop(b);
        self.changed.notify_waiters();
    }

    /// End the connections reading now (after what they have been sent);
    /// the stream goes on and can be resumed.
    pub fn close_connections(&self) {
        self.lock().close_epoch += 1;
        self.changed.notify_waiters();
    }

    fn expired(&self, now: Instant) -> bool {
        let b = self.lock();
        match (b.finished_at, b.touched) {
            (Some(at), _) => now.duration_since(at) > KEEP_FINISHED,
            (None, Some(at)) => now.duration_since(at) > KEEP_IDLE,
            (None, None) => false,
        }
    }
}

/// Every stream of this process.
#[derive(Debug)]
pub struct Streams {
    streams: Mutex<HashMap<String, Arc<Stream>>>,
    /// When expired streams were last swept.
    swept: Mutex<Instant>,
    /// `retry` (ms) sent in priming events: how long a client waits before
    /// reconnecting when the server closes the connection.
    retry_ms: u64,
    keep_alive: Duration,
}

/// How a connection joins a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// The request's own response.
    First,
    /// A GET with Last-Event-ID `<stream>-<n>`: messages after n.
    Resume(usize),
}

/// Why a `Last-Event-ID` could not be resumed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// Not of the form `<stream>-<n>`.
    #[error("Last-Event-ID is not of the form <stream>-<n>")]
    Malformed,
    /// No such stream (finished long ago, another process, or made up), or
    /// another session's.
    #[error("no such stream in this process")]
    Unknown,
}

impl Streams {
    /// A registry whose streams send `retry_ms` and keep-alives.
    pub fn new(retry_ms: u64, keep_alive: Duration) -> Self {
        Self {
            streams: Mutex::new(HashMap::new()),
            swept: Mutex::new(Instant::now()),
            retry_ms,
            keep_alive,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Stream>>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open a new stream for `session_id`.
    pub fn open(&self, session_id: &str) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            id: uuid::Uuid::new_v4().simple().to_string(),
            session_id: session_id.to_owned(),
            buffer: Mutex::new(Buffer {
                touched: Some(Instant::now()),
                ..Buffer::default()
            }),
            changed: Notify::new(),
        });
        let now = Instant::now();
        let mut map = self.lock();
        {
            let mut swept = self.swept.lock().unwrap_or_else(|p| p.into_inner());
            if now.duration_since(*swept) >= SWEEP_EVERY {
                *swept = now;
                map.retain(|_, s| !s.expired(now));
            }
        }
        map.insert(stream.id.clone(), stream.clone());
        stream
    }

    /// The stream and position named by a `Last-Event-ID` of `session_id`.
    pub fn find(
        &self,
        session_id: &str,
        last_event_id: &str,
    ) -> Result<(Arc<Stream>, usize), ResumeError> {
        let (stream_id, n) = last_event_id
            .rsplit_once('-')
            .ok_or(ResumeError::Malformed)?;
        let n: usize = n.parse().map_err(|_| ResumeError::Malformed)?;
        let stream = self
            .lock()
            .get(stream_id)
            .cloned()
            .ok_or(ResumeError::Unknown)?;
        if stream.session_id != session_id || n > stream.lock().events.len() {
            return Err(ResumeError::Unknown);
        }
        Ok((stream, n))
    }

    /// An SSE response reading `stream`: the first connection starts with
    /// the priming event (with `retry`) and reads from the start; a resumed
    /// one reads the messages after `after`. A close asked for before the
    /// first connection attached still ends that connection.
    pub fn respond(&self, stream: Arc<Stream>, attach: Attach) -> Response {
        let retry = self.retry_ms;
        let keep_alive = self.keep_alive;
        let (first, after, epoch) = match attach {
            Attach::First => (true, 0, 0),
            Attach::Resume(after) => (false, after, stream.lock().close_epoch),
        };
        let body = async_stream::stream! {
            if first {
                yield Ok::<_, Infallible>(priming_event(&format!("{}-0", stream.id), retry));
            }
            let mut next = after;
            loop {
                let notified = stream.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let (batch, finished, closed) = {
                    let b = stream.lock();
                    let batch: Vec<Value> = b.events[next..].to_vec();
                    (batch, b.finished_at.is_some(), b.close_epoch != epoch)
                };
                for message in &batch {
                    next += 1;
                    yield Ok(message_event(&format!("{}-{next}", stream.id), message));
                }
                if finished && next == stream.lock().events.len() || closed {
                    break;
                }
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep(keep_alive) => {
                        yield Ok(Bytes::from_static(KEEP_ALIVE));
                    }
                }
            }
        };
        sse_response(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h4_resume_ids_are_checked_against_stream_and_session() {
        let streams = Streams::new(1000, Duration::from_secs(15));
        let s = streams.open("a");
        s.push(serde_json::json!({"n": 1}));
        let id = format!("{}-1", s.id);
        assert_eq!(streams.find("a", &id).map(|(_, n)| n), Ok(1));
        assert_eq!(
            streams.find("b", &id).map(|(_, n)| n),
            Err(ResumeError::Unknown)
        );
        assert_eq!(
            streams.find("a", "nodash").map(|(_, n)| n),
            Err(ResumeError::Malformed)
        );
        assert_eq!(
            streams.find("a", &format!("{}-9", s.id)).map(|(_, n)| n),
            Err(ResumeError::Unknown)
        );
    }
}
