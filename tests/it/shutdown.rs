//! Graceful shutdown: readiness first, a pause, then drain with a hard deadline.

use std::time::{Duration, Instant};

use crate::support::{Reply, TestApp, eventually, read};
use crate::{PLAIN_CATEGORY, REAL};

#[tokio::test]
async fn shutdown_turns_readyz_503_then_drains_in_flight_requests() {
    let mut app = TestApp::spawn_with(
        "[server]\nshutdown_pause_ms = 1500\nrequest_deadline_ms = 10000\n[upstreams.real_phone]\ntimeout_ms = 5000",
    )
    .await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(2500));
    let in_flight = {
        let (public, http) = (app.public.clone(), app.http.clone());
        tokio::spawn(async move {
            let url =
                format!("{public}/v1/public-phone?user_id=1&ad_id=1&category_id={PLAIN_CATEGORY}");
            read(http.get(url).send().await.unwrap()).await
        })
    };
    eventually("the request in service", Duration::from_secs(10), || {
        let calls = app.real.calls();
        async move { calls == 1 }
    })
    .await;
    let stopped = app.shutdown();
    // During the pause: not ready, still serving.
    eventually(
        "readyz 503 after the signal",
        Duration::from_secs(1),
        || async { app.get_admin("/readyz").await.status == 503 },
    )
    .await;
    app.get_admin("/readyz").await.assert_problem(503);
    assert_eq!(app.get_admin("/healthz").await.status, 200);
    assert!(
        !in_flight.is_finished(),
        "the in-flight request is still in service"
    );
    in_flight.await.unwrap().assert_number(REAL, "real");
    stopped.await.unwrap().unwrap();
    assert!(
        app.http
            .get(format!("{}/healthz", app.admin))
            .send()
            .await
            .is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn the_drain_has_a_hard_deadline() {
    let mut app = TestApp::spawn_with(
        "[server]\ndrain_timeout_ms = 300\nrequest_deadline_ms = 20000\n[upstreams.real_phone]\ntimeout_ms = 10000",
    )
    .await;
    app.real.reply(Reply::Hang);
    let (public, http) = (app.public.clone(), app.http.clone());
    let _hung = tokio::spawn(async move {
        http.get(format!(
            "{public}/v1/public-phone?user_id=1&ad_id=1&category_id=1"
        ))
        .send()
        .await
    });
    // An idle keep-alive connection must not hold the drain open either.
    assert_eq!(app.get_admin("/healthz").await.status, 200);
    eventually("the request in service", Duration::from_secs(10), || {
        let calls = app.real.calls();
        async move { calls == 1 }
    })
    .await;
    let start = Instant::now();
    app.shutdown().await.unwrap().unwrap();
    // 300 ms of drain; the request would hold it 10 s. Room for busy cores.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}
