//! W3C Trace Context in and out: `traceparent` parsed and written, the trace a
//! request's upstream calls continue ([`TraceContext`], via [`Incoming`]), and the
//! mark of an exported span ([`EXPORTED_FIELD`]). By hand: the SDK's propagator
//! drops a whole `tracestate` for one bad entry.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The field marking a span's callsite as exported; other spans and events are logs only.
pub const EXPORTED_FIELD: &str = "otel.kind";

/// Whether the current span is exported: read from its callsite, not the span itself.
pub fn current_is_exported() -> bool {
    tracing::dispatcher::get_default(|dispatch| {
        dispatch
            .current_span()
            .metadata()
            .is_some_and(|meta| meta.fields().field(EXPORTED_FIELD).is_some())
    })
}

pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The caller's `traceparent`, when there is exactly one (two are invalid).
pub fn traceparent_of(headers: &HeaderMap) -> Option<&HeaderValue> {
    let mut values = headers.get_all(TRACEPARENT).iter();
    match (values.next(), values.next()) {
        (one, None) => one,
        (_, Some(_)) => None,
    }
}

/// A valid `traceparent`: the caller's trace, its span, its sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

/// Parses a `traceparent` as W3C level 1 does (docs/tracing.md); `None` when invalid.
pub fn parse_traceparent(value: &[u8]) -> Option<Parent> {
    if value.len() < 55 {
        return None;
    }
    let version = hex_byte(&value[0..2])?;
    if version == 0xff
        || (version == 0 && value.len() != 55)
        || (value.len() > 55 && value[55] != b'-')
    {
        return None;
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let mut trace_id = [0u8; 16];
    for (i, byte) in trace_id.iter_mut().enumerate() {
        *byte = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
    }
    let mut span_id = [0u8; 8];
    for (i, byte) in span_id.iter_mut().enumerate() {
        *byte = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
    }
    let flags = hex_byte(&value[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// Two lowercase hex digits (W3C forbids uppercase).
fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(pair[0])? << 4 | digit(pair[1])?)
}

/// `00-{trace_id}-{span_id}-{flags}`, the only version this writes.
pub fn format_traceparent(trace_id: [u8; 16], span_id: [u8; 8], sampled: bool) -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 55];
    out[..3].copy_from_slice(b"00-");
    for (i, byte) in trace_id.iter().enumerate() {
        out[3 + 2 * i] = HEX[usize::from(byte >> 4)];
        out[4 + 2 * i] = HEX[usize::from(byte & 0xf)];
    }
    out[35] = b'-';
    for (i, byte) in span_id.iter().enumerate() {
        out[36 + 2 * i] = HEX[usize::from(byte >> 4)];
        out[37 + 2 * i] = HEX[usize::from(byte & 0xf)];
    }
    out[52..].copy_from_slice(if sampled { b"-01" } else { b"-00" });
    // Hex digits and dashes are always a valid header value; the fallback is never taken.
    HeaderValue::from_bytes(&out).unwrap_or(HeaderValue::from_static("00"))
}

/// The trace a request's upstream calls continue, when no span is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub sampled: bool,
    /// The caller's `tracestate`, forwarded with its trace (never with a new one).
    pub state: Option<HeaderValue>,
}

impl TraceContext {
    /// The caller's trace if its `traceparent` is valid, else a new, unsampled one.
    pub fn continue_or_start(
        traceparent: Option<&HeaderValue>,
        tracestate: Option<&HeaderValue>,
    ) -> Self {
        match traceparent.and_then(|v| parse_traceparent(v.as_bytes())) {
            Some(parent) => TraceContext {
                trace_id: parent.trace_id,
                sampled: parent.sampled,
                state: tracestate.cloned(),
            },
            None => TraceContext::start(),
        }
    }

    pub fn start() -> Self {
        TraceContext {
            trace_id: random_id(),
            sampled: false,
            state: None,
        }
    }
}

/// The trace of one request as its caller sent it, made by the HTTP layer and
/// read by the resolver without knowing of HTTP. Parsed once, on first use (a
/// hit never does); every lookup of the request shares it, a new trace too.
#[derive(Debug, Default)]
pub struct RequestTrace<'h> {
    traceparent: Option<&'h HeaderValue>,
    tracestate: Option<&'h HeaderValue>,
    /// Boxed: the request future holds this, and a hit never fills it.
    context: OnceLock<Box<TraceContext>>,
}

