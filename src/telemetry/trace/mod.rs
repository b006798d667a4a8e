//! Distributed tracing (docs/tracing.md): [`context`], W3C trace context in and
//! out; [`export`], the OTLP span export. Their items are re-exported here.
//! Never a phone number in a span: its values are fixed words, status codes and
//! the request id.

pub mod context;
pub mod export;

pub use context::{
    Incoming, Parent, RequestTrace, TRACEPARENT, TRACESTATE, TraceContext, call_headers,
    continue_trace, current_is_exported, format_traceparent, parse_traceparent,
};
pub use export::{Export, event, sampled, upstream_span};
