//! docs/rules.md: which number a buyer sees. The selection matrix, fail closed
//! and fall through, the deadline, the status set not yet loaded, breakers,
//! undecided sources, and what counts as a failed source (the upstream client
//! against a raw HTTP/1.1 server, `support::raw`).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;

use crate::support::child::Spawned;
use crate::support::paths::{BATCH, READYZ, STATUSES};
use crate::support::{Fake, RawReply, RawServer, Reply, TestApp, Upstream, eventually, pg, read};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

/// Every combination of applicable sources and their answers, a row a case;
/// then the status, number and kind the buyer gets.
#[tokio::test]
#[allow(clippy::type_complexity)] // a table reads best as tuples
async fn the_selection_matrix() {
    use Reply::{NotFound, Phone, Status};
    #[rustfmt::skip]
    let cases: &[(bool, Reply, bool, Reply, Reply, u16, &str, &str)] = &[
        // anon? anonymous     ct on?  calltracking     real          code  number    kind
        (true,   Phone(ANON),  true,   Phone(VIRTUAL),  Phone(REAL),  200,  ANON,     "anonymous"),
        (true,   NotFound,     true,   Phone(VIRTUAL),  Phone(REAL),  200,  VIRTUAL,  "calltracking"),
        (true,   NotFound,     false,  Phone(VIRTUAL),  Phone(REAL),  200,  REAL,     "real"),
        (false,  Phone(ANON),  true,   Phone(VIRTUAL),  Phone(REAL),  200,  VIRTUAL,  "calltracking"),
        (false,  Phone(ANON),  false,  Phone(VIRTUAL),  Phone(REAL),  200,  REAL,     "real"),
        (false,  Phone(ANON),  true,   NotFound,        Phone(REAL),  200,  REAL,     "real"),
        (true,   NotFound,     true,   NotFound,        NotFound,     404,  "",       ""),
        (false,  NotFound,     false,  NotFound,        NotFound,     404,  "",       ""),
        (true,   Phone(ANON),  false,  NotFound,        NotFound,     200,  ANON,     "anonymous"),
        (true,   Status(500),  true,   Phone(VIRTUAL),  Phone(REAL),  503,  "",       ""),
        (false,  Status(500),  false,  NotFound,        Phone(REAL),  200,  REAL,     "real"),
        (false,  NotFound,     true,   Status(500),     Phone(REAL),  200,  REAL,     "real"),
        (false,  NotFound,     true,   Phone(VIRTUAL),  Status(500),  503,  "",       ""),
        (false,  NotFound,     false,  NotFound,        Status(502),  503,  "",       ""),
        (true,   NotFound,     true,   Status(500),     NotFound,     404,  "",       ""),
    ];
    let app = TestApp::spawn().await;
    for (i, (anon_applies, anon, ct_on, ct, real, status, phone, kind)) in cases.iter().enumerate()
    {
        let user = 1000 + i as u64;
        app.anonymous.reply(anon.clone());
        app.calltracking.reply(ct.clone());
        app.real.reply(real.clone());
        if *ct_on {
            app.enable_calltracking(user, 1).await;
        }
        let category = if *anon_applies {
            ANON_CATEGORY
        } else {
            PLAIN_CATEGORY
        };
        let got = app.phone(user, 1, category).await;
        if *status == 200 {
            got.assert_number(phone, kind);
            assert_eq!(got.body["user_id"], user, "case {i}");
            assert_eq!(got.body["ad_id"], 1, "case {i}");
        } else {
            got.assert_problem(*status);
            assert!(!got.text.contains("+7"), "case {i} leaks a number: {got:?}");
        }
    }
}

#[tokio::test]
async fn a_given_phone_saves_the_real_phone_call_and_feeds_calltracking() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Status(500));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.enable_calltracking(7, 1).await;
    let got = app
        .get_public(
            "/v1/public-phone?user_id=7&ad_id=1&category_id=1&phone=%2B7%20(916)%20123-45-67",
        )
        .await;
    got.assert_number(VIRTUAL, "calltracking");
    assert_eq!(app.real.calls(), 0);
    assert_eq!(
        app.calltracking.uris(),
        ["/v1/virtual-numbers?user_id=7&phone=%2B79161234567"]
    );

    let got = app
        .get_public("/v1/public-phone?user_id=8&ad_id=1&category_id=1&phone=%2B7-916-123-45-67")
        .await;
    got.assert_number(REAL, "real");
    assert_eq!(app.real.calls(), 0);
}

