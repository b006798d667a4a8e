//! Only the upstream's word is a verdict (docs/rules.md, "Verdict or
//! undecided"): a load refusal, a panicked fetch, one seller's failing calls
//! never move a seller onto a number the rules do not allow, nor open a breaker.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::paths::BATCH;
use crate::support::{Answer, Reply, TestApp, eventually};
use crate::{PLAIN_CATEGORY, REAL, VIRTUAL};

/// The `detail` of the 503 of an undecided source (src/http/api/error.rs).
const UNDECIDED: &str = "the number cannot be decided right now; retry later";

/// A single lookup for `user` with the real number given.
fn given(user: u64, ad: u64) -> String {
    format!(
        "/v1/public-phone?user_id={user}&ad_id={ad}&category_id={PLAIN_CATEGORY}&phone=%2B{}",
        &REAL[1..]
    )
}

/// Asserts an undecided 503: a problem with `Retry-After` and the undecided detail.
#[track_caller]
fn assert_undecided(answer: &Answer) {
    answer.assert_problem(503);
    assert!(answer.retry_after.is_some(), "{answer:?}");
    assert_eq!(answer.body["detail"], UNDECIDED, "{answer:?}");
}

/// A batch result that is an error, as an `Answer`-like check.
#[track_caller]
fn assert_undecided_item(item: &Value) {
    let error = &item["error"];
    assert_eq!(error["status"], 503, "{item}");
    assert_eq!(error["title"], "Service Unavailable", "{item}");
    assert_eq!(error["detail"], UNDECIDED, "{item}");
}

/// Distinct Russian mobile numbers, spread (a small LCG): each batch item asks
/// call tracking about a number of its own, so nothing coalesces or caches.
fn phones(seed: u64, n: usize) -> Vec<String> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            format!("+7926{:07}", (x >> 33) % 10_000_000)
        })
        .collect()
}

/// An upstream with room for 8 calls, 429 past that, flooded by one caller: no
/// answer is the real number (a load refusal is no verdict), and other tracked
/// sellers get call tracking right after: the refusals opened no breaker.
#[tokio::test]
async fn a_429_flood_reveals_no_real_number_and_opens_no_breaker() {
    // Long timeouts: only the upstream's refusals are tested.
    let app = TestApp::spawn_with(
        "[upstreams.real_phone]\ntimeout_ms = 3000\n\
         [upstreams.calltracking]\ntimeout_ms = 3000",
    )
    .await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking
        .reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(50));
    app.calltracking.capacity(8);
    let flooded: Vec<u64> = (500..550).collect();
    let others: Vec<u64> = (601..=610).collect();
    app.track(flooded.iter().chain(&others).copied()).await;

    let batch = |round: u64| {
        let app = &app;
        let flooded = &flooded;
        async move {
            let items: Vec<Value> = phones(round + 1, flooded.len())
                .into_iter()
                .zip(flooded)
                .enumerate()
                .map(|(i, (phone, user))| {
                    json!({ "user_id": user, "ad_id": round * 1000 + i as u64 + 1,
                            "category_id": PLAIN_CATEGORY, "phone": phone })
                })
                .collect();
            let answer = app
                .post_public(BATCH, json!({ "items": items }).to_string())
                .await;
            assert_eq!(answer.status, 200, "{answer:?}");
            answer.body["results"].as_array().unwrap().clone()
        }
    };
    let flood = async {
        let batches = futures_util::future::join_all((0..6).map(batch)).await;
        batches.into_iter().flatten().collect::<Vec<_>>()
    };
    let asking = async {
        let mut answers = Vec::new();
        for round in 0..3 {
            for &user in &others {
                answers.push(app.get_public(&given(user, 100 + round)).await);
            }
        }
        answers
    };
    let (results, answers) = tokio::join!(flood, asking);

    assert_eq!(results.len(), 300);
    let mut refused = std::collections::HashSet::new();
    for (i, item) in results.iter().enumerate() {
        assert_ne!(item["kind"], "real", "a load refusal revealed: {item}");
        if item.get("error").is_some() {
            assert_undecided_item(item);
            refused.insert(flooded[i % flooded.len()]);
        } else {
            assert_eq!(item["kind"], "calltracking", "{item}");
        }
    }
    assert!(
        app.calltracking.refused() >= 20 && refused.len() >= 10,
        "the fake refused {} calls, about {} sellers: too few for the breaker test to mean anything",
        app.calltracking.refused(),
        refused.len()
    );
    for answer in &answers {
        assert_ne!(answer.body["kind"], "real", "{answer:?}");
        if answer.status != 200 {
            assert_undecided(answer);
        }
    }

    for &user in &others {
        let path = given(user, 200);
        eventually(
            "call tracking after the flood",
            Duration::from_secs(2),
            || {
                let (app, path) = (&app, &path);
                async move {
                    let answer = app.get_public(path).await;
                    assert_ne!(answer.body["kind"], "real", "{answer:?}");
                    answer.status == 200 && answer.body["kind"] == "calltracking"
                }
            },
        )
        .await;
    }
}

