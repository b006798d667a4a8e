//! The edges of the one promise (never a number the rules do not allow): a
//! replica that has not loaded its status set, snapshots that speak for users
//! they never listed, deadlines that follow the configured timeouts, and
//! upstream concurrency bounded whatever clients do.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::support::pg;
use crate::support::{Fake, Reply, TestApp, Upstream, eventually};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

const STATUSES: &str = "/admin/v1/calltracking/statuses";

#[tokio::test]
async fn a_replica_whose_status_set_is_not_loaded_never_shows_a_real_number() {
    let Some(db) = pg::cluster() else { return };
    let cluster = db.cluster.as_ref().unwrap();
    let first = TestApp::spawn_on(Some(&db.url), "").await;
    first.enable_calltracking(42, 1).await;
    drop(first);
    // PostgreSQL is down when this replica starts: it cannot load the set.
    cluster.stop_server().unwrap();
    let app = TestApp::start_on(Some(&db.url), "").await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.get_admin("/readyz").await.assert_problem(503);

    // Seller 42 has call tracking on; this replica cannot know: no real number,
    // for any seller, on any path. 503 with Retry-After instead.
    for user in [42, 43] {
        let answer = app.phone(user, 1, PLAIN_CATEGORY).await;
        answer.assert_problem(503);
        assert_eq!(answer.retry_after.as_deref(), Some("1"), "{answer:?}");
        let given = app
            .get_public(&format!(
                "/v1/public-phone?user_id={user}&ad_id=1&category_id={PLAIN_CATEGORY}&phone=%2B79161234567"
            ))
            .await;
        given.assert_problem(503);
        let head = app
            .http
            .head(format!(
                "{}/v1/public-phone?user_id={user}&ad_id=2&category_id={PLAIN_CATEGORY}",
                app.public
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(head.status(), 503);
    }
    let batch = app
        .post_public(
            "/v1/public-phones/batch",
            json!({ "items": [
                { "user_id": 42, "ad_id": 3, "category_id": PLAIN_CATEGORY },
                { "user_id": 42, "ad_id": 4, "category_id": ANON_CATEGORY },
            ]})
            .to_string(),
        )
        .await;
    assert_eq!(batch.status, 200, "{batch:?}");
    assert_eq!(
        batch.body["results"][0]["error"]["status"], 503,
        "{batch:?}"
    );
    // An anonymous number is above call tracking: it may be answered.
    assert_eq!(batch.body["results"][1]["kind"], "anonymous", "{batch:?}");
    app.phone(42, 5, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
    // Where the seller has no anonymous number, nothing below may be shown.
    app.anonymous.reply(Reply::NotFound);
    app.phone(42, 6, ANON_CATEGORY).await.assert_problem(503);

    // Once the set loads, the rules apply as usual.
    cluster.start_server().unwrap();
    app.wait_ready().await;
    app.phone(42, 7, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    app.phone(43, 7, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
}

/// PUT a snapshot at 100 listing only user 1, then a late delta for user 7.
async fn snapshot_then_late_delta(app: &TestApp) {
    let put = app
        .send_admin(
            Method::PUT,
            STATUSES,
            &json!({ "version": 100, "enabled_user_ids": [1] }),
        )
        .await;
    assert_eq!(put.status, 200, "{put:?}");
    let late = app
        .send_admin(
            Method::POST,
            STATUSES,
            &json!({ "items": [{ "user_id": 7, "enabled": true, "version": 50 }] }),
        )
        .await;
    assert_eq!(late.body, json!({ "applied": 0, "ignored": 1 }), "{late:?}");
}

async fn assert_status(app: &TestApp, user: u64, enabled: bool, version: u64) {
    let got = app.get_admin(&format!("{STATUSES}/{user}")).await;
    assert_eq!(
        got.body,
        json!({ "user_id": user, "enabled": enabled, "version": version }),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_snapshot_speaks_for_users_it_never_saw_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/floor.db", dir.path().display());
    let mut app = TestApp::spawn_on(Some(&url), "").await;
    snapshot_then_late_delta(&app).await;
    assert_status(&app, 7, false, 100).await;
    assert_status(&app, 1, true, 100).await;
    app.shutdown().await.unwrap().unwrap();

    let app = TestApp::spawn_on(Some(&url), "").await;
    assert_status(&app, 7, false, 100).await;
    let at_floor = json!({ "items": [{ "user_id": 8, "enabled": true, "version": 100 }] });
    let got = app.send_admin(Method::POST, STATUSES, &at_floor).await;
    assert_eq!(got.body, json!({ "applied": 0, "ignored": 1 }), "{got:?}");
    let above = json!({ "items": [{ "user_id": 8, "enabled": true, "version": 101 }] });
    let got = app.send_admin(Method::POST, STATUSES, &above).await;
    assert_eq!(got.body, json!({ "applied": 1, "ignored": 0 }), "{got:?}");
    assert_status(&app, 8, true, 101).await;
    // An older snapshot arriving late lowers nothing.
    let older = json!({ "version": 90, "enabled_user_ids": [7] });
    assert_eq!(
        app.send_admin(Method::PUT, STATUSES, &older).await.status,
        200
    );
    assert_status(&app, 7, false, 100).await;
    assert_status(&app, 9, false, 100).await;
}

#[tokio::test]
async fn every_replica_agrees_on_the_snapshot_floor_on_postgres() {
    let Some(db) = pg::database().await else {
        return;
    };
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    let b = TestApp::spawn_on(Some(&db.url), "").await;
    let put = a
        .send_admin(
            Method::PUT,
            STATUSES,
            &json!({ "version": 100, "enabled_user_ids": [1] }),
        )
        .await;
    assert_eq!(put.status, 200, "{put:?}");
    // The late delta reaches the other replica: it is ignored there too.
    let late = json!({ "items": [{ "user_id": 7, "enabled": true, "version": 50 }] });
    let got = b.send_admin(Method::POST, STATUSES, &late).await;
    assert_eq!(got.body, json!({ "applied": 0, "ignored": 1 }), "{got:?}");
    for app in [&a, &b] {
        eventually("the floor replicated", Duration::from_secs(5), || async {
            app.get_admin(&format!("{STATUSES}/7")).await.body["version"] == 100
        })
        .await;
        assert_status(app, 7, false, 100).await;
    }
    drop((a, b));
    let c = TestApp::spawn_on(Some(&db.url), "").await;
    assert_status(&c, 7, false, 100).await;
    assert_status(&c, 1, true, 100).await;
}

#[tokio::test]
async fn an_answer_within_its_configured_timeout_is_not_cut_short_by_the_deadline() {
    let app = TestApp::spawn_with("[upstreams.anonymous]\ntimeout_ms = 800").await;
    app.anonymous
        .reply_after(Reply::Phone(ANON), Duration::from_millis(600));
    app.phone(1, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
}

#[tokio::test]
async fn a_slow_real_then_calltracking_chain_within_its_timeouts_shows_calltracking() {
    let app = TestApp::spawn().await;
    app.enable_calltracking(42, 1).await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(250));
    app.calltracking
        .reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(250));
    app.phone(42, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
}

#[tokio::test]
async fn a_calltracking_upstream_that_hangs_at_the_end_of_the_chain_serves_its_stale_number() {
    // One-second TTLs so the cached numbers expire within the test.
    let app = TestApp::spawn_with(
        "[cache.real_phone]\nttl_s = 1\n[cache.calltracking]\nttl_s = 1\n\
         [upstreams.real_phone]\ntimeout_ms = 300\n[upstreams.calltracking]\ntimeout_ms = 300",
    )
    .await;
    app.enable_calltracking(42, 1).await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.phone(42, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // The real number comes late in its timeout, then call tracking hangs: the
    // request reaches the end of the chain with call tracking pending. Its stale
    // number is served, never the real one.
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(280));
    app.calltracking.reply(Reply::Hang);
    app.phone(42, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
}

#[tokio::test]
async fn abandoned_requests_cannot_push_an_upstream_past_its_bound() {
    let app = TestApp::spawn_with(
        "[upstreams.real_phone]\nmax_in_flight = 2\ntimeout_ms = 5000\n\
         [server]\nrequest_deadline_ms = 10000",
    )
    .await;
    app.real.reply(Reply::Hang);
    // Clients that ask and give up at once, each for another ad.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    for ad in 1..=2 {
        let url = format!(
            "{}/v1/public-phone?user_id=1&ad_id={ad}&category_id={PLAIN_CATEGORY}",
            app.public
        );
        let sent = impatient.get(url).send().await;
        assert!(sent.is_err(), "gave up: {:?}", sent.map(|r| r.status()));
    }
    eventually("two calls under way", Duration::from_secs(5), || async {
        app.real.calls() == 2
    })
    .await;
    // The fetches those clients left behind still hold both places: the next
    // requests do not call the upstream and fail at once (503, real being the
    // last source).
    for ad in 3..=6 {
        let start = Instant::now();
        app.phone(1, ad, PLAIN_CATEGORY).await.assert_problem(503);
        assert!(start.elapsed() < Duration::from_secs(3), "failed fast");
    }
    assert_eq!(
        app.real.calls(),
        2,
        "the upstream saw no more than its bound"
    );
    let metrics = app.get_admin("/metrics").await.text;
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "phones_gateway_upstream_requests_total{upstream=\"real_phone\",outcome=\"saturated\"}"
        )),
        "saturated calls are counted"
    );
}

#[tokio::test]
async fn dropping_a_running_app_stops_its_background_tasks() {
    let feed = crate::support::Fake::start(crate::support::Upstream::Calltracking).await;
    let dir = tempfile::tempdir().unwrap();
    let config = phones_gateway::config::Config::from_toml(&format!(
        "[database]\nurl = \"sqlite://{}/gw.db\"\n\
         [server]\npublic_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\n\
         [upstreams.calltracking]\nbase_url = \"{}\"\n\
         [upstreams.calltracking.status_feed]\nenabled = true\ninterval_ms = 20",
        dir.path().display(),
        feed.url
    ))
    .unwrap();
    let app = phones_gateway::app::App::build(config).await.unwrap();
    let running = tokio::spawn(app.run(std::future::pending()));
    eventually("the feed is polled", Duration::from_secs(5), || async {
        feed.feed_uris().len() > 2
    })
    .await;
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    // A poll already under way may still land; after that, nothing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let calls = feed.feed_uris().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        feed.feed_uris().len(),
        calls,
        "the feed loop outlived its app"
    );
}

/// Fake real-phone and call-tracking upstreams on a runtime of their own (a
/// thread of their own), so their delays stay exact while the test keeps the
/// app's runtime busy.
fn fakes_on_their_own_thread() -> (Fake, Fake) {
    let (sender, fakes) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let real = Fake::start(Upstream::RealPhone).await;
            let calltracking = Fake::start(Upstream::Calltracking).await;
            sender.send((real, calltracking)).unwrap();
            // Serves until the test binary exits.
            std::future::pending::<()>().await;
        });
    });
    fakes.recv().unwrap()
}