#[tokio::test]
async fn upstream_answers_with_separators_are_normalised_and_bad_ones_are_failures() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone("+7 (916) 123-45-67"));
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    app.real.reply(Reply::Phone("89161234567"));
    app.phone(2, 1, PLAIN_CATEGORY).await.assert_problem(503);
}

#[tokio::test]
async fn anonymous_upstream_hang_answers_503_without_revealing() {
    // A far deadline: only the anonymous 300 ms timeout can end the wait.
    let app = TestApp::spawn_with("[server]\nrequest_deadline_ms = 8000").await;
    app.anonymous.reply(Reply::Hang);
    app.real.reply(Reply::Phone(REAL));
    let start = Instant::now();
    let got = app.phone(1, 1, ANON_CATEGORY).await;
    got.assert_problem(503);
    assert!(got.retry_after.is_some(), "{got:?}");
    assert!(!got.text.contains(REAL));
    // Bounded by the anonymous timeout, not the hang nor the 8 s deadline.
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

#[tokio::test]
async fn anonymous_upstream_garbage_or_500_answers_503() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    for (user, reply) in [
        (1, Reply::Garbage),
        (2, Reply::Status(500)),
        (3, Reply::Status(429)),
        (4, Reply::Phone("not a phone")),
    ] {
        app.anonymous.reply(reply.clone());
        let got = app.phone(user, 1, ANON_CATEGORY).await;
        got.assert_problem(503);
        assert!(!got.text.contains(REAL), "{reply:?}: {got:?}");
    }
}

#[tokio::test]
async fn calltracking_failure_falls_through_to_the_real_number() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.enable_calltracking(5, 1).await;
    for (ad, reply) in [
        (1, Reply::Hang),
        (2, Reply::Garbage),
        (3, Reply::Status(503)),
    ] {
        app.calltracking.reply(reply);
        app.assert_phone(5, ad, PLAIN_CATEGORY, REAL, "real").await;
    }
}

#[tokio::test]
async fn fail_closed_and_order_are_configurable() {
    let app = TestApp::spawn_with(
        r#"
        [upstreams.calltracking]
        on_error = "fail_closed"
        [selection]
        order = ["calltracking", "real", "anonymous"]
        "#,
    )
    .await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.calltracking.reply(Reply::Status(500));
    app.enable_calltracking(3, 1).await;
    app.phone(3, 1, ANON_CATEGORY).await.assert_problem(503);
    // Not in the set: real comes before anonymous in this order.
    app.assert_phone(4, 1, ANON_CATEGORY, REAL, "real").await;
}

#[tokio::test]
async fn cold_latency_is_the_max_of_independent_calls_not_their_sum() {
    let app = TestApp::spawn_with(
        r#"
        [server]
        request_deadline_ms = 10000
        [upstreams.real_phone]
        timeout_ms = 2000
        [upstreams.anonymous]
        timeout_ms = 2000
        [upstreams.calltracking]
        timeout_ms = 2000
        "#,
    )
    .await;
    app.enable_calltracking(9, 1).await;
    // anonymous 800 ms in parallel with real 600 then calltracking 300:
    // max(800, 900) = 900 ms, not the sum, 1700 ms.
    app.anonymous
        .reply_after(Reply::NotFound, Duration::from_millis(800));
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(600));
    app.calltracking
        .reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(300));
    let start = Instant::now();
    app.assert_phone(9, 1, ANON_CATEGORY, VIRTUAL, "calltracking")
        .await;
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(
        took < Duration::from_millis(1500),
        "took {took:?}: calls ran one after another"
    );
}

