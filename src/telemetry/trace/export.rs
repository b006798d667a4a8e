//! The OpenTelemetry export of spans when `tracing.otlp_endpoint` is set
//! (docs/tracing.md): the per-request sampling ([`sampled`]), the exported spans
//! (callsites with [`EXPORTED_FIELD`]) and [`Export`], owned by `main`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::HeaderMap;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
};
use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{RngCore as _, SeedableRng as _};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::context::{EXPORTED_FIELD, current_is_exported, parse_traceparent, traceparent_of};
use crate::config::TracingConfig;
use crate::domain::wall_clock::Stopwatch;

const SERVICE_NAME: &str = "phones-gateway";

/// Whether a request with these headers is recorded, export on: a valid
/// `traceparent` decides by its sampled flag; otherwise a draw at `ratio`.
pub fn sampled(headers: &HeaderMap, ratio: f64) -> bool {
    if let Some(parent) = traceparent_of(headers).and_then(|v| parse_traceparent(v.as_bytes())) {
        return parent.sampled;
    }
    if ratio >= 1.0 {
        return true;
    }
    // A mixed counter: uniform enough to sample by, and no system call per
    // request. The seed is drawn once per process.
    use std::hash::BuildHasher;
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| foldhash::fast::RandomState::default().hash_one(0u64));
    let draw = share_draw(seed, SEQUENCE.fetch_add(1, Ordering::Relaxed));
    (draw as f64) < ratio * (u64::MAX as f64)
}

/// The `sequence`th draw of a process seeded with `seed`: SplitMix64's output
/// `sequence` steps past `seed`, which spreads consecutive counters over the
/// whole range whatever the seed (a general-purpose hasher does not promise it).
fn share_draw(seed: u64, sequence: u64) -> u64 {
    // SplitMix64's step (its "gamma", 2^64 over the golden ratio), which
    // rand_xoshiro keeps private.
    const STEP: u64 = 0x9E37_79B9_7F4A_7C15;
    SplitMix64::seed_from_u64(seed.wrapping_add(sequence.wrapping_mul(STEP))).next_u64()
}

/// An upstream call's span: exported when the current span is an exported request's.
pub fn upstream_span(upstream: &'static str) -> tracing::Span {
    if current_is_exported() {
        tracing::debug_span!(
            target: "phones_gateway::upstream",
            "upstream",
            upstream,
            otel.kind = "client",
            http.response.status_code = tracing::field::Empty,
        )
    } else {
        tracing::debug_span!(target: "phones_gateway::upstream", "upstream", upstream)
    }
}

/// Adds an event to the current span when it is exported, else nothing. Names,
/// keys and values are fixed words: never a number from a request or upstream.
pub fn event(name: &'static str, attributes: &[(&'static str, &'static str)]) {
    if !current_is_exported() {
        return;
    }
    tracing::Span::current().add_event(
        name,
        attributes
            .iter()
            .map(|&(key, value)| opentelemetry::KeyValue::new(key, value))
            .collect(),
    );
}

/// The tracer provider behind the export layer. Dropping it flushes and shuts it
/// down, so it has one owner (`main`) and is not `Clone`.
#[derive(Debug)]
pub struct Export {
    provider: SdkTracerProvider,
}

impl Export {
    /// Builds the exporter and its batch processor (its own thread).
    pub fn new(config: &TracingConfig) -> anyhow::Result<Self> {
        use opentelemetry_otlp::WithExportConfig as _;
        let endpoint = format!("{}/v1/traces", config.otlp_endpoint.trim_end_matches('/'));
        let otlp = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()?;
        let processor = BatchSpanProcessor::builder(LoggedFailures::new(otlp)).build();
        // Only sampled requests get exported spans ([`sampled`] decided), so
        // every span the SDK sees is recorded.
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
            .with_resource(
                opentelemetry_sdk::Resource::builder_empty()
                    .with_service_name(SERVICE_NAME)
                    .build(),
            )
            .build();
        Ok(Export { provider })
    }

    /// The layer recording the exported spans and no event.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(SERVICE_NAME))
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            // Nothing reads OpenTelemetry's current context (ids come from the
            // spans themselves): not attaching it saves work on every poll.
            .with_context_activation(false)
            .with_filter(ExportedOnly)
    }
}

impl Drop for Export {
    /// Exports what is buffered and stops the batch thread. Blocks up to the
    /// export timeout: drop it off the async workers, as `main` does.
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "flushing the last spans failed");
        }
    }
}

/// The export layer's filter: this crate's spans with [`EXPORTED_FIELD`], per callsite.
struct ExportedOnly;

