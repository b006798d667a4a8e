//! Hand-made parts beside the crate a reader would expect, in one run on the
//! same cores, so their ratio is what counts (docs/design.md, "Hand-made parts"):
//!
//! - `durations/own` against `durations/metrics`: one request's duration sample
//!   into the fixed buckets of `http::api::durations`, against the `metrics`
//!   crate's histogram on the Prometheus recorder the service installs (the
//!   sample queued until an upkeep drains it; the bench drains every 4,096),
//!   through a handle registered once (`durations/metrics`) and looked up by its
//!   labels per sample as a request's route and status would be
//!   (`durations/metrics-labelled`);
//! - `traceparent/own` against `traceparent/propagator`: a caller's
//!   `traceparent` read from a request's headers by `telemetry::trace`, against
//!   `opentelemetry_sdk`'s `TraceContextPropagator` extracting a `Context`;
//!   and, printed first, the `tracestate` the propagator would forward for a
//!   few a caller may send (docs/tracing.md: forwarded as received);
//! - `batch/own` against `batch/value`: a 100-item batch body parsed by the
//!   batch visitors of `http::api::batch_items` (100 items kept, the rest counted),
//!   against serde's own `Vec<serde_json::Value>` read whole and counted after.
//!
//! `cargo bench --bench parts` prints the figures; under `cargo test` each body
//! runs once.

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use criterion::{Criterion, criterion_group, criterion_main};
use metrics_exporter_prometheus::PrometheusBuilder;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use phones_gateway::http::api::batch_items::BatchItems;
use phones_gateway::http::api::durations::Durations;
use phones_gateway::http::api::paths::PUBLIC_PHONE;
use phones_gateway::http::api::routes::{LABELS, RouteId};
use phones_gateway::telemetry::trace::context::parse_traceparent;
use serde::Deserialize;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn durations(c: &mut Criterion) {
    let route = RouteId::public(PUBLIC_PHONE).index();
    let elapsed = Duration::from_micros(180);
    let own = Durations::new(&LABELS);
    c.bench_function("durations/own", |b| {
        b.iter(|| own.record(black_box(route), black_box(200), black_box(elapsed)));
    });
    let recorder = PrometheusBuilder::new()
        .set_buckets(&phones_gateway::telemetry::DURATION_BOUNDS_NS.map(|ns| ns as f64 / 1e9))
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    let histogram = metrics::with_local_recorder(
        &recorder,
        || metrics::histogram!("bench_request_duration_seconds", "route" => "public_phone", "status" => "200"),
    );
    // As a request would record it: the series looked up by its labels in the
    // recorder's registry each time (the status is known only at the answer).
    c.bench_function("durations/metrics-labelled", |b| {
        metrics::with_local_recorder(&recorder, || {
            b.iter(|| {
                metrics::histogram!("bench_request_duration_seconds", "route" => black_box("public_phone"), "status" => black_box("200"))
                    .record(black_box(elapsed).as_secs_f64());
            });
        });
        handle.run_upkeep();
    });
    c.bench_function("durations/metrics", |b| {
        let mut n = 0u32;
        b.iter(|| {
            histogram.record(black_box(elapsed).as_secs_f64());
            n = n.wrapping_add(1);
            // The service drains every 5 s; draining often keeps the queue as
            // short as a busy replica's between upkeeps would be at most.
            if n % 4096 == 0 {
                handle.run_upkeep();
            }
        });
    });
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

fn traceparent(c: &mut Criterion) {
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", HeaderValue::from_static(TRACEPARENT));
    headers.insert("tracestate", HeaderValue::from_static("vendor=opaque"));
    c.bench_function("traceparent/own", |b| {
        b.iter(|| {
            let value = black_box(&headers).get("traceparent").unwrap();
            black_box(parse_traceparent(value.as_bytes()))
        });
    });
    let propagator = opentelemetry_sdk::propagation::TraceContextPropagator::new();
    for sent in [
        "vendor=opaque",
        "vendor=opaque,Bad Entry",
        "a=1 , b=2",
        "a=1,,b=2",
    ] {
        let mut with = headers.clone();
        with.insert("tracestate", HeaderValue::from_static(sent));
        let context = propagator.extract(&Headers(&with));
        let kept = context.span().span_context().trace_state().header();
        println!("tracestate/propagator {sent:?} -> {kept:?}");
    }
    c.bench_function("traceparent/propagator", |b| {
        b.iter(|| {
            let context = propagator.extract(&Headers(black_box(&headers)));
            black_box(context.span().span_context().is_valid())
        });
    });
}

#[derive(Deserialize)]
struct OwnBody {
    items: BatchItems,
}

#[derive(Deserialize)]
struct ValueBody {
    items: Vec<serde_json::Value>,
}

fn batch(c: &mut Criterion) {
    let items: Vec<String> = (1..=100)
        .map(|i| {
            format!(
                r#"{{"user_id":{i},"ad_id":{},"category_id":9,"phone":"+7916123{:04}"}}"#,
                1000 + i,
                i
            )
        })
        .collect();
    let body = format!(r#"{{"items":[{}]}}"#, items.join(","));
    c.bench_function("batch/own", |b| {
        b.iter(|| {
            let parsed: OwnBody = serde_json::from_slice(black_box(body.as_bytes())).unwrap();
            black_box(parsed.items.count)
        });
    });
    c.bench_function("batch/value", |b| {
        b.iter(|| {
            let parsed: ValueBody = serde_json::from_slice(black_box(body.as_bytes())).unwrap();
            black_box(parsed.items.len() <= 100)
        });
    });
}

criterion_group! {
    name = parts;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = durations, traceparent, batch
}
criterion_main!(parts);