#[tokio::test]
async fn a_decided_request_does_not_wait_for_calls_that_cannot_change_it() {
    let app = TestApp::spawn_with(
        "[server]\nrequest_deadline_ms = 20000\n[upstreams.real_phone]\ntimeout_ms = 15000",
    )
    .await;
    app.anonymous
        .reply_after(Reply::Phone(ANON), Duration::from_millis(20));
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(10_000));
    let start = Instant::now();
    app.assert_phone(1, 1, ANON_CATEGORY, ANON, "anonymous")
        .await;
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_lower_source_is_not_revealed_while_a_higher_one_is_pending() {
    let app = TestApp::spawn_with(
        "[server]\nrequest_deadline_ms = 10000\n[upstreams.anonymous]\ntimeout_ms = 2000",
    )
    .await;
    app.anonymous
        .reply_after(Reply::Phone(ANON), Duration::from_millis(300));
    app.real.reply(Reply::Phone(REAL));
    let start = Instant::now();
    app.assert_phone(1, 1, ANON_CATEGORY, ANON, "anonymous")
        .await;
    assert!(start.elapsed() >= Duration::from_millis(300));
}

/// docs/api.md: output is E.164 also when an upstream answered with
/// separators.
#[tokio::test]
async fn anonymous_and_calltracking_numbers_are_normalised() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone("+7 (800) 111-22-33"));
    app.calltracking.reply(Reply::Phone("+7 495 123-45-67"));
    app.enable_calltracking(2, 1).await;
    app.assert_phone(1, 1, ANON_CATEGORY, ANON, "anonymous")
        .await;
    app.assert_phone(2, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
}

/// A base URL where nothing listens: a port bound and given back.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

/// docs/rules.md: a refused connection is an upstream failure.
#[tokio::test]
async fn refused_connections_are_upstream_failures() {
    let app = TestApp::spawn_with(&format!(
        "[upstreams.real_phone]\nbase_url = \"{}\"",
        closed_port_url()
    ))
    .await;
    let got = app.phone(1, 1, PLAIN_CATEGORY).await;
    got.assert_problem(503);
    assert!(got.retry_after.is_some(), "{got:?}");

    let app = TestApp::spawn_with(&format!(
        "[upstreams.calltracking]\nbase_url = \"{}\"",
        closed_port_url()
    ))
    .await;
    app.real.reply(Reply::Phone(REAL));
    app.enable_calltracking(1, 1).await;
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
}

#[tokio::test]
async fn a_replica_whose_status_set_is_not_loaded_never_shows_a_real_number() {
    let db = pg::or_skip!(pg::cluster());
    let cluster = db.cluster.as_ref().unwrap();
    let first = TestApp::spawn_on(Some(&db.url), "").await;
    first.enable_calltracking(42, 1).await;
    drop(first);
    cluster.stop_server().unwrap();
    let app = TestApp::start_on(Some(&db.url), "").await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.get_admin(READYZ).await.assert_problem(503);

    // Seller 42 has call tracking on; this replica cannot know: no real
    // number, for any seller, on any path, but 503 with Retry-After.
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
        let path = crate::support::paths::phone_path(user, 2, PLAIN_CATEGORY);
        assert_eq!(app.head_public(&path).await, 503);
    }
    let batch = app
        .post_public(
            BATCH,
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
    app.assert_phone(42, 5, ANON_CATEGORY, ANON, "anonymous")
        .await;
    // Where the seller has no anonymous number, nothing below may be shown.
    app.anonymous.reply(Reply::NotFound);
    app.phone(42, 6, ANON_CATEGORY).await.assert_problem(503);

    cluster.start_server().unwrap();
    app.wait_ready().await;
    app.assert_phone(42, 7, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    app.assert_phone(43, 7, PLAIN_CATEGORY, REAL, "real").await;
}

#[tokio::test]
async fn an_answer_within_its_configured_timeout_is_not_cut_short_by_the_deadline() {
    // An anonymous timeout of 1200 ms makes the deadline 1300 ms; the answer
    // at 900 ms is past the default 700 ms and within the configured one.
    let app = TestApp::spawn_with("[upstreams.anonymous]\ntimeout_ms = 1200").await;
    assert_eq!(
        phones_gateway::config::DEADLINE_MARGIN,
        Duration::from_millis(100)
    );
    app.anonymous
        .reply_after(Reply::Phone(ANON), Duration::from_millis(900));
    app.assert_phone(1, 1, ANON_CATEGORY, ANON, "anonymous")
        .await;
}

#[tokio::test]
async fn a_slow_real_then_calltracking_chain_within_its_timeouts_shows_calltracking() {
    let app = TestApp::spawn().await;
    app.enable_calltracking(42, 1).await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(250));
    app.calltracking
        .reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(250));
    app.assert_phone(42, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
}

