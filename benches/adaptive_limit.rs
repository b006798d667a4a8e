//! The adaptive bound on calls in flight (`upstream::limit`) against a fake
//! upstream of fixed capacity: it serves `capacity` calls at once in 20 ms each,
//! queues as many more (a queued call waits for a server, so its latency
//! climbs), and answers 429 beyond. The real client (`Upstreams::real_phone`,
//! breaker off) is sent an open-model load of twice what the upstream can
//! serve, on a fixed schedule, with the adaptive bound on and off. Prints per
//! run: how long the limit took to come within twice the capacity, the limit
//! after that (min/mean/max), goodput (answers per second against the
//! capacity's), the upstream's 429s and the gateway's own refusals, and the
//! accepted calls' latency p50/p99/max. Halfway through, the capacity doubles
//! (the limit must climb back). `cargo bench --bench adaptive_limit`; under
//! `cargo test` a short run that asserts the limit came down and goodput held.

#![allow(clippy::unwrap_used)]
// A bench: it measures wall time.
#![allow(clippy::disallowed_types)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use phones_gateway::config::Config;
use phones_gateway::domain::{AdId, Source, UserId};
use phones_gateway::upstream::{UpstreamError, Upstreams};

const SERVICE: Duration = Duration::from_millis(20);

struct Capacity {
    servers: AtomicUsize,
    /// Calls being served or queued.
    inside: AtomicUsize,
    served: AtomicU64,
}

async fn serve(capacity: Arc<Capacity>) -> axum::response::Response {
    let servers = capacity.servers.load(Ordering::Acquire);
    let inside = capacity.inside.fetch_add(1, Ordering::AcqRel);
    if inside >= 2 * servers {
        capacity.inside.fetch_sub(1, Ordering::AcqRel);
        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response();
    }
    // Served in turn: each call's wait is the calls ahead of it over the servers.
    let ahead = inside / servers;
    tokio::time::sleep(SERVICE * (ahead as u32 + 1)).await;
    capacity.inside.fetch_sub(1, Ordering::AcqRel);
    capacity.served.fetch_add(1, Ordering::Relaxed);
    (
        [("content-type", "application/json")],
        r#"{"phone":"+79161234567"}"#,
    )
        .into_response()
}

