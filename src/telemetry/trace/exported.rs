//! The mark of an exported span, the one thing both [`super::context`] (whose
//! `traceparent` is an exported span's own context) and [`super::export`] (the
//! layer records only marked spans) read: a leaf, so that the export reads the
//! context and never the reverse.

/// The field that marks a span's callsite as exported (`otel.kind`, which
/// `tracing-opentelemetry` reads as the span kind): every other span, and every
/// event, stays in the logs only.
pub const EXPORTED_FIELD: &str = "otel.kind";

/// Whether the current span is an exported one: read from its callsite's
/// fields, without touching the span (no reference count, no lookup).
pub fn current_is_exported() -> bool {
    tracing::dispatcher::get_default(|dispatch| {
        dispatch
            .current_span()
            .metadata()
            .is_some_and(|meta| meta.fields().field(EXPORTED_FIELD).is_some())
    })
}
