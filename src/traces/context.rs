//! The W3C trace context a task carries (`traceparent`, `tracestate`):
//! read from a call (`params._meta`, as MCP clients send it, else the
//! HTTP headers), stored on the task's row, and handed on to what runs it
//! (a command tool's environment, an upstream call's `_meta`).
//!
//! Parsing and formatting are the OpenTelemetry propagator's, so what is
//! stored and passed on is always well-formed: a `traceparent` that is not
//! (a wrong length, an all-zero id, an unknown version's shape) is
//! ignored, as the W3C recommendation says a server must, and the call
//! goes on without a trace.

use std::collections::HashMap;

use axum::http::HeaderMap;
use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::{Map, Value};

/// The `_meta` key and header of the parent span.
const TRACEPARENT: &str = "traceparent";
/// The `_meta` key and header of the vendors' entries.
const TRACESTATE: &str = "tracestate";
/// The longest `tracestate` stored and passed on: W3C asks every hop to
/// pass at least 512 characters; a longer one is dropped (its
/// `traceparent` still counts).
const TRACESTATE_MAX: usize = 512;

/// A valid W3C trace context, as its two header values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`.
    pub traceparent: String,
    /// The vendors' entries, if any came (at most [`TRACESTATE_MAX`]).
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context a request came with: `params._meta` first (SEP-414,
    /// what MCP SDKs send), else the `traceparent`/`tracestate` headers.
    /// None if neither holds a valid `traceparent`.
    pub fn of_request(meta: Option<&Value>, headers: Option<&HeaderMap>) -> Option<Self> {
        let from_meta = meta.and_then(|m| {
            let parent = m.get(TRACEPARENT)?.as_str()?;
            Self::parse(parent, m.get(TRACESTATE).and_then(Value::as_str))
        });
        from_meta.or_else(|| {
            let headers = headers?;
            let parent = headers.get(TRACEPARENT)?.to_str().ok()?;
            let state = headers.get(TRACESTATE).and_then(|v| v.to_str().ok());
            Self::parse(parent, state)
        })
    }

    /// The context stored on a task's row, as stored: it was parsed when
    /// the task was created, so it is not parsed again for every run
    /// (spans parse it as their parent, and an invalid one, written by
    /// hand, is then no parent).
    pub fn stored(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        Some(Self {
            traceparent: traceparent?.to_owned(),
            tracestate: tracestate.map(str::to_owned),
        })
    }

    /// `traceparent` and `tracestate` as the W3C propagator reads them;
    /// None if `traceparent` is not valid.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert(TRACEPARENT.to_owned(), traceparent.trim().to_owned());
        if let Some(state) = tracestate.filter(|s| s.len() <= TRACESTATE_MAX) {
            carrier.insert(TRACESTATE.to_owned(), state.to_owned());
        }
        let cx = TraceContextPropagator::new().extract(&carrier);
        Self::of_span_context(cx.span().span_context())
    }

    /// The two values that name `span` as the parent (None for an invalid
    /// span context).
    pub(super) fn of_span_context(span: &SpanContext) -> Option<Self> {
        if !span.is_valid() {
            return None;
        }
        let cx = Context::new().with_remote_span_context(span.clone());
        let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        let traceparent = carrier.remove(TRACEPARENT)?;
        let tracestate = carrier
            .remove(TRACESTATE)
            .filter(|s| !s.is_empty() && s.len() <= TRACESTATE_MAX);
        Some(Self {
            traceparent,
            tracestate,
        })
    }

    /// An OpenTelemetry context whose (remote) span is this one: the parent
    /// of the spans started under it.
    pub(super) fn as_parent(&self) -> Context {
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert(TRACEPARENT.to_owned(), self.traceparent.clone());
        if let Some(state) = &self.tracestate {
            carrier.insert(TRACESTATE.to_owned(), state.clone());
        }
        TraceContextPropagator::new().extract(&carrier)
    }

    /// Write the context into a request's `_meta` (SEP-414), as the broker
    /// calls an upstream server.
    pub fn insert_into(&self, meta: &mut Map<String, Value>) {
        meta.insert(TRACEPARENT.into(), Value::String(self.traceparent.clone()));
        match &self.tracestate {
            Some(state) => meta.insert(TRACESTATE.into(), Value::String(state.clone())),
            None => meta.remove(TRACESTATE),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn meta_wins_over_headers_and_bad_values_are_ignored() {
        let mut headers = HeaderMap::new();
        headers.insert(
            TRACEPARENT,
            "00-11111111111111111111111111111111-2222222222222222-01"
                .parse()
                .unwrap(),
        );
        let meta = json!({ "traceparent": PARENT, "tracestate": "vendor=abc" });
        let cx = TraceContext::of_request(Some(&meta), Some(&headers)).unwrap();
        assert_eq!(cx.traceparent, PARENT);
        assert_eq!(cx.tracestate.as_deref(), Some("vendor=abc"));

        // An invalid _meta value falls back to the header.
        let bad = json!({ "traceparent": "00-zz-b7ad6b7169203331-01" });
        let cx = TraceContext::of_request(Some(&bad), Some(&headers)).unwrap();
        assert!(cx.traceparent.starts_with("00-1111"));

        for bad in [
            "",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad}");
        }
        assert_eq!(TraceContext::of_request(None, None), None);
    }

    #[test]
    fn an_oversized_tracestate_is_dropped_not_the_parent() {
        let long = format!("v={}", "a".repeat(TRACESTATE_MAX));
        let cx = TraceContext::parse(PARENT, Some(&long)).unwrap();
        assert_eq!(cx.tracestate, None);
        let mut meta = Map::new();
        cx.insert_into(&mut meta);
        assert_eq!(meta.get("traceparent"), Some(&json!(PARENT)));
    }
}
