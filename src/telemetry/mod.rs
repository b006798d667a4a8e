//! Logs, metrics and traces plumbing: the tracing subscriber ([`trace`]), the
//! Prometheus recorder, request ids. Phone numbers never reach a log line or a
//! label: code logs `phone.masked()`, and `Phone`'s `Debug` is masked too.

use std::future::Future;
use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{HeaderMap, HeaderValue};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

pub use crate::config::LogFormat;
use crate::config::{LogConfig, TracingConfig};

pub mod trace;

/// The request id's header: the caller's or ours, answered and forwarded.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

tokio::task_local! {
    static REQUEST_ID: HeaderValue;
}

/// The current request's id, for forwarding to upstreams.
pub fn current_request_id() -> Option<HeaderValue> {
    REQUEST_ID.try_with(HeaderValue::clone).ok()
}

/// Runs `future` as the request `id`: upstream calls it makes forward the id.
pub fn with_request_id<F: Future>(
    id: HeaderValue,
    future: F,
) -> tokio::task::futures::TaskLocalFuture<HeaderValue, F> {
    REQUEST_ID.scope(id, future)
}

/// Installs the global subscriber of `[log]` (`RUST_LOG` over `log.filter`).
pub fn init_logs(log: &LogConfig) -> anyhow::Result<()> {
    let builder = tracing_subscriber::fmt().with_env_filter(env_filter(&log.filter)?);
    match log.format {
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder.with_ansi(colour()).try_init(),
    }
    .map_err(|e| anyhow::anyhow!(e))
}

/// As [`init_logs`], plus the span export (returned) when `tracing.otlp_endpoint` is set.
pub fn init_logs_and_traces(
    log: &LogConfig,
    tracing: &TracingConfig,
) -> anyhow::Result<Option<trace::Export>> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    if !tracing.exports() {
        return init_logs(log).map(|()| None);
    }
    let export = trace::Export::new(tracing)?;
    // The filter is the log's alone: the exported spans have their own.
    let filter = env_filter(&log.filter)?;
    let logs = match log.format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(colour())
            .with_filter(filter)
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(logs)
        .with(export.layer())
        .try_init()
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok(Some(export))
}

/// Whether the text format colours its lines: only when stdout is a terminal.
fn colour() -> bool {
    use std::io::IsTerminal as _;
    std::io::stdout().is_terminal()
}

fn env_filter(filter: &str) -> anyhow::Result<EnvFilter> {
    Ok(match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => EnvFilter::try_new(env)?,
        _ => EnvFilter::try_new(filter)?,
    })
}

/// A request's id: the caller's `x-request-id` if it is short, visible ASCII
/// (kept as is: no copy), else sixteen hex digits we make (as the `Err` when
/// the header came more than once: the request is a 400).
pub fn request_id_of(headers: &HeaderMap) -> Result<HeaderValue, HeaderValue> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    static SEED: OnceLock<foldhash::fast::RandomState> = OnceLock::new();
    let mut values = headers.get_all(REQUEST_ID_HEADER).iter();
    let (given, repeated) = (values.next(), values.next().is_some());
    let given = given.filter(|v| {
        let v = v.as_bytes();
        !v.is_empty() && v.len() <= 128 && v.iter().all(u8::is_ascii_graphic)
    });
    match given {
        Some(id) if !repeated => return Ok(id.clone()),
        _ => {}
    }
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let id = SEED.get_or_init(Default::default).hash_one(n);
    let mut hex = [0u8; 16];
    for (i, byte) in hex.iter_mut().enumerate() {
        *byte = b"0123456789abcdef"[((id >> (60 - 4 * i)) & 0xf) as usize];
    }
    // Hex digits are always a valid header value; the fallback is never taken.
    let made = HeaderValue::from_bytes(&hex).unwrap_or(HeaderValue::from_static("0"));
    if repeated { Err(made) } else { Ok(made) }
}

/// Upper bounds of every `_seconds` histogram, in nanoseconds (`http::api::durations` too).
pub const DURATION_BOUNDS_NS: [u64; 15] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    300_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// The crate's version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit it was built from (`build.rs`), or "unknown" without a repository.
pub const COMMIT: &str = env!("PHONES_GATEWAY_COMMIT");

/// The process-wide Prometheus recorder (several apps in one test process share
/// it), with `phones_gateway_build_info{version, commit}` set to 1.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &DURATION_BOUNDS_NS.map(|ns| ns as f64 / 1e9),
                )
                .map(PrometheusBuilder::build_recorder)
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; then ours renders
            // nothing, which is all we could do anyway.
            let _ = metrics::set_global_recorder(recorder);
            metrics::gauge!("phones_gateway_build_info", "version" => VERSION, "commit" => COMMIT)
                .set(1.0);
            handle
        })
        .clone()
}

/// Appends a gauge family, one series per `(labels, value)`, to an app's own
/// `/metrics` text: not the shared recorder, so each app shows its own values.
pub fn write_gauge<'a>(
    out: &mut String,
    name: &str,
    series: impl IntoIterator<Item = (&'a [(&'a str, &'a str)], f64)>,
) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "# TYPE {name} gauge");
    for (labels, value) in series {
        out.push_str(name);
        if !labels.is_empty() {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            let _ = write!(out, "{{{}}}", labels.join(","));
        }
        let _ = writeln!(out, " {value}");
    }
}

/// Drains raw histogram samples into their buckets every 5 s, so a replica
/// nobody scrapes does not grow by every request's. Runs until aborted.
pub async fn metrics_upkeep() {
    let handle = metrics_handle();
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        handle.run_upkeep();
    }
}
