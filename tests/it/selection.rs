//! docs/rules.md: which number wins, fail-closed and fall-through, concurrency.

use std::time::{Duration, Instant};

use crate::support::{Reply, TestApp};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

/// Every combination of applicable sources and their answers.
#[tokio::test]
#[allow(clippy::type_complexity)] // a table reads best as tuples
async fn the_selection_matrix() {
    use Reply::*;
    // (anonymous applies, anonymous reply, calltracking on, calltracking reply, real reply) -> (status, phone, kind)
    let cases: &[(bool, Reply, bool, Reply, Reply, u16, &str, &str)] = &[
        (
            true,
            Phone(ANON),
            true,
            Phone(VIRTUAL),
            Phone(REAL),
            200,
            ANON,
            "anonymous",
        ),
        (
            true,
            NotFound,
            true,
            Phone(VIRTUAL),
            Phone(REAL),
            200,
            VIRTUAL,
            "calltracking",
        ),
        (
            true,
            NotFound,
            false,
            Phone(VIRTUAL),
            Phone(REAL),
            200,
            REAL,
            "real",
        ),
        (
            false,
            Phone(ANON),
            true,
            Phone(VIRTUAL),
            Phone(REAL),
            200,
            VIRTUAL,
            "calltracking",
        ),
        (
            false,
            Phone(ANON),
            false,
            Phone(VIRTUAL),
            Phone(REAL),
            200,
            REAL,
            "real",
        ),
        (
            false,
            Phone(ANON),
            true,
            NotFound,
            Phone(REAL),
            200,
            REAL,
            "real",
        ),
        (true, NotFound, true, NotFound, NotFound, 404, "", ""),
        (false, NotFound, false, NotFound, NotFound, 404, "", ""),
        (
            true,
            Phone(ANON),
            false,
            NotFound,
            NotFound,
            200,
            ANON,
            "anonymous",
        ),
        (
            true,
            Status(500),
            true,
            Phone(VIRTUAL),
            Phone(REAL),
            503,
            "",
            "",
        ),
        (
            false,
            Status(500),
            false,
            NotFound,
            Phone(REAL),
            200,
            REAL,
            "real",
        ),
        (
            false,
            NotFound,
            true,
            Status(500),
            Phone(REAL),
            200,
            REAL,
            "real",
        ),
        (
            false,
            NotFound,
            true,
            Phone(VIRTUAL),
            Status(500),
            503,
            "",
            "",
        ),
        (false, NotFound, false, NotFound, Status(502), 503, "", ""),
        (true, NotFound, true, Status(500), NotFound, 404, "", ""),
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
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.real.reply(Reply::Phone("89161234567"));
    app.phone(2, 1, PLAIN_CATEGORY).await.assert_problem(503);
}

#[tokio::test]
async fn anonymous_upstream_hang_answers_503_without_revealing() {
    // A far deadline, so that only the anonymous upstream's 300 ms timeout can end
    // the wait.
    let app = TestApp::spawn_with("[server]\nrequest_deadline_ms = 8000").await;
    app.anonymous.reply(Reply::Hang);
    app.real.reply(Reply::Phone(REAL));
    let start = Instant::now();
    let got = app.phone(1, 1, ANON_CATEGORY).await;
    got.assert_problem(503);
    assert!(got.retry_after.is_some(), "{got:?}");
    assert!(!got.text.contains(REAL));
    // Bounded by the anonymous upstream's 300 ms timeout, not by the hang nor by
    // the 8 s deadline (the upper bound leaves room for two busy cores).
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
        app.phone(5, ad, PLAIN_CATEGORY)
            .await
            .assert_number(REAL, "real");
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
    app.phone(4, 1, ANON_CATEGORY)
        .await
        .assert_number(REAL, "real");
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
    // anonymous 800 ms in parallel with real 600 ms then calltracking 300 ms:
    // max(800, 900) = 900 ms; the sum would be 1700 ms. The gap is wide enough
    // for two busy cores.
    app.anonymous
        .reply_after(Reply::NotFound, Duration::from_millis(800));
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(600));
    app.calltracking
        .reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(300));
    let start = Instant::now();
    app.phone(9, 1, ANON_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
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
    app.phone(1, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
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
    app.phone(1, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn fifty_concurrent_cold_requests_make_one_upstream_call() {
    let app = TestApp::spawn().await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(100));
    let requests = (0..50).map(|_| app.phone(77, 1, PLAIN_CATEGORY));
    for got in futures_util::future::join_all(requests).await {
        got.assert_number(REAL, "real");
    }
    assert_eq!(
        app.real.calls(),
        1,
        "concurrent misses coalesce (docs/caching.md)"
    );
}

#[tokio::test]
async fn batch_answers_each_item_in_order_with_mixed_results() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Status(500));
    let body = serde_json::json!({ "items": [
        { "user_id": 1, "ad_id": 11, "category_id": 1 },
        { "user_id": 0, "ad_id": 12, "category_id": 1 },
        { "user_id": 2, "ad_id": 13, "category_id": 9 },
        { "user_id": 3, "ad_id": 14, "category_id": 1, "phone": "+44 20 7946 0958" },
        { "user_id": 4, "ad_id": 15, "category_id": 1, "phone": "12345" },
        { "user_id": 5, "category_id": 1 },
    ]});
    let got = app
        .post_public("/v1/public-phones/batch", body.to_string())
        .await;
    assert_eq!(got.status, 200, "{got:?}");
    let results = got.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    assert_eq!(results[0]["phone"], REAL);
    assert_eq!(results[0]["kind"], "real");
    assert_eq!(results[0]["ad_id"], 11);
    assert_eq!(results[1]["ad_id"], 12);
    assert_eq!(results[1]["error"]["status"], 400);
    assert!(
        results[1]["error"]["detail"]
            .as_str()
            .unwrap()
            .contains("user_id")
    );
    assert_eq!(results[2]["ad_id"], 13);
    assert_eq!(results[2]["error"]["status"], 503);
    assert_eq!(results[3]["phone"], crate::FOREIGN);
    assert_eq!(results[4]["error"]["status"], 400);
    assert!(
        results[4]["error"]["detail"]
            .as_str()
            .unwrap()
            .contains("phone")
    );
    assert_eq!(results[5]["ad_id"], serde_json::Value::Null);
    assert_eq!(results[5]["error"]["status"], 400);
}