/// Fake real-phone and call-tracking upstreams on a thread of their own, so
/// their delays stay exact while the test keeps the app's runtime busy.
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
            std::future::pending::<()>().await;
        });
    });
    fakes.recv().unwrap()
}

/// docs/rules.md#concurrency-and-the-deadline: the default deadline leaves the
/// chain room for its own scheduling: on a saturated single thread, in-time
/// upstreams still give call tracking (at the bare sum of timeouts they did not).
#[tokio::test(flavor = "current_thread")]
async fn on_a_busy_worker_a_calltracking_answer_within_its_timeout_is_not_cut_by_the_default_deadline()
 {
    let (real, calltracking) = fakes_on_their_own_thread();
    let app = TestApp::spawn_with(&format!(
        "[upstreams.real_phone]\nbase_url = \"{}\"\n[upstreams.calltracking]\nbase_url = \"{}\"",
        real.url, calltracking.url
    ))
    .await;
    // Three rounds of 8 fresh sellers; passes on the first round where every
    // answer is call tracking (another test may hold the core past the calls'
    // 20 ms of slack).
    let rounds = [1..=8, 9..=16, 17..=24];
    for users in rounds.clone() {
        app.track(users).await;
    }
    // Connect before the worker is busy: connecting under the hog is not
    // what this test is about.
    real.reply(Reply::Phone(REAL));
    calltracking.reply(Reply::Phone(VIRTUAL));
    app.enable_calltracking(100, 1).await;
    app.assert_phone(100, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    real.reply_after(Reply::Phone(REAL), Duration::from_millis(280));
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(280));
    let hog = tokio::spawn(async {
        loop {
            std::thread::sleep(Duration::from_millis(12));
            tokio::task::yield_now().await;
        }
    });
    let mut seen = Vec::new();
    for users in rounds {
        let mut kinds = Vec::new();
        for user in users {
            let got = app.phone(user, 1, PLAIN_CATEGORY).await;
            assert_eq!(got.status, 200, "{got:?}");
            kinds.push(got.body["kind"].as_str().unwrap_or_default().to_owned());
        }
        let all_calltracking = kinds.iter().all(|k| k == "calltracking");
        seen.push(kinds);
        if all_calltracking {
            break;
        }
    }
    hog.abort();
    let last = seen.last().cloned().unwrap_or_default();
    assert!(
        !last.is_empty() && last.iter().all(|k| k == "calltracking"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn an_open_circuit_fails_fast_and_a_probe_closes_it() {
    let app = TestApp::spawn_with(
        "[breaker]\nconsecutive_failures = 3\nmin_sellers = 3\nmin_requests = 3\nopen_ms = 500",
    )
    .await;
    app.real.reply(Reply::Status(500));
    for user in 1..=3 {
        app.phone(user, 1, PLAIN_CATEGORY).await.assert_problem(503);
    }
    assert_eq!(app.real.calls(), 3);
    // Open: fails fast, 503 without calling the upstream.
    app.real.reply(Reply::Phone(REAL));
    let start = Instant::now();
    app.phone(4, 1, PLAIN_CATEGORY).await.assert_problem(503);
    assert!(start.elapsed() < Duration::from_millis(1500));
    assert_eq!(app.real.calls(), 3);
    // After open_ms a probe goes through and closes the circuit.
    tokio::time::sleep(Duration::from_millis(600)).await;
    app.assert_phone(5, 1, PLAIN_CATEGORY, REAL, "real").await;
    app.assert_phone(6, 1, PLAIN_CATEGORY, REAL, "real").await;
    assert_eq!(app.real.calls(), 5);
}

#[tokio::test]
async fn the_request_deadline_follows_the_configured_timeouts() {
    // The deadline defaults to max(anonymous, real + calltracking) = 1000 ms.
    let app = TestApp::spawn_with(
        r#"
        [upstreams.real_phone]
        timeout_ms = 300
        [upstreams.anonymous]
        timeout_ms = 1000
        [upstreams.calltracking]
        timeout_ms = 300
        "#,
    )
    .await;
    app.enable_calltracking(1, 1).await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(250));
    app.calltracking.reply(Reply::Hang);
    // Call tracking times out on its own 300 ms after the real number
    // (250 ms): falls through at about 550.
    let start = Instant::now();
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    // A hung anonymous upstream answers 503 at its own timeout.
    app.anonymous.reply(Reply::Hang);
    let start = Instant::now();
    app.phone(2, 1, ANON_CATEGORY).await.assert_problem(503);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_millis(3500),
        "{took:?}"
    );
}

/// The default deadline: max(anonymous, real + calltracking) of the default
/// timeouts, plus the margin (`config::DEADLINE_MARGIN`).
const DEADLINE_MS: u64 = 700;

/// Sends `n` anonymous-eligible requests for fresh sellers, each 503 or the
/// anonymous number within the deadline; returns (anonymous, 503) counts.
async fn never_reveals(app: &TestApp, first_user: u64, n: u64) -> (usize, usize) {
    let results: Vec<_> = futures_util::stream::iter(first_user..first_user + n)
        .map(|user| async move {
            let start = Instant::now();
            let url = format!(
                "{}/v1/public-phone?user_id={user}&ad_id=1&category_id={ANON_CATEGORY}",
                app.public
            );
            let got = read(app.http.get(url).send().await.unwrap()).await;
            (got, start.elapsed())
        })
        .buffer_unordered(10)
        .collect()
        .await;
    let (mut anonymous, mut refused) = (0, 0);
    for (got, took) in results {
        assert!(
            took < Duration::from_millis(DEADLINE_MS + 2500),
            "no answer within the deadline: {took:?}"
        );
        match got.status {
            503 => refused += 1,
            200 => {
                assert_eq!(
                    got.body["kind"], "anonymous",
                    "revealed while anonymous failed: {got:?}"
                );
                anonymous += 1;
            }
            _ => panic!("unexpected answer {got:?}"),
        }
        assert!(
            !got.text.contains(REAL) && !got.text.contains(VIRTUAL),
            "{got:?}"
        );
    }
    (anonymous, refused)
}

async fn faulty_anonymous_app() -> TestApp {
    let app = TestApp::spawn_with(&format!("[server]\nrequest_deadline_ms = {DEADLINE_MS}")).await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    let items: Vec<_> = (1..2000u64)
        .step_by(2)
        .map(|user| serde_json::json!({ "user_id": user, "enabled": true, "version": 1 }))
        .collect();
    let body = serde_json::json!({ "items": items });
    let got = app.send_admin(reqwest::Method::POST, STATUSES, &body).await;
    assert_eq!(got.status, 200);
    app
}

#[tokio::test]
async fn a_garbage_hung_or_at_timeout_anonymous_upstream_never_reveals() {
    let app = faulty_anonymous_app().await;
    app.anonymous.reply(Reply::Garbage);
    assert_eq!(never_reveals(&app, 1, 60).await, (0, 60));
    app.anonymous.reply(Reply::Hang);
    assert_eq!(never_reveals(&app, 101, 30).await, (0, 30));
    // Exactly at the 300 ms timeout: either the number arrives in time or 503.
    app.anonymous
        .reply_after(Reply::Phone(ANON), Duration::from_millis(300));
    let (anonymous, refused) = never_reveals(&app, 201, 40).await;
    assert_eq!(anonymous + refused, 40);
}

#[tokio::test]
async fn an_anonymous_upstream_killed_mid_load_never_reveals() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_phones-gateway"));
    command.args(["simulate", "--addr", "127.0.0.1:0"]);
    let mut sim = Spawned::spawn(command, "phones-gateway simulate");
    let addr = sim
        .logged("simulator listening", &["addr"], Duration::from_secs(30))
        .await;
    let app = TestApp::spawn_with(&format!(
        "[server]\nrequest_deadline_ms = {DEADLINE_MS}\n[upstreams.anonymous]\nbase_url = \"http://{}\"",
        addr[0]
    ))
    .await;
    app.real.reply(Reply::Phone(REAL));
    // Load through the kill: the simulator has an anonymous number when
    // (user + ad) % 3 == 0, else 404.
    let answered = Arc::new(AtomicUsize::new(0));
    let load = {
        let (public, http, answered) = (app.public.clone(), app.http.clone(), answered.clone());
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for user in 1000..1300u64 {
                let url = format!(
                    "{public}/v1/public-phone?user_id={user}&ad_id=2&category_id={ANON_CATEGORY}"
                );
                answers.push((user, read(http.get(url).send().await.unwrap()).await));
                answered.fetch_add(1, Ordering::SeqCst);
            }
            answers
        })
    };
    eventually("the load to get going", Duration::from_secs(30), || {
        let answered = answered.load(Ordering::SeqCst);
        async move { answered >= 30 }
    })
    .await;
    sim.kill(); // SIGKILL, mid-load
    // Every answer, also around the kill: the anonymous number, 503, or the
    // real number only where the simulator has no anonymous one (404).
    let answers = load.await.unwrap();
    let mut refused = 0;
    for (user, got) in &answers {
        let has_anonymous = (user + 2) % 3 == 0;
        match (got.status, got.body["kind"].as_str()) {
            (200, Some("anonymous")) => assert!(has_anonymous, "{user}: {got:?}"),
            (200, Some("real")) => assert!(
                !has_anonymous,
                "revealed while anonymous failed: {user}: {got:?}"
            ),
            (503, _) => refused += 1,
            _ => panic!("unexpected answer for {user}: {got:?}"),
        }
    }
    assert!(
        refused > 0,
        "the kill happened after the load: no failure seen"
    );
    // Every request after the kill, for sellers not cached: 503, never a number.
    assert_eq!(never_reveals(&app, 5000, 60).await, (0, 60));
}