/// One seller whose call-tracking calls all answer 500: its own requests fall
/// through (a 500 is a verdict), but the breaker stays closed for others.
#[tokio::test]
async fn one_sellers_failing_calls_leave_the_breaker_closed_for_others() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    const FAILING: u64 = 600;
    const OTHER: u64 = 601;
    app.calltracking.reply_for(FAILING, Reply::Status(500));
    app.enable_calltracking(FAILING, 1).await;
    app.enable_calltracking(OTHER, 1).await;
    // Far past the breaker's run (5) and its ratio's minimum (20 calls).
    for ad in 1..=30 {
        let answer = app.get_public(&given(FAILING, ad)).await;
        answer.assert_number(REAL, "real");
    }
    let calls = app.calltracking.calls();
    assert!(
        calls >= 30,
        "the failing seller's calls were not made: {calls}"
    );
    app.get_public(&given(OTHER, 1))
        .await
        .assert_number(VIRTUAL, "calltracking");
}

/// A fetch that panics (`test-faults`, src/upstream/faults.rs): undecided, 503
/// with `Retry-After`, never the real number; the breaker stays closed.
#[tokio::test]
async fn a_panicking_fetch_is_undecided_and_opens_no_breaker() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    let panicking: Vec<u64> = phones_gateway::upstream::faults::PANICKING_SELLERS
        .take(10)
        .collect();
    const OTHER: u64 = 700;
    app.track(panicking.iter().copied()).await;
    app.enable_calltracking(OTHER, 1).await;
    for round in 0..3 {
        for &user in &panicking {
            let answer = app.get_public(&given(user, round + 1)).await;
            assert_undecided(&answer);
        }
    }
    app.get_public(&given(OTHER, 1))
        .await
        .assert_number(VIRTUAL, "calltracking");
}

/// A 503 with `Retry-After` is the upstream refusing load: undecided, a 503
/// to the buyer, never the real number, and no breaker opens. A 503 without
/// it is a verdict: that seller falls through.
#[tokio::test]
async fn a_503_with_retry_after_refuses_load_and_one_without_it_is_a_verdict() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::RetryAfter(503));
    let users: Vec<u64> = (800..820).collect();
    app.track(users.iter().copied()).await;
    for &user in &users {
        assert_undecided(&app.get_public(&given(user, 1)).await);
    }
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    for &user in &users {
        app.get_public(&given(user, 2))
            .await
            .assert_number(VIRTUAL, "calltracking");
    }
    const PLAIN_503: u64 = 821;
    app.enable_calltracking(PLAIN_503, 1).await;
    app.calltracking.reply_for(PLAIN_503, Reply::Status(503));
    app.get_public(&given(PLAIN_503, 1))
        .await
        .assert_number(REAL, "real");
}