/// docs/rules.md#concurrency-and-the-deadline: the default deadline leaves the
/// chain room for its own scheduling. The app runs on this test's one thread,
/// which a task holds 12 ms at a time (a saturated replica); the upstreams run
/// elsewhere and answer in 280 ms, within their 300 ms timeouts. With the deadline
/// at the bare 600 ms sum, most of these requests were cut and showed the real
/// number.
#[tokio::test(flavor = "current_thread")]
async fn on_a_busy_worker_a_calltracking_answer_within_its_timeout_is_not_cut_by_the_default_deadline()
 {
    let (real, calltracking) = fakes_on_their_own_thread();
    let app = TestApp::spawn_with(&format!(
        "[upstreams.real_phone]\nbase_url = \"{}\"\n[upstreams.calltracking]\nbase_url = \"{}\"",
        real.url, calltracking.url
    ))
    .await;
    let users = 1..=8;
    for user in users.clone() {
        app.enable_calltracking(user, 1).await;
    }
    // Connections to both upstreams made before the worker is busy: connecting
    // under the hog costs the first calls a part of their own timeouts, which
    // is not what this test is about.
    real.reply(Reply::Phone(REAL));
    calltracking.reply(Reply::Phone(VIRTUAL));
    app.enable_calltracking(100, 1).await;
    app.phone(100, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    real.reply_after(Reply::Phone(REAL), Duration::from_millis(280));
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(280));
    let hog = tokio::spawn(async {
        loop {
            std::thread::sleep(Duration::from_millis(12));
            tokio::task::yield_now().await;
        }
    });
    let mut kinds = Vec::new();
    for user in users {
        let got = app.phone(user, 1, PLAIN_CATEGORY).await;
        assert_eq!(got.status, 200, "{got:?}");
        kinds.push(got.body["kind"].as_str().unwrap_or_default().to_owned());
    }
    hog.abort();
    assert!(kinds.iter().all(|k| k == "calltracking"), "{kinds:?}");
}
