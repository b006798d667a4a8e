//! The hit path, in process: what one answered-from-cache request costs in time
//! and in allocations (the `-benchmem` of Rust: a counting global allocator).
//!
//! - `resolve/hit`: `Resolver::resolve` with every source fresh in the caches;
//! - `router/hit`: the whole public service as a listener runs it (`Front`, no
//!   sockets): request tracking, shedding, query parsing, resolve, JSON;
//! - `router/viewer`, `router/viewer-budgets`: `router/hit` with an
//!   `X-Viewer-Id` (one of 1,000, in turn), with the viewer budgets off and on
//!   (both budgets, never reached): what a viewer within budget pays for them;
//! - `router/hello`: a bare axum hello-world router, the baseline;
//! - `phone/parse`, `phone/format`: parsing and printing a number;
//! - `recorder/sample` (allocations only): a request's duration recorded in a
//!   histogram of the `metrics` recorder instead of `http::api::durations`,
//!   which queues the sample until an upkeep drains it (docs/design.md,
//!   "Hand-made parts").
//!
//! Before timing, each case is run 10,000 times under the counting allocator and
//! allocations and bytes per operation are printed.
//!
//! `HOT_PATH_TRACING` picks the subscriber (one per process, so one per run):
//! unset, none (the default, as the hit path is usually measured); `logs`, the
//! production JSON log at `info` (the request span is then built); a ratio such as `1.0`
//! or `0.01`, that log and the span export (docs/tracing.md) at that sample
//! ratio to a local OTLP/HTTP sink this bench runs on its own thread.
//! `router/hit-traced` is `router/hit` with a caller's `traceparent`.

#![allow(clippy::unwrap_used)]

use std::alloc::System;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use criterion::{Criterion, criterion_group, criterion_main};
use hyper::service::Service as _;
use phones_gateway::app::Parts;
use phones_gateway::cache::CacheKey;
use phones_gateway::config::Config;
use phones_gateway::domain::Phone;
use phones_gateway::domain::Source;
use phones_gateway::domain::StatusItem;
use phones_gateway::domain::{AdId, CategoryId, UserId};
use phones_gateway::http::server::front::Front;
use phones_gateway::resolve::{Request as Lookup, Resolver};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::ServiceExt;

// The allocator that counts (stats_alloc keeps the unsafe out of this crate).
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn per_op(name: &str, runs: u64, mut op: impl FnMut()) {
    op();
    let region = Region::new(GLOBAL);
    for _ in 0..runs {
        op();
    }
    let stats = region.change();
    println!(
        "allocations {name:<14} {:>6.2} allocs/op {:>8.1} bytes/op",
        (stats.allocations + stats.reallocations) as f64 / runs as f64,
        (stats.bytes_allocated + stats.bytes_reallocated.max(0) as usize) as f64 / runs as f64
    );
}

struct Fixture {
    resolver: Arc<Resolver>,
    router: Front,
    budgeted: Front,
    hello: axum::Router,
    request: Lookup,
}

/// A collector that accepts every export and discards it, on its own thread
/// and runtime (the bench's runtime only runs while a case is timed).
fn start_sink() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(format!("http://{}", listener.local_addr().unwrap()))
                .unwrap();
            let sink =
                axum::Router::new().route("/v1/traces", axum::routing::post(|| async { "" }));
            axum::serve(listener, sink).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// The subscriber `HOT_PATH_TRACING` asks for; the config overlay that goes with it.
fn tracing_setup() -> String {
    use phones_gateway::config::{LogConfig, LogFormat};
    let Ok(mode) = std::env::var("HOT_PATH_TRACING") else {
        return String::new();
    };
    let log = LogConfig {
        filter: "info".to_owned(),
        format: LogFormat::Json,
    };
    if mode == "logs" {
        phones_gateway::telemetry::init_logs(&log).unwrap();
        return String::new();
    }
    let ratio: f64 = mode.parse().expect("HOT_PATH_TRACING: logs or a ratio");
    let overlay = format!(
        "[tracing]\notlp_endpoint = \"{}\"\nsample_ratio = {ratio}",
        start_sink()
    );
    let config = Config::from_toml(&overlay).unwrap();
    // Leaked: the exporter runs for the whole process.
    std::mem::forget(
        phones_gateway::telemetry::init_logs_and_traces(&log, &config.tracing).unwrap(),
    );
    println!("tracing: export at sample ratio {ratio}");
    overlay
}