/// The real-number upstream at `raw`, 500 ms timeout and a far deadline, so
/// only the client's own timeout can cut a call.
async fn app_on(raw: &RawServer) -> TestApp {
    TestApp::spawn_with(&format!(
        "[server]\nrequest_deadline_ms = 10000\n[upstreams.real_phone]\nbase_url = \"{}\"\ntimeout_ms = 500",
        raw.url
    ))
    .await
}

#[tokio::test]
async fn calls_reuse_one_kept_alive_connection_and_say_who_is_calling() {
    let raw = RawServer::start(RawReply::Phone).await;
    let app = app_on(&raw).await;
    for user in 1..=20 {
        let request_id = format!("req-{user}");
        let path = crate::support::paths::phone_path(user, 1, PLAIN_CATEGORY);
        app.get_public_with(&path, &[("x-request-id", &request_id)])
            .await
            .assert_number(REAL, "real");
    }
    assert_eq!(raw.heads().len(), 20, "one call per uncached seller");
    assert_eq!(
        raw.connections(),
        1,
        "one after another, the calls share a connection"
    );
    let heads = raw.heads();
    let first = heads[0].to_ascii_lowercase();
    assert!(
        first.starts_with("get /v1/users/1/phone?ad_id=1 http/1.1"),
        "{first}"
    );
    assert!(first.contains("\r\nuser-agent: phones-gateway/"), "{first}");
    assert!(first.contains("\r\nhost: 127.0.0.1:"), "{first}");
    assert!(first.contains("\r\nx-request-id: req-1"), "{first}");
}

