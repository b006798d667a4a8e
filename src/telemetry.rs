//! Logs and metrics plumbing: the tracing subscriber, the process-wide Prometheus
//! recorder, and the request-tracking middleware.
//!
//! Phone numbers never reach a log line or a label: code logs `phone.masked()`,
//! and `Phone`'s `Debug` is masked too.

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::resolve::Caches;
use crate::status::StatusService;

/// Installs the global subscriber: `RUST_LOG` if set, else `filter`.
///
/// # Errors
/// A filter that does not parse, or a subscriber already installed.
pub fn init_logs(filter: &str) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => EnvFilter::try_new(env)?,
        _ => EnvFilter::try_new(filter)?,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .try_init()
        .map_err(|e| anyhow::anyhow!(e))
}

/// The process-wide Prometheus recorder (the `metrics` facade is global; several
/// apps in one test process share it).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &[
                        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                        0.25, 0.3, 0.5, 1.0, 2.5,
                    ],
                )
                .map(PrometheusBuilder::build_recorder)
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; then ours renders
            // nothing, which is all we could do anyway.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Counts and times every request by matched route and status.
pub async fn track_request(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| match p.as_str() {
            "/v1/public-phone" => "/v1/public-phone",
            "/v1/public-phones/batch" => "/v1/public-phones/batch",
            "/admin/v1/calltracking/statuses" => "/admin/v1/calltracking/statuses",
            "/admin/v1/calltracking/statuses/{user_id}" => {
                "/admin/v1/calltracking/statuses/{user_id}"
            }
            "/admin/v1/cache/invalidate" => "/admin/v1/cache/invalidate",
            "/healthz" => "/healthz",
            "/readyz" => "/readyz",
            "/metrics" => "/metrics",
            _ => "other",
        });
    let start = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(
        "phones_gateway_http_request_duration_seconds",
        "route" => route, "status" => status
    )
    .record(start.elapsed().as_secs_f64());
    response
}

/// Gauges computed at scrape time.
pub fn record_gauges(status: &StatusService, caches: &Caches) {
    metrics::gauge!("phones_gateway_status_set_users").set(status.set().len() as f64);
    metrics::gauge!("phones_gateway_status_set_enabled").set(status.set().enabled_count() as f64);
    metrics::gauge!("phones_gateway_status_sync_lag_seconds")
        .set(status.sync_lag_ms() as f64 / 1000.0);
    for cache in [&caches.real_phone, &caches.anonymous, &caches.calltracking] {
        metrics::gauge!("phones_gateway_cache_entries", "cache" => cache.name())
            .set(cache.len() as f64);
    }
}
