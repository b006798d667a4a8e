//! Faults (issue 5): circuit breakers, the request deadline, and anonymous-eligible
//! traffic while the anonymous upstream is garbage, hung, at its timeout or killed:
//! never a real or call-tracking number, always an answer within the deadline.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::support::child::Spawned;
use crate::support::{Reply, TestApp, eventually, read};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

#[tokio::test]
async fn an_open_circuit_fails_fast_and_a_probe_closes_it() {
    let app = TestApp::spawn_with("[breaker]\nconsecutive_failures = 3\nopen_ms = 500").await;
    app.real.reply(Reply::Status(500));
    for user in 1..=3 {
        app.phone(user, 1, PLAIN_CATEGORY).await.assert_problem(503);
    }
    assert_eq!(app.real.calls(), 3);
    // Open: the upstream (which now answers at once) is not called: 503 without
    // a call is what "fails fast" means; the time bound only rules out a wait for
    // some timeout, with room for two busy cores.
    app.real.reply(Reply::Phone(REAL));
    let start = Instant::now();
    app.phone(4, 1, PLAIN_CATEGORY).await.assert_problem(503);
    assert!(start.elapsed() < Duration::from_millis(1500));
    assert_eq!(app.real.calls(), 3);
    // After open_ms one probe goes through; it succeeds and closes the circuit.
    tokio::time::sleep(Duration::from_millis(600)).await;
    app.phone(5, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.phone(6, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
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
    // Call tracking is asked once the real number is known (250 ms) and times
    // out on its own 300 ms: it falls through to the real number at about 550.
    let start = Instant::now();
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    // A hung anonymous upstream (fail_closed) answers 503 at its own timeout,
    // not cut short before it, and not waited on after it.
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

/// Sends `n` anonymous-eligible requests (10 at a time) for fresh sellers, some
/// with call tracking on; each must be 503 or the anonymous number, within the
/// deadline and slack for ten concurrent requests on two busy cores (a hung
/// upstream holds for 60 s, so the bound still tells a deadline from none).
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
    let got = app
        .send_admin(
            reqwest::Method::POST,
            "/admin/v1/calltracking/statuses",
            &body,
        )
        .await;
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
    // The simulator as the anonymous upstream, in a process of its own to kill.
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
    // Load while healthy, through the kill and after it: the simulator connects
    // an anonymous number when (user + ad) % 3 == 0, else answers 404.
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
    // Kill it once the load is under way (30 answers given), mid-load.
    eventually("the load to get going", Duration::from_secs(30), || {
        let answered = answered.load(Ordering::SeqCst);
        async move { answered >= 30 }
    })
    .await;
    sim.kill(); // SIGKILL, mid-load
    // Every answer, also those in the risky window around the kill: the anonymous
    // number, or 503, or, only for an ad the simulator has no anonymous number
    // for (404 is an answer, not a failure), the real number.
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