#[tokio::test]
async fn a_body_over_the_bound_is_refused_not_read_whole() {
    let raw = RawServer::start(RawReply::Huge).await;
    let app = app_on(&raw).await;
    let start = Instant::now();
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(503);
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn one_timeout_covers_the_body_too() {
    let raw = RawServer::start(RawReply::Trickle).await;
    let app = app_on(&raw).await;
    let start = Instant::now();
    // The head comes at once; the 27-byte body would take 2.7 s.
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(503);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(450), "{took:?}");
    assert!(
        took < Duration::from_millis(2500),
        "cut at the 500 ms timeout: {took:?}"
    );
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let raw = RawServer::start(RawReply::Redirect).await;
    let app = app_on(&raw).await;
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(503);
    assert_eq!(
        raw.heads().len(),
        1,
        "a 3xx is an unexpected status, not followed"
    );
}

/// Each seller's answered kind (ad 1), or a problem's status and detail.
async fn kinds_of_sellers(app: &TestApp, users: std::ops::RangeInclusive<u64>) -> Vec<String> {
    let mut kinds = Vec::new();
    for user in users {
        let got = app.phone(user, 1, PLAIN_CATEGORY).await;
        kinds.push(got.body["kind"].as_str().map_or_else(
            || format!("{} {}", got.status, got.body["detail"]),
            str::to_owned,
        ));
    }
    kinds
}