struct Run {
    ok: u64,
    refused_upstream: u64,
    refused_gateway: u64,
    other: u64,
    latencies: Vec<Duration>,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

async fn run(adaptive: bool, capacity: usize, seconds: f64) -> (String, f64, f64) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let cap = Arc::new(Capacity {
        servers: AtomicUsize::new(capacity),
        inside: AtomicUsize::new(0),
        served: AtomicU64::new(0),
    });
    let router = Router::new().fallback({
        let cap = cap.clone();
        move || serve(cap.clone())
    });
    tokio::spawn(async move { axum::serve(listener, router).await });
    let config = Config::from_toml(&format!(
        "[breaker]\nenabled = false\n[upstreams.real_phone]\nbase_url = \"{url}\"\n\
         max_in_flight = 1024\nmax_in_flight_per_seller = 1024\nadaptive_limit = {adaptive}\n"
    ))
    .unwrap();
    let upstreams = Arc::new(Upstreams::new(
        &config.upstreams,
        config.breaker,
        config.server.max_in_flight,
    ));
    // Twice what the upstream serves at its first capacity.
    let rate = 2.0 * capacity as f64 / SERVICE.as_secs_f64();
    let total = (rate * seconds) as u64;
    let raise_at = seconds / 2.0;
    let start = Instant::now();
    let limits = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler = tokio::spawn({
        let (upstreams, limits) = (upstreams.clone(), limits.clone());
        async move {
            loop {
                let t = start.elapsed().as_secs_f64();
                limits
                    .lock()
                    .unwrap()
                    .push((t, upstreams.limit(Source::RealPhone)));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let mut calls = Vec::new();
    let mut raised = false;
    for i in 0..total {
        let at = Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until((start + at).into()).await;
        if !raised && at.as_secs_f64() >= raise_at {
            cap.servers.store(2 * capacity, Ordering::Release);
            raised = true;
        }
        let upstreams = upstreams.clone();
        calls.push(tokio::spawn(async move {
            let sent = Instant::now();
            let user = UserId::new(1 + i).unwrap();
            let result = upstreams
                .real_phone(user, AdId::new(1 + i).unwrap(), Default::default())
                .await;
            (at.as_secs_f64(), result, sent.elapsed())
        }));
    }
    let mut before = Run {
        ok: 0,
        refused_upstream: 0,
        refused_gateway: 0,
        other: 0,
        latencies: Vec::new(),
    };
    let mut after = Run {
        ok: 0,
        refused_upstream: 0,
        refused_gateway: 0,
        other: 0,
        latencies: Vec::new(),
    };
    for call in calls {
        let (at, result, took) = call.await.unwrap();
        let phase = if at < raise_at {
            &mut before
        } else {
            &mut after
        };
        match result {
            Ok(_) => {
                phase.ok += 1;
                phase.latencies.push(took);
            }
            Err(UpstreamError::LoadRefused(_)) => phase.refused_upstream += 1,
            Err(UpstreamError::Saturated) => phase.refused_gateway += 1,
            Err(_) => phase.other += 1,
        }
    }
    sampler.abort();
    let limits = limits.lock().unwrap().clone();
    let converged = limits
        .iter()
        .find(|(_, l)| *l <= 2 * capacity)
        .map_or(f64::NAN, |(t, _)| *t);
    let window = |from: f64, to: f64| {
        let l: Vec<usize> = limits
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, l)| *l)
            .collect();
        let mean = l.iter().sum::<usize>() as f64 / l.len().max(1) as f64;
        (
            l.iter().min().copied().unwrap_or(0),
            mean,
            l.iter().max().copied().unwrap_or(0),
        )
    };
    let mut out = format!(
        "adaptive_limit={adaptive} capacity={capacity} then {} at {raise_at:.1}s, \
         offered {rate:.0}/s for {seconds:.1}s\n  limit within 2x capacity after {:.0} ms\n",
        2 * capacity,
        converged * 1000.0
    );
    let mut goodputs = (0.0, 0.0);
    for (name, phase, from, to, cap_now) in [
        (
            "before the raise",
            &mut before,
            converged.min(raise_at),
            raise_at,
            capacity,
        ),
        (
            "after the raise",
            &mut after,
            raise_at,
            seconds,
            2 * capacity,
        ),
    ] {
        phase.latencies.sort();
        let (lo, mean, hi) = window(from, to);
        let secs = if name.starts_with("before") {
            raise_at
        } else {
            seconds - raise_at
        };
        let served = phase.ok as f64 / secs;
        let can = cap_now as f64 / SERVICE.as_secs_f64();
        if name.starts_with("before") {
            goodputs.0 = served / can;
        } else {
            goodputs.1 = served / can;
        }
        out += &format!(
            "  {name}: limit min/mean/max {lo}/{mean:.1}/{hi}; goodput {served:.0}/s of {can:.0}/s ({:.0}%); \
             upstream 429s {}, gateway refusals {}, other {}; accepted p50/p99/max {:.1}/{:.1}/{:.1} ms\n",
            100.0 * served / can,
            phase.refused_upstream,
            phase.refused_gateway,
            phase.other,
            pct(&phase.latencies, 0.5),
            pct(&phase.latencies, 0.99),
            pct(&phase.latencies, 1.0),
        );
    }
    (out, goodputs.0, converged)
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if bench {
            for capacity in [8, 16] {
                for adaptive in [true, false] {
                    let (out, _, _) = run(adaptive, capacity, 6.0).await;
                    println!("{out}");
                }
            }
        } else {
            let (out, goodput, converged) = run(true, 8, 1.0).await;
            println!("{out}");
            assert!(converged < 0.5, "the limit did not come down: {out}");
            assert!(goodput > 0.5, "goodput collapsed: {out}");
        }
    });
}