impl<'h> RequestTrace<'h> {
    /// The trace these headers name (a new one when none is valid).
    pub fn of(headers: &'h HeaderMap) -> Self {
        RequestTrace {
            traceparent: traceparent_of(headers),
            tracestate: headers.get(TRACESTATE),
            context: OnceLock::new(),
        }
    }

    /// The trace upstream calls continue (parsed, or started, once).
    pub fn context(&self) -> &TraceContext {
        self.context.get_or_init(|| {
            Box::new(TraceContext::continue_or_start(
                self.traceparent,
                self.tracestate,
            ))
        })
    }
}

/// What one lookup knows of its request's trace, and whether its span is exported.
#[derive(Debug, Default)]
pub struct Incoming<'a> {
    trace: Option<&'a RequestTrace<'a>>,
    /// Without a request trace: a new one, started on first use.
    own: OnceLock<Box<TraceContext>>,
    /// The current span is a sampled request's exported span.
    exported: bool,
}

impl<'a> Incoming<'a> {
    /// The lookup of a request with this trace; with `export` off no span is read.
    pub fn new(trace: Option<&'a RequestTrace<'a>>, export: bool) -> Self {
        Incoming {
            trace,
            own: OnceLock::new(),
            exported: export && current_is_exported(),
        }
    }

    /// Whether the request's span is exported: only then are events worth making.
    pub fn exported(&self) -> bool {
        self.exported
    }

    pub fn context(&self) -> &TraceContext {
        match self.trace {
            Some(trace) => trace.context(),
            None => self.own.get_or_init(|| Box::new(TraceContext::start())),
        }
    }
}

/// The `traceparent` (and `tracestate`) of one upstream call under `span`: the
/// span's own context when recorded, else `inherited`'s trace (or a new one,
/// as for a status-feed poll) with a fresh span id.
pub fn call_headers(
    span: &tracing::Span,
    inherited: Option<&TraceContext>,
) -> (HeaderValue, Option<HeaderValue>) {
    let context = span.context();
    let otel_span = context.span();
    let recorded = otel_span.span_context();
    if recorded.is_valid() {
        let state = recorded.trace_state().header();
        return (
            format_traceparent(
                recorded.trace_id().to_bytes(),
                recorded.span_id().to_bytes(),
                recorded.is_sampled(),
            ),
            (!state.is_empty())
                .then(|| HeaderValue::from_str(&state).ok())
                .flatten(),
        );
    }
    let started;
    let trace = match inherited {
        Some(trace) => trace,
        None => {
            started = TraceContext::start();
            &started
        }
    };
    (
        format_traceparent(trace.trace_id, random_id(), trace.sampled),
        trace.state.clone(),
    )
}

/// Makes `span` continue the caller's trace when its `traceparent` is valid.
pub fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
    let Some(parent) = traceparent_of(headers).and_then(|v| parse_traceparent(v.as_bytes())) else {
        return;
    };
    // An invalid tracestate is dropped; the traceparent still counts.
    let state = headers
        .get(TRACESTATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<TraceState>().ok())
        .unwrap_or_default();
    let context = SpanContext::new(
        TraceId::from_bytes(parent.trace_id),
        SpanId::from_bytes(parent.span_id),
        if parent.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        },
        true,
        state,
    );
    // Fails only without the layer or on a started span: not a fresh request's.
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(context));
}

/// Random bytes for a new trace or span id, never all zero: the OS's, drawn 512
/// bytes at a time into a thread's buffer rather than a system call per id.
fn random_id<const N: usize>() -> [u8; N] {
    let mut id = [0u8; N];
    let drawn = RANDOM.with_borrow_mut(|pool| pool.take(&mut id));
    if !drawn || id == [0; N] {
        // No randomness from the OS (never seen on Linux): a hashed counter
        // keeps ids unique within the process, which is what they are for.
        use std::hash::BuildHasher;
        static SEQUENCE: AtomicU64 = AtomicU64::new(1);
        let seed = foldhash::fast::RandomState::default();
        for chunk in id.chunks_mut(8) {
            let n = seed.hash_one(SEQUENCE.fetch_add(1, Ordering::Relaxed)) | 1;
            chunk.copy_from_slice(&n.to_le_bytes()[..chunk.len()]);
        }
    }
    id
}

/// Bytes from the OS's generator not handed out yet; each is handed out once.
struct RandomPool {
    bytes: [u8; 512],
    used: usize,
}