/// The status feed shares call tracking's base URL, not its client: a failing
/// feed opens its own breaker, and tracked sellers still get their
/// call-tracking number (docs/rules.md, "Verdict or undecided").
#[tokio::test]
async fn a_failing_status_feed_never_moves_tracked_sellers_onto_their_real_number() {
    let app = TestApp::spawn_with(
        "[upstreams.calltracking.status_feed]\nenabled = true\ninterval_ms = 20",
    )
    .await;
    app.calltracking.fail_feed(Some(500));
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.track(1..=10).await;
    // Five failures open a breaker: the feed is not polled for open_ms (5 s).
    // Open once no poll came for ten intervals.
    let quiet = std::sync::Mutex::new((0, std::time::Instant::now()));
    eventually("the feed's breaker open", Duration::from_secs(10), || {
        let polls = app.calltracking.feed_uris().len();
        let mut quiet = quiet.lock().unwrap();
        if polls != quiet.0 {
            *quiet = (polls, std::time::Instant::now());
        }
        let open = polls >= 5 && quiet.1.elapsed() >= Duration::from_millis(200);
        async move { open }
    })
    .await;
    let (lookups, polls) = (app.calltracking.calls(), app.calltracking.feed_uris().len());
    let kinds = kinds_of_sellers(&app, 1..=10).await;
    assert!(kinds.iter().all(|k| k == "calltracking"), "{kinds:?}");
    // The feed's own breaker opened: every lookup reached call tracking,
    // while the feed stayed unpolled.
    assert_eq!(
        app.calltracking.calls(),
        lookups + 10,
        "each tracked seller's lookup reached call tracking"
    );
    assert_eq!(
        app.calltracking.feed_uris().len(),
        polls,
        "the feed's breaker stayed open"
    );
}

/// One caller floods one tracked seller with batches of distinct `phone`s (so
/// nothing coalesces) against a slow call tracking, while ten other tracked
/// sellers are asked in turn. Returns their kinds and the attacked one's items.
async fn flood(app: &TestApp, attacked: u64) -> (Vec<String>, Vec<serde_json::Value>) {
    app.real.reply(Reply::Phone(REAL));
    app.calltracking
        .reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(250));
    app.enable_calltracking(attacked, 1).await;
    app.track(1..=10).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let next_phone = Arc::new(AtomicUsize::new(0));
    let attackers: Vec<_> = (0..3)
        .map(|_| {
            let (http, url) = (
                app.http.clone(),
                format!("{}/v1/public-phones/batch", app.public),
            );
            let (stop, next_phone) = (stop.clone(), next_phone.clone());
            tokio::spawn(async move {
                let mut items = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    // Two batches a second per attacker: a refused batch
                    // resent at once would only burn CPU, not hold places.
                    let paced = tokio::time::sleep(Duration::from_millis(500));
                    let batch: Vec<_> = (1..=100)
                        .map(|ad| {
                            let n = next_phone.fetch_add(1, Ordering::SeqCst);
                            json!({ "user_id": attacked, "ad_id": ad, "category_id": PLAIN_CATEGORY,
                                    "phone": format!("+7916{:07}", 1_000_000 + n) })
                        })
                        .collect();
                    let got = read(
                        http.post(&url)
                            .header("content-type", "application/json")
                            .body(json!({ "items": batch }).to_string())
                            .send()
                            .await
                            .unwrap(),
                    )
                    .await;
                    assert_eq!(got.status, 200, "{got:?}");
                    items.extend(got.body["results"].as_array().unwrap().iter().cloned());
                    paced.await;
                }
                items
            })
        })
        .collect();
    eventually("the flood started", Duration::from_secs(10), || async {
        next_phone.load(Ordering::SeqCst) >= 300 && app.calltracking.calls() >= 1
    })
    .await;
    let kinds = kinds_of_sellers(app, 1..=10).await;
    stop.store(true, Ordering::SeqCst);
    let mut items = Vec::new();
    for attacker in attackers {
        items.extend(attacker.await.unwrap());
    }
    (kinds, items)
}

/// The flood's configurations: slow call tracking (250 ms), and timeouts far
/// past that so no call fails its source however busy the box is.
const FLOODED_8: &str = "[upstreams.calltracking]\nmax_in_flight = 8\ntimeout_ms = 5000\n\
                         [upstreams.real_phone]\ntimeout_ms = 2000";
