//! Traces of a task's whole life as OpenTelemetry spans, linked across
//! processes: the client's `tools/call` (its W3C `traceparent` as parent),
//! the task's creation, each claim and attempt in whichever broker or
//! worker process runs it, and the completion. The creation's context is
//! stored on the task's row ([`TraceContext`]), so a claim in another
//! process, or after a restart, continues the same trace; a command tool
//! gets it as `TRACEPARENT`, an upstream server in `params._meta`.
//!
//! Exporting is off unless `--otlp-endpoint` or the standard
//! `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` is set ([`export`]). Off, a
//! [`Span`] is an empty value (no clock read, no allocation) and only a
//! context the client sent is carried through, as it came.

mod context;
pub mod export;

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::SystemTime;

use opentelemetry::trace::{Span as _, Status, Tracer as _};
use opentelemetry_sdk::trace::{SdkTracer, Span as SdkSpan};

pub use context::TraceContext;
pub use opentelemetry::KeyValue;
pub use opentelemetry::trace::SpanKind;

/// The tracer while spans are exported; unset when they are not.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Whether this process exports spans.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// Attribute keys, one place for each (OpenTelemetry's MCP and GenAI
/// conventions where they name the thing, `taskbroker.*` otherwise).
pub mod key {
    /// The JSON-RPC method of the client's request.
    pub const METHOD: &str = "mcp.method.name";
    /// The 2025-11-25 session, if the call came in one.
    pub const SESSION: &str = "mcp.session.id";
    /// The tool called.
    pub const TOOL: &str = "gen_ai.tool.name";
    /// The task's id.
    pub const TASK_ID: &str = "taskbroker.task.id";
    /// The run of the task (1 for the first).
    pub const ATTEMPT: &str = "taskbroker.attempt";
    /// The worker pool that claimed it.
    pub const WORKER: &str = "taskbroker.worker.id";
    /// The status the task ended in, or was left in.
    pub const STATUS: &str = "taskbroker.task.status";
    /// The job's priority.
    pub const PRIORITY: &str = "taskbroker.priority";
}

/// A span's name and attributes.
pub type Described = (Cow<'static, str>, Vec<KeyValue>);

/// One span of a task's life; empty when traces are off. Ends when
/// dropped.
#[derive(Debug)]
pub struct Span {
    inner: Option<SdkSpan>,
    /// What children and the programs it starts get as their parent: this
    /// span's context, or (off) the parent it was given.
    context: Option<TraceContext>,
}

impl Span {
    /// Start a span under `parent` (a new trace if None), with the name and
    /// attributes `describe` gives (called only when traces are on).
    pub fn start(
        kind: SpanKind,
        parent: Option<&TraceContext>,
        describe: impl FnOnce() -> Described,
    ) -> Self {
        Self::start_at(kind, parent, None, describe)
    }

    /// [`Span::start`], begun at `started` (a step measured before it was
    /// known to belong to this trace, such as a claim of several jobs).
    pub fn start_at(
        kind: SpanKind,
        parent: Option<&TraceContext>,
        started: Option<SystemTime>,
        describe: impl FnOnce() -> Described,
    ) -> Self {
        let Some(tracer) = TRACER.get() else {
            return Self {
                inner: None,
                context: parent.cloned(),
            };
        };
        let parent_cx = parent.map(TraceContext::as_parent).unwrap_or_default();
        let (name, attributes) = describe();
        let mut builder = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes);
        if let Some(at) = started {
            builder = builder.with_start_time(at);
        }
        let span = builder.start_with_context(tracer, &parent_cx);
        let context = TraceContext::of_span_context(span.span_context());
        Self {
            inner: Some(span),
            context,
        }
    }

    /// The context its children and the programs it starts get.
    pub fn context(&self) -> Option<&TraceContext> {
        self.context.as_ref()
    }

    /// Add attributes (made only when traces are on).
    pub fn set(&mut self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(span) = &mut self.inner {
            span.set_attributes(attributes());
        }
    }

    /// Mark it failed, with why.
    pub fn fail(&mut self, message: impl FnOnce() -> String) {
        if let Some(span) = &mut self.inner {
            span.set_status(Status::error(message()));
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(mut span) = self.inner.take() {
            span.end();
        }
    }
}