thread_local! {
    static RANDOM: std::cell::RefCell<RandomPool> = const {
        std::cell::RefCell::new(RandomPool { bytes: [0; 512], used: 512 })
    };
}

impl RandomPool {
    /// Fills `out` (at most 512 bytes); false when the OS has none to give.
    fn take(&mut self, out: &mut [u8]) -> bool {
        if self.bytes.len() - self.used < out.len() {
            if getrandom::fill(&mut self.bytes).is_err() {
                return false;
            }
            self.used = 0;
        }
        out.copy_from_slice(&self.bytes[self.used..self.used + out.len()]);
        self.used += out.len();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn parse(value: impl AsRef<[u8]>) -> Option<Parent> {
        parse_traceparent(value.as_ref())
    }

    /// Drawn from a buffer refilled every 512 bytes: ids across many refills
    /// are all distinct and none is zero.
    #[test]
    fn random_ids_are_distinct_across_refills_of_the_pool() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let span: [u8; 8] = random_id();
            let trace: [u8; 16] = random_id();
            assert_ne!(span, [0; 8]);
            assert_ne!(trace, [0; 16]);
            assert!(seen.insert(span.to_vec()) && seen.insert(trace.to_vec()));
        }
    }

    #[test]
    fn a_valid_traceparent_parses_and_formats_back() {
        let parent = parse(VALID).unwrap();
        assert!(parent.sampled);
        assert_eq!(parent.trace_id[0], 0x4b);
        assert_eq!(parent.span_id[7], 0xb7);
        let formatted = format_traceparent(parent.trace_id, parent.span_id, parent.sampled);
        assert_eq!(formatted, VALID);
        assert!(!parse(VALID.replace("-01", "-00")).unwrap().sampled);
        // Other flags than sampled are read past.
        assert!(parse(VALID.replace("-01", "-03")).unwrap().sampled);
    }

    #[test]
    fn invalid_traceparents_are_rejected() {
        for bad in [
            "",
            "00",
            "garbage",
            // Uppercase, all-zero ids, version ff, wrong separators or lengths.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_later_version_may_append_fields() {
        let later = format!("{}-whatever", VALID.replacen("00", "cc", 1));
        assert!(parse(&later).is_some());
        assert!(parse(VALID.replacen("00", "cc", 1)).is_some());
    }

    #[test]
    fn without_recorded_spans_calls_continue_the_trace_with_fresh_span_ids() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(VALID));
        headers.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
        let request = RequestTrace::of(&headers);
        let incoming = Incoming::new(Some(&request), false);
        let trace = incoming.context();
        let span = tracing::Span::none();
        let (first, state) = call_headers(&span, Some(trace));
        let (second, _) = call_headers(&span, Some(trace));
        let (first, second) = (parse(&first).unwrap(), parse(&second).unwrap());
        assert_eq!(first.trace_id, parse(VALID).unwrap().trace_id);
        assert_eq!(first.trace_id, second.trace_id);
        assert_ne!(first.span_id, second.span_id);
        let incoming_span = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];
        assert_ne!(first.span_id, incoming_span);
        assert!(first.sampled);
        assert_eq!(state.unwrap(), "vendor=x");
    }

    #[test]
    fn a_missing_or_invalid_traceparent_starts_one_trace_per_request() {
        for value in [None, Some("00-nonsense")] {
            let mut headers = HeaderMap::new();
            headers.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
            if let Some(value) = value {
                headers.insert(TRACEPARENT, HeaderValue::from_static(value));
            }
            let request = RequestTrace::of(&headers);
            let incoming = Incoming::new(Some(&request), false);
            let trace = incoming.context().clone();
            assert_eq!(&trace, incoming.context(), "made once per request");
            let again = Incoming::new(Some(&request), false);
            let continued = "every lookup of the request (a batch's items) continues it";
            assert_eq!(&trace, again.context(), "{continued}");
            assert!(!trace.sampled);
            let why = "tracestate goes only with its traceparent";
            assert_eq!(trace.state, None, "{why}");
            assert_ne!(trace.trace_id, [0; 16]);
            let other = RequestTrace::of(&headers);
            assert_ne!(trace.trace_id, other.context().trace_id);
            let (call, state) = call_headers(&tracing::Span::none(), Some(&trace));
            assert_eq!(parse(&call).unwrap().trace_id, trace.trace_id);
            assert_eq!(state, None);
        }
        let (call, _) = call_headers(&tracing::Span::none(), None);
        assert!(parse(&call).is_some());
    }
}