const FLOODED_64: &str = "[upstreams.calltracking]\nmax_in_flight = 64\ntimeout_ms = 5000\n\
                          [upstreams.real_phone]\ntimeout_ms = 2000";

/// The `detail` of an item refused as undecided (src/http/api/error.rs), as
/// opposed to admission's "overloaded" 503 or a store's.
const UNDECIDED: &str = "the number cannot be decided right now; retry later";

/// The flood moved no seller onto a number the rules do not allow: every
/// other seller gets its call-tracking number, every attacked item its
/// call-tracking number or an undecided 503. Returns how many were refused.
fn assert_flood_contained(kinds: &[String], items: &[serde_json::Value]) -> usize {
    assert!(
        !kinds.iter().any(|k| k == "real"),
        "another seller was answered the real number: {kinds:?}"
    );
    assert!(
        kinds.iter().all(|k| k == "calltracking"),
        "other sellers: {kinds:?}"
    );
    let mut refused = 0;
    for item in items {
        match item["kind"].as_str() {
            Some("calltracking") => assert_eq!(item["phone"], VIRTUAL, "{item}"),
            Some(kind) => panic!("an attacked item answered {kind}: {item}"),
            None => {
                let error = &item["error"];
                assert_eq!(error["status"], 503, "{item}");
                assert_eq!(error["type"], "about:blank", "{item}");
                assert_eq!(error["title"], "Service Unavailable", "{item}");
                assert_eq!(error["detail"], UNDECIDED, "{item}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "{} items, none refused", items.len());
    refused
}

/// Call tracking had at most, and at some moment exactly, `per_seller` lookups
/// in flight for the attacked seller.
fn assert_seller_bound_hit(app: &TestApp, attacked: u64, per_seller: usize) {
    assert_eq!(
        app.calltracking.max_in_flight_of(attacked),
        per_seller,
        "lookups for the attacked seller in flight at once"
    );
    for user in 1..=10 {
        assert!(
            app.calltracking.max_in_flight_of(user) >= 1,
            "seller {user} was never looked up"
        );
    }
}

// Two workers: attackers, the app and the fakes share the test's runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_flooding_one_seller_moves_no_seller_onto_the_real_number() {
    let app = TestApp::spawn_with(FLOODED_8).await;
    let (kinds, items) = flood(&app, 500).await;
    assert_flood_contained(&kinds, &items);
    // The default per-seller bound: an eighth of 8, one call.
    assert_seller_bound_hit(&app, 500, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_flooding_one_seller_under_a_larger_bound_moves_no_seller_either() {
    let app = TestApp::spawn_with(FLOODED_64).await;
    let (kinds, items) = flood(&app, 500).await;
    assert_flood_contained(&kinds, &items);
    // An eighth of 64: the attacked seller held 8 places, never 64.
    assert_seller_bound_hit(&app, 500, 8);
}

/// Refused by the gateway's own bound on calls in flight, a source is
/// undecided, not failed: no fall_through; a usable stale call-tracking number
/// is served, else 503 with Retry-After.
#[tokio::test]
async fn a_source_refused_by_the_gateway_is_undecided_not_failed() {
    let app = TestApp::spawn_with(
        "[upstreams.calltracking]\nmax_in_flight = 1\ntimeout_ms = 5000\n\
         [cache.calltracking]\nttl_s = 1",
    )
    .await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.track(1..=3).await;
    // User 2's call-tracking number is cached, then expires (stale but usable).
    app.assert_phone(2, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    app.calltracking.reply(Reply::Hang);
    let hog = tokio::spawn({
        let (http, url) = (
            app.http.clone(),
            format!(
                "{}/v1/public-phone?user_id=1&ad_id=1&category_id={PLAIN_CATEGORY}",
                app.public
            ),
        );
        async move { http.get(url).send().await }
    });
    eventually("the place is taken", Duration::from_secs(5), || async {
        app.calltracking.calls() == 2
    })
    .await;
    let got = app.phone(3, 1, PLAIN_CATEGORY).await;
    got.assert_problem(503);
    assert_eq!(got.retry_after.as_deref(), Some("1"), "{got:?}");
    assert!(!got.text.contains("+7"), "{got:?}");
    app.assert_phone(2, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    assert_eq!(app.calltracking.calls(), 2, "refused calls are not made");
    hog.abort();
}
