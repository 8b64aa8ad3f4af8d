//! Spans whose ids are chosen before they start: the life of a session.
//!
//! A session's life span is planned when the session is created, inside
//! its spawn span: the trace id and the spawn span's id are known then, and
//! a fresh span id is drawn for the life. The ids go to the ledger, to the
//! agent (as `TRACEPARENT`) and to the spawn spans of its children; the span
//! itself is exported when the session ends, with the times the ledger
//! recorded, so a tree of any duration is one trace whose nesting is the
//! spawn tree, and a restart of the service in between loses nothing.

use std::{cell::Cell, time::SystemTime};

use opentelemetry::{
    Context, KeyValue,
    trace::{
        Event, Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _,
        TraceFlags, TraceId, TraceState, Tracer as _,
    },
};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

thread_local! {
    /// The id the next span started on this thread gets (set only around
    /// the start of a planned span).
    static NEXT_SPAN_ID: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// The SDK's random ids, except for a planned span's own.
#[derive(Debug, Default)]
pub(super) struct Ids(RandomIdGenerator);

impl IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        self.0.new_trace_id()
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_SPAN_ID.take().unwrap_or_else(|| self.0.new_span_id())
    }
}

/// A session's place in its tree's trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LifeSpan {
    pub trace_id: TraceId,
    /// The span of the session's life: the parent of its children's spawns
    /// and of whatever its agent traces.
    pub span_id: SpanId,
    /// The spawn span that created the session: the life span's parent.
    pub spawn_span_id: SpanId,
    pub sampled: bool,
}

/// What a session's life span says, once the session has ended.
#[derive(Debug)]
pub struct Life {
    pub name: String,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    pub events: Vec<Event>,
    pub links: Vec<Link>,
    /// Why the session failed, if it did.
    pub error: Option<String>,
}

impl LifeSpan {
    /// Plans the life of a session created in the current span (its spawn
    /// span). `None` when no span is traced, as without an exporter.
    pub fn plan() -> Option<LifeSpan> {
        let cx = tracing::Span::current().context();
        let spawn = cx.span().span_context().clone();
        spawn.is_valid().then(|| LifeSpan {
            trace_id: spawn.trace_id(),
            span_id: RandomIdGenerator::default().new_span_id(),
            spawn_span_id: spawn.span_id(),
            sampled: spawn.is_sampled(),
        })
    }

    /// The W3C `traceparent` of the life span, as an agent receives it.
    pub fn traceparent(&self) -> String {
        super::traceparent(&self.span_context())
    }

    /// Reads the stored form: the life span's `traceparent` and the spawn
    /// span's id in hex. `None` if either is malformed.
    pub fn parse(traceparent: &str, spawn_span_id: &str) -> Option<LifeSpan> {
        let mut parts = traceparent.split('-');
        let (Some("00"), Some(trace), Some(span), Some(flags), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        fn hex_of(text: &str, len: usize) -> Option<&str> {
            (text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit())).then_some(text)
        }
        let life = LifeSpan {
            trace_id: TraceId::from_hex(hex_of(trace, 32)?).ok()?,
            span_id: SpanId::from_hex(hex_of(span, 16)?).ok()?,
            spawn_span_id: SpanId::from_hex(hex_of(spawn_span_id, 16)?).ok()?,
            sampled: u8::from_str_radix(hex_of(flags, 2)?, 16).ok()? & 1 == 1,
        };
        let valid = life.trace_id != TraceId::INVALID
            && life.span_id != SpanId::INVALID
            && life.spawn_span_id != SpanId::INVALID;
        valid.then_some(life)
    }

    /// The life span, as the remote parent of spans made elsewhere.
    pub fn span_context(&self) -> SpanContext {
        SpanContext::new(
            self.trace_id,
            self.span_id,
            self.flags(),
            true,
            TraceState::default(),
        )
    }

    /// Makes `span` (not started yet) a child of this life, unless the call
    /// it serves comes from a span of this trace (`call`, the span its
    /// `traceparent` names: an agent that forwarded its `TRACEPARENT`):
    /// then it stays under the call's span. A call from another trace is
    /// linked, so its trace still leads here.
    pub fn adopt(&self, span: &tracing::Span, call: Option<&SpanContext>) {
        if call.is_some_and(|call| call.trace_id() == self.trace_id) {
            return;
        }
        super::continue_span(span, &self.span_context());
        if let Some(call) = call {
            span.add_link(call.clone());
        }
    }

    /// Exports the life span: started at `life.start` under the spawn span,
    /// ended at `life.end`, with the planned id. The sampler decides as for
    /// any child of the spawn span.
    pub fn export(&self, life: Life) {
        let tracer = opentelemetry::global::tracer("troupe");
        let parent = Context::new().with_remote_span_context(SpanContext::new(
            self.trace_id,
            self.spawn_span_id,
            self.flags(),
            true,
            TraceState::default(),
        ));
        let builder = tracer
            .span_builder(life.name)
            .with_kind(SpanKind::Internal)
            .with_start_time(life.start)
            .with_attributes(life.attributes)
            .with_events(life.events)
            .with_links(life.links);
        NEXT_SPAN_ID.set(Some(self.span_id));
        let mut span = tracer.build_with_context(builder, &parent);
        NEXT_SPAN_ID.set(None);
        if let Some(error) = life.error {
            span.set_status(Status::error(error));
        }
        span.end_with_timestamp(life.end);
    }

    fn flags(&self) -> TraceFlags {
        if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_form_reads_back() {
        let life = LifeSpan {
            trace_id: TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            span_id: SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            spawn_span_id: SpanId::from_hex("0af7651916cd43dd").unwrap(),
            sampled: true,
        };
        let traceparent = life.traceparent();
        assert_eq!(
            traceparent,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(
            LifeSpan::parse(&traceparent, "0af7651916cd43dd"),
            Some(life)
        );
        let unsampled = LifeSpan {
            sampled: false,
            ..life
        };
        assert_eq!(
            LifeSpan::parse(&unsampled.traceparent(), "0af7651916cd43dd"),
            Some(unsampled)
        );
    }

    #[test]
    fn malformed_stored_forms_are_refused() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let spawn = "0af7651916cd43dd";
        assert!(LifeSpan::parse(good, spawn).is_some());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(LifeSpan::parse(bad, spawn), None, "{bad:?}");
        }
        assert_eq!(LifeSpan::parse(good, "0000000000000000"), None);
        assert_eq!(LifeSpan::parse(good, "0af7651916cd43"), None);
    }
}
