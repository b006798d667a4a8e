//! Overload (docs/rules.md "Other gates, before the rules", docs/runbook.md
//! "PhonesGatewayShedding"): cold admission and load shedding, and upstream
//! concurrency bounded whatever clients do. Viewer budgets: `budgets.rs`.

use std::time::{Duration, Instant};

use crate::support::child::Process;
use crate::support::paths::{BATCH, METRICS, READYZ, phone_path};
use crate::support::{Fake, Reply, TestApp, Upstream, eventually};
use crate::{PLAIN_CATEGORY, REAL};

#[tokio::test]
async fn saturation_sheds_at_once_while_the_admin_listener_answers() {
    let app = TestApp::spawn_with(
        "[server]\nmax_in_flight = 2\nrequest_deadline_ms = 10000\n[upstreams.real_phone]\ntimeout_ms = 5000",
    )
    .await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(3000));
    let slow: Vec<_> = (1..=2)
        .map(|user| app.phone_in_background(user, 1, PLAIN_CATEGORY))
        .collect();
    app.real
        .until_calls("both requests in service", 2, Duration::from_secs(10))
        .await;
    let start = Instant::now();
    let shed = app.phone(3, 1, PLAIN_CATEGORY).await;
    shed.assert_problem(503);
    assert!(shed.retry_after.is_some());
    // Queued, it would wait for a slot (about 3 s).
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "shed at once, not queued: {:?}",
        start.elapsed()
    );
    assert_eq!(app.get_admin(READYZ).await.status, 200);
    for request in slow {
        request.await.unwrap().assert_number(REAL, "real");
    }
    app.assert_phone(3, 1, PLAIN_CATEGORY, REAL, "real").await;
}

/// docs/adaptive-limit.md, "The batches' share": a batch's items hold at
/// most three of an upstream's four places, so a single lookup meanwhile
/// still finds the fourth (with all four taken it would be a 503).
#[tokio::test]
async fn a_batch_leaves_a_single_lookup_a_place() {
    let app = TestApp::spawn_with(
        "[server]\nrequest_deadline_ms = 10000\n[upstreams.real_phone]\ntimeout_ms = 5000\n\
         max_in_flight = 4\nadaptive_limit = false",
    )
    .await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(1500));
    let items: Vec<_> = (1..=8)
        .map(|user| serde_json::json!({"user_id": user, "ad_id": 1, "category_id": PLAIN_CATEGORY}))
        .collect();
    let batch = app.post_public(BATCH, serde_json::json!({ "items": items }).to_string());
    let single = async {
        eventually("the batch's calls", Duration::from_secs(10), || async {
            app.real.calls() >= 3
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let held = app.real.calls();
        (held, app.phone(100, 1, PLAIN_CATEGORY).await)
    };
    let (batch, (held, single)) = tokio::join!(batch, single);
    assert_eq!(batch.status, 200);
    assert_eq!(held, 3, "the batch's items held more than three places");
    single.assert_number(REAL, "real");
}

/// Cold admission (docs/caching.md#a-cold-replica): while ready work waits too
/// long (a task hogging this test's one thread), uncached requests are shed at
/// once and cached ones answered; when the pressure goes, uncached get in.
#[tokio::test]
async fn saturated_workers_shed_uncached_requests_and_keep_answering_cached_ones() {
    let app = TestApp::spawn_with("[server]\nmax_queue_delay_ms = 10").await;
    app.real.reply(Reply::Phone(REAL));
    // Start-up was busy work too: the share may still be climbing back.
    eventually("a first number cached", Duration::from_secs(10), || async {
        app.phone(1, 1, PLAIN_CATEGORY).await.status == 200
    })
    .await;
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let hog = tokio::spawn({
        let busy = busy.clone();
        async move {
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                // Busy time to the runtime, then the app's tasks run once.
                std::thread::sleep(Duration::from_millis(30));
                tokio::task::yield_now().await;
            }
        }
    });
    let mut user = 100;
    let mut shed = None;
    let start = Instant::now();
    while shed.is_none() && start.elapsed() < Duration::from_secs(10) {
        user += 1;
        let answer = app.phone(user, 1, PLAIN_CATEGORY).await;
        if answer.status == 503 {
            shed = Some(answer);
        } else {
            answer.assert_number(REAL, "real");
        }
    }
    let shed = shed.expect("an uncached request is shed while the workers are saturated");
    shed.assert_problem(503);
    assert!(shed.retry_after.is_some(), "a shed says when to retry");
    assert!(
        shed.body["detail"].as_str().unwrap().contains("overloaded"),
        "{}",
        shed.body
    );
    // Cached answers are never shed for CPU.
    for _ in 0..20 {
        app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    }
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    hog.await.unwrap();
    let calls = app.real.calls();
    eventually(
        "uncached requests let in again",
        Duration::from_secs(10),
        || {
            user += 1;
            let app = &app;
            let user = user;
            async move { app.phone(user, 1, PLAIN_CATEGORY).await.status == 200 }
        },
    )
    .await;
    assert!(app.real.calls() > calls);
}

/// Clients that give up at once leave their fetches holding the real phone's
/// two places: the next requests fail at once (503) without calling it, each
/// counted as `saturated` (on the gateway process's own /metrics).
#[tokio::test]
async fn abandoned_requests_cannot_push_an_upstream_past_its_bound() {
    const SATURATED: &str =
        "phones_gateway_upstream_requests_total{upstream=\"real_phone\",outcome=\"saturated\"}";
    let real = Fake::start(Upstream::RealPhone).await;
    real.reply(Reply::Hang);
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let app = Process::start_with(
        &url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
            ("UPSTREAMS__REAL_PHONE__MAX_IN_FLIGHT", "2"),
            ("UPSTREAMS__REAL_PHONE__TIMEOUT_MS", "5000"),
            ("SERVER__REQUEST_DEADLINE_MS", "10000"),
        ],
    )
    .await;
    let saturated = || async {
        let text = app.get_admin(METRICS).await.text;
        crate::support::series_value(&text, SATURATED).unwrap_or(0.0)
    };
    assert_eq!(saturated().await, 0.0);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    // Another seller each: one seller alone meets its own bound first.
    for ad in 1..=2 {
        let url = format!("{}{}", app.public, phone_path(ad, ad, PLAIN_CATEGORY));
        let sent = impatient.get(url).send().await;
        assert!(sent.is_err(), "gave up: {:?}", sent.map(|r| r.status()));
    }
    eventually("two calls under way", Duration::from_secs(5), || async {
        real.calls() == 2
    })
    .await;
    // The abandoned fetches hold both places: the next requests fail at once.
    for ad in 3..=6 {
        let start = Instant::now();
        app.get_public_with(&phone_path(ad, ad, PLAIN_CATEGORY), &[])
            .await
            .assert_problem(503);
        assert!(start.elapsed() < Duration::from_secs(3), "failed fast");
    }
    assert_eq!(real.calls(), 2, "the upstream saw no more than its bound");
    assert_eq!(
        saturated().await,
        4.0,
        "each refused call counted saturated"
    );
    assert!(real.unexpected().is_empty(), "{:?}", real.unexpected());
}
