//! Distributed tracing (docs/tracing.md), in two modules, `export` importing
//! `context`: [`context`], W3C trace context in and out (ids,
//! `traceparent`/`tracestate`, what an upstream call carries) and the mark of an
//! exported span; [`export`], the OpenTelemetry export of spans (sampling, the
//! layer, the provider and its one owner). Their items are re-exported here.
//!
//! Two modes, chosen once at start by `tracing.otlp_endpoint`:
//! - **No export** (the default): no span is recorded. Upstream calls still
//!   carry a `traceparent`: the caller's trace (or a new one) with a fresh span
//!   id per call, made here. The request's headers are only looked up and
//!   parsed when an upstream call is made ([`Incoming`] borrows them), so the
//!   hit path does no trace work.
//! - **Export**: sampling is decided per request before its span is made
//!   ([`sampled`]: the caller's flag, else `tracing.sample_ratio`). A sampled
//!   request gets an exported span (the `tracing-opentelemetry` layer records
//!   it and its `upstream` spans, nothing else), continuing the caller's trace;
//!   an upstream call's `traceparent` is then its own span's context. An
//!   unsampled request gets the log's span only and is handled as without
//!   export: it costs what it costs without export. Spans go out in batches
//!   from the SDK's own thread, over OTLP/HTTP (protobuf).
//!
//! Never a phone number in a span: the spans carry the route, the upstream's
//! name, cache outcomes, the decision's kind and status codes, nothing else.

pub mod context;
pub mod export;

pub use context::{
    Incoming, Parent, RequestTrace, TRACEPARENT, TRACESTATE, TraceContext, call_headers,
    continue_trace, current_is_exported, format_traceparent, parse_traceparent,
};
pub use export::{Export, event, sampled, upstream_span};