fn fixture() -> Fixture {
    // As the app: the Prometheus recorder first, so metrics cost what they do live.
    let _ = phones_gateway::telemetry::metrics_handle();
    // No reveal log (its buffer would grow without its flush); budgets no
    // viewer of the bench reaches (no exchange runs here).
    let overlay = "[reveals]\nenabled = false\n[rate_limit]\nper_viewer_per_minute = 65535\n\
                   per_viewer_per_day = 65535\n";
    let config = Config::from_toml(&format!("{overlay}{}", tracing_setup())).unwrap();
    let parts = Parts::build(&config);
    let (caches, status) = (&parts.caches, &parts.status);
    // Loaded: until it is, call tracking is unknown and nothing below it shows.
    status.mark_loaded();
    status.apply_changes(&[StatusItem {
        user_id: 42,
        enabled: true,
        version: 1,
    }
    .parse()
    .unwrap()]);
    let user = UserId::new(42).unwrap();
    let real = Phone::parse("+79161234567").unwrap();
    // Every source this request needs is fresh in the caches: anonymous (category
    // 9) has no number, call tracking maps the real number.
    let ad = CacheKey::ad(user, AdId::new(1001).unwrap());
    caches.phones[Source::Anonymous].insert(ad, None);
    caches.phones[Source::RealPhone].insert(ad, Some(real));
    caches.phones[Source::Calltracking].insert(
        CacheKey::real_phone(user, real),
        Phone::parse("+74951234567").ok(),
    );
    let resolver = parts.resolver.clone();
    let budgeted = parts.public_front(&config, None);
    let router = Parts {
        budgets: None,
        ..parts
    }
    .public_front(&config, None);
    let hello = axum::Router::new().route("/", axum::routing::get(|| async { "Hello, World!" }));
    let request = Lookup {
        user,
        ad: AdId::new(1001).unwrap(),
        category: CategoryId::new(9).unwrap(),
        phone: None,
    };
    Fixture {
        resolver,
        router,
        budgeted,
        hello,
        request,
    }
}

fn benches(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let f = runtime.block_on(async { fixture() });
    let uri = "/v1/public-phone?user_id=42&ad_id=1001&category_id=9";
    let hit = runtime
        .block_on(f.resolver.resolve(&f.request, None))
        .unwrap();
    assert_eq!(
        hit.phone.to_string(),
        "+74951234567",
        "the fixture is a hit on call tracking"
    );

    per_op("resolve/hit", 10_000, || {
        black_box(
            runtime
                .block_on(f.resolver.resolve(&f.request, None))
                .unwrap(),
        );
    });
    per_op("router/hit", 10_000, || {
        let request = Request::get(uri).body(Body::empty()).unwrap();
        black_box(runtime.block_on(f.router.call(request)).unwrap());
    });
    let viewers: Vec<String> = (0..1000).map(|i| format!("buyer-{i}")).collect();
    let mut turn = 0usize;
    let mut viewer_request = move || {
        turn = (turn + 1) % viewers.len();
        Request::get(uri)
            .header("x-viewer-id", viewers[turn].as_str())
            .body(Body::empty())
            .unwrap()
    };
    let answered = runtime.block_on(f.budgeted.call(viewer_request())).unwrap();
    assert_eq!(answered.status(), 200, "the viewer is within budget");
    per_op("router/viewer", 10_000, || {
        black_box(runtime.block_on(f.router.call(viewer_request())).unwrap());
    });
    per_op("router/viewer-budgets", 10_000, || {
        black_box(runtime.block_on(f.budgeted.call(viewer_request())).unwrap());
    });
    per_op("router/hello", 10_000, || {
        let request = Request::get("/").body(Body::empty()).unwrap();
        black_box(runtime.block_on(f.hello.clone().oneshot(request)).unwrap());
    });
    // No upkeep runs here: what each sample holds until one would.
    let recorded = metrics::histogram!("bench_request_duration_seconds", "route" => "/v1/public-phone", "status" => "200");
    per_op("recorder/sample", 100_000, || {
        recorded.record(black_box(0.00018));
    });
    per_op("phone/parse", 10_000, || {
        black_box(Phone::parse(black_box("+7 (916) 123-45-67")).unwrap());
    });

    c.bench_function("resolve/hit", |b| {
        b.iter(|| {
            runtime
                .block_on(f.resolver.resolve(black_box(&f.request), None))
                .unwrap()
        })
    });
    c.bench_function("router/hit", |b| {
        b.iter(|| {
            let request = Request::get(uri).body(Body::empty()).unwrap();
            runtime.block_on(f.router.call(request)).unwrap()
        })
    });
    c.bench_function("router/viewer", |b| {
        b.iter(|| runtime.block_on(f.router.call(viewer_request())).unwrap())
    });
    c.bench_function("router/viewer-budgets", |b| {
        b.iter(|| runtime.block_on(f.budgeted.call(viewer_request())).unwrap())
    });
    c.bench_function("router/hit-traced", |b| {
        b.iter(|| {
            let request = Request::get(uri)
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .body(Body::empty())
                .unwrap();
            runtime.block_on(f.router.call(request)).unwrap()
        })
    });
    c.bench_function("router/hello", |b| {
        b.iter(|| {
            let request = Request::get("/").body(Body::empty()).unwrap();
            runtime.block_on(f.hello.clone().oneshot(request)).unwrap()
        })
    });
    c.bench_function("phone/parse", |b| {
        b.iter(|| Phone::parse(black_box("+7 (916) 123-45-67")))
    });
    let phone = Phone::parse("+79161234567").unwrap();
    c.bench_function("phone/format", |b| b.iter(|| black_box(phone).to_string()));
}

criterion_group! {
    name = hot_path;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(hot_path);
