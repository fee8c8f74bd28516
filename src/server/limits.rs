//! Abuse limits of the HTTP side (T-38): a request rate per requestor (a
//! token bucket per principal, or per session without tokens), a rate of
//! initialize per client address, and a cap on open SSE streams.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use futures_util::StreamExt;

/// Who a request counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requestor<'a> {
    /// The principal of its bearer token.
    Principal(&'a str),
    /// Without tokens: the live session it names.
    Session(&'a str),
    /// Without tokens and without a live session (initialize, mostly): the
    /// client's address, if known.
    Address(Option<IpAddr>),
}

impl std::fmt::Display for Requestor<'_> {
    /// `principal:NAME`, `session:ID` or `address:IP` (for logs).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Principal(p) => write!(f, "principal:{p}"),
            Self::Session(s) => write!(f, "session:{s}"),
            Self::Address(Some(a)) => write!(f, "address:{a}"),
            Self::Address(None) => f.write_str("address:unknown"),
        }
    }
}

/// A refusal: how long to wait, and the message that names the limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Until the bucket holds a request again.
    pub wait: Duration,
    /// "Too Many Requests: ...", naming the limit and its setting.
    pub message: String,
}

/// The request-rate limits: one bucket per requestor for requests, one per
/// address for requests that name no live session. Without tokens every
/// local client shares 127.0.0.1, so a per-address rate would make clients
/// wait for each other; per session each client has its own. Sessions
/// themselves are opened at the per-address rate, so one address cannot
/// mint fresh buckets without bound.
#[derive(Debug)]
pub struct RequestLimits {
    /// Per principal, or per session without tokens.
    requests: RateLimiter,
    /// Per client address, for requests with no live session.
    initialize: RateLimiter,
}

impl RequestLimits {
    /// `requests` per requestor, `initialize` per address.
    pub fn new(requests: RateLimiter, initialize: RateLimiter) -> Self {
        Self {
            requests,
            initialize,
        }
    }

    /// Take one request for `who`, or say why not.
    pub fn check(&self, who: Requestor<'_>) -> Result<(), Refusal> {
        let (limiter, key, what, per, flags) = match who {
            Requestor::Principal(_) => (
                &self.requests,
                who.to_string(),
                "requests",
                "principal",
                "--rate, --rate-burst",
            ),
            Requestor::Session(_) => (
                &self.requests,
                who.to_string(),
                "requests",
                "session",
                "--rate, --rate-burst",
            ),
            Requestor::Address(addr) => (
                &self.initialize,
                addr.map_or_else(|| "addr:-".to_owned(), |a| format!("addr:{a}")),
                "initialize requests",
                "client address",
                "--initialize-rate, --initialize-burst",
            ),
        };
        limiter.check(&key).map_err(|wait| {
            let (rate, burst) = limiter.describe();
            Refusal {
                wait,
                message: format!(
                    "Too Many Requests: at most {rate} {what}/s (burst {burst}) per {per} \
                     ({flags}); retry in {} ms",
                    wait.as_millis()
                ),
            }
        })
    }
}

/// Buckets kept before the first pruning of full ones.
const PRUNE_FIRST: usize = 4096;

/// Token buckets, one per key.
#[derive(Debug)]
pub struct RateLimiter {
    /// Requests per second refilled.
    rate: f64,
    /// Bucket size: the burst allowed.
    burst: f64,
    /// Tokens left and when last refilled, per key.
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    /// Full buckets (their key unused for a while) are forgotten when the
    /// map reaches this size, which then becomes twice what is left (at
    /// least [`PRUNE_FIRST`]): one bucket per session would otherwise stay
    /// for every session ever opened.
    prune_at: std::sync::atomic::AtomicUsize,
}

impl RateLimiter {
    /// `rate` requests per second, bursts up to `burst`; a rate of 0 turns
    /// limiting off.
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst: burst.max(1.0),
            buckets: Mutex::new(HashMap::new()),
            prune_at: std::sync::atomic::AtomicUsize::new(PRUNE_FIRST),
        }
    }

    /// Take one request for `key`; Err(wait) when the bucket is empty.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= self.prune_at.load(std::sync::atomic::Ordering::Relaxed) {
            // A full bucket is the same as none.
            let burst = self.burst;
            let rate = self.rate;
            buckets.retain(|_, (tokens, at)| {
                *tokens + now.duration_since(*at).as_secs_f64() * rate < burst
            });
            self.prune_at.store(
                (buckets.len() * 2).max(PRUNE_FIRST),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        let (tokens, at) = buckets.entry(key.to_owned()).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / self.rate))
        }
    }

    /// The configured rate and burst.
    pub fn describe(&self) -> (f64, f64) {
        (self.rate, self.burst)
    }
}

/// Counts open SSE streams against a maximum.
#[derive(Debug)]
pub struct StreamCounter {
    open: Arc<AtomicUsize>,
    max: usize,
}

/// Held by an open stream; releases its place when dropped.
#[derive(Debug)]
pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl StreamCounter {
    /// At most `max` streams open at once.
    pub fn new(max: usize) -> Self {
        Self {
            open: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// A place for one more stream, or None at the maximum.
    pub fn acquire(&self) -> Option<StreamSlot> {
        let before = self.open.fetch_add(1, Ordering::Relaxed);
        let slot = StreamSlot(self.open.clone());
        (before < self.max).then_some(slot)
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The maximum.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl crate::metrics::OpenStreams for StreamCounter {
    fn open(&self) -> usize {
        StreamCounter::open(self)
    }
}

/// Tie `held` (a [`StreamSlot`], with whatever else the stream keeps) to
/// `response`'s body: it is dropped, the place released, when the body is
/// done or dropped (the client went away).
pub fn hold_while_streaming(response: Response, held: impl Send + 'static) -> Response {
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _held = &held;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t38_bucket_allows_burst_then_refuses() {
        let limiter = RateLimiter::new(1.0, 3.0);
        assert!(limiter.check("a").is_ok());
        assert!(limiter.check("a").is_ok());
        assert!(limiter.check("a").is_ok());
        let wait = limiter.check("a").unwrap_err();
        assert!(wait > Duration::from_millis(500) && wait <= Duration::from_secs(1));
        assert!(limiter.check("b").is_ok(), "buckets are per key");
        assert!(RateLimiter::new(0.0, 1.0).check("a").is_ok(), "0 = off");
    }

    #[test]
    fn t38_sessions_and_addresses_have_buckets_of_their_own() {
        let limits = RequestLimits::new(RateLimiter::new(1.0, 1.0), RateLimiter::new(1.0, 2.0));
        let addr = Some(IpAddr::from([127, 0, 0, 1]));
        assert!(limits.check(Requestor::Session("a")).is_ok());
        let refused = limits.check(Requestor::Session("a")).unwrap_err();
        assert!(
            refused.message.contains("per session"),
            "{}",
            refused.message
        );
        assert!(limits.check(Requestor::Session("b")).is_ok());
        assert!(
            limits.check(Requestor::Principal("a")).is_ok(),
            "not the session a"
        );
        assert!(limits.check(Requestor::Address(addr)).is_ok());
        assert!(limits.check(Requestor::Address(addr)).is_ok());
        let refused = limits.check(Requestor::Address(addr)).unwrap_err();
        assert!(
            refused.message.contains("per client address")
                && refused.message.contains("initialize-rate"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn stream_slots_are_counted_and_released() {
        let c = StreamCounter::new(1);
        let a = c.acquire().unwrap();
        assert!(c.acquire().is_none());
        drop(a);
        assert!(c.acquire().is_some());
    }
}