impl ExportedOnly {
    fn wants(meta: &tracing::Metadata<'_>) -> bool {
        meta.is_span()
            && meta.target().starts_with("phones_gateway")
            && meta.fields().field(EXPORTED_FIELD).is_some()
    }
}

impl<S> tracing_subscriber::layer::Filter<S> for ExportedOnly {
    fn enabled(
        &self,
        meta: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        Self::wants(meta)
    }

    fn callsite_enabled(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if Self::wants(meta) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
}

/// One export's limit: the batch thread waits no longer for the collector.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Export failures are logged at most this often (and always counted).
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The OTLP exporter, its failures counted and logged at most once a minute.
#[derive(Debug)]
struct LoggedFailures<E> {
    inner: E,
    /// Wall time: called on the SDK's export thread, outside the runtime.
    last_logged: std::sync::Mutex<Option<Stopwatch>>,
}

impl<E> LoggedFailures<E> {
    fn new(inner: E) -> Self {
        LoggedFailures {
            inner,
            last_logged: std::sync::Mutex::new(None),
        }
    }

    fn failed(&self, spans: usize, error: &dyn std::fmt::Display) {
        metrics::counter!("phones_gateway_trace_export_failures_total").increment(1);
        let mut last = self
            .last_logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_none_or(|at| at.elapsed() >= FAILURE_LOG_INTERVAL) {
            *last = Some(Stopwatch::start());
            tracing::warn!(spans, %error, "exporting spans failed (logged at most once a minute)");
        }
    }
}

impl<E: SpanExporter> SpanExporter for LoggedFailures<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            self.failed(spans, error);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::TRACEPARENT;
    use super::*;
    use axum::http::HeaderValue;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// Whatever the process's seed, consecutive draws give the ratio asked for.
    #[test]
    fn every_seed_samples_its_share() {
        let seeds = (0..200u64)
            .map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D))
            .chain([u64::MAX, 1 << 63, 0x8000_0000]);
        for seed in seeds {
            let share = |ratio: f64| {
                (0..10_000u64)
                    .filter(|&n| (share_draw(seed, n) as f64) < ratio * (u64::MAX as f64))
                    .count()
            };
            assert!((4_500..5_500).contains(&share(0.5)), "seed {seed:#x}");
            assert!((800..1_200).contains(&share(0.1)), "seed {seed:#x}");
        }
    }

    #[test]
    fn the_callers_flag_decides_sampling_else_the_ratio() {
        let mut headers = HeaderMap::new();
        assert!(!sampled(&headers, 0.0));
        assert!(sampled(&headers, 1.0));
        let half = (0..10_000).filter(|_| sampled(&headers, 0.5)).count();
        assert!((4_500..5_500).contains(&half), "{half}");
        let tenth = (0..10_000).filter(|_| sampled(&headers, 0.1)).count();
        assert!((800..1_200).contains(&tenth), "{tenth}");
        headers.insert(TRACEPARENT, HeaderValue::from_static(VALID));
        assert!(sampled(&headers, 0.0), "the caller sampled it");
        let unsampled = VALID.replace("-01", "-00");
        headers.insert(TRACEPARENT, HeaderValue::from_str(&unsampled).unwrap());
        assert!(!sampled(&headers, 1.0), "the caller did not");
        headers.insert(TRACEPARENT, HeaderValue::from_static("00-bad"));
        let by_the_ratio = sampled(&headers, 1.0) && !sampled(&headers, 0.0);
        assert!(by_the_ratio, "invalid: the ratio");
        // Two, each valid and sampled: invalid, so the ratio decides.
        headers.insert(TRACEPARENT, HeaderValue::from_static(VALID));
        headers.append(TRACEPARENT, HeaderValue::from_static(VALID));
        assert!(!sampled(&headers, 0.0), "two are invalid");
    }

    #[derive(Debug)]
    struct Refusing;

    impl SpanExporter for Refusing {
        async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
            Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                "collector down".into(),
            ))
        }
    }

    #[tokio::test]
    async fn export_failures_are_returned_and_logged_at_most_once_a_minute() {
        let exporter = LoggedFailures::new(Refusing);
        assert!(exporter.export(Vec::new()).await.is_err());
        let first = exporter.last_logged.lock().unwrap().expect("logged");
        assert!(exporter.export(Vec::new()).await.is_err());
        let last = *exporter.last_logged.lock().unwrap();
        let not_logged = "the second failure within the minute is not logged";
        assert_eq!(last, Some(first), "{not_logged}");
    }
}
