//! The adaptive bound on calls in flight (docs/adaptive-limit.md), whole-app,
//! read from the app's own upstream client, not the process-wide metric.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;

use phones_gateway::domain::Source;

use crate::support::*;
use crate::{PLAIN_CATEGORY, REAL};

/// A real-phone upstream serving `servers` calls at once in 20 ms, 429 beyond.
async fn capacity_fake(servers: Arc<AtomicUsize>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let inside = Arc::new(AtomicUsize::new(0));
    let router = Router::new().fallback(move || {
        let (servers, inside) = (servers.clone(), inside.clone());
        async move {
            if inside.fetch_add(1, Ordering::AcqRel) >= servers.load(Ordering::Acquire) {
                inside.fetch_sub(1, Ordering::AcqRel);
                return StatusCode::TOO_MANY_REQUESTS.into_response();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            inside.fetch_sub(1, Ordering::AcqRel);
            (
                [("content-type", "application/json")],
                format!(r#"{{"phone":"{REAL}"}}"#),
            )
                .into_response()
        }
    });
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

fn limit(app: &TestApp) -> usize {
    app.upstreams.limit(Source::RealPhone)
}

// Two workers: the load's clients, the app and the fakes share the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_comes_down_to_a_fixed_capacity_and_climbs_back_when_it_is_raised() {
    let servers = Arc::new(AtomicUsize::new(8));
    let url = capacity_fake(servers.clone()).await;
    // The breaker off: this upstream's 429s are load refusals, not failures.
    let app = Arc::new(
        TestApp::spawn_with(&format!(
            "[breaker]\nenabled = false\n[upstreams.real_phone]\nbase_url = \"{url}\"\n\
             max_in_flight = 256\nmax_in_flight_per_seller = 256\ntimeout_ms = 2000"
        ))
        .await,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(1));
    let clients: Vec<_> = (0..48)
        .map(|_| {
            let (app, stop, next) = (app.clone(), stop.clone(), next.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let id = next.fetch_add(1, Ordering::Relaxed) as u64;
                    app.phone(id, id, PLAIN_CATEGORY).await;
                }
            })
        })
        .collect();
    // 16 leaves room for a busy box, far below the configured 256.
    eventually(
        "the limit came down near 8",
        Duration::from_secs(10),
        || {
            let down = limit(&app) <= 16;
            async move { down }
        },
    )
    .await;
    servers.store(64, Ordering::Release);
    eventually("the limit climbed back", Duration::from_secs(15), || {
        let up = limit(&app) >= 32;
        async move { up }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
}
