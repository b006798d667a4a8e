//! docs/caching.md: caching, negative caching, TTL, stale-if-error, invalidation.

use std::time::{Duration, Instant};

use crate::support::{Reply, TestApp, eventually};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

const SHORT_TTLS: &str = r#"
    [cache.real_phone]
    ttl_s = 1
    negative_ttl_s = 1
    max_stale_s = 60
    refresh_ahead_s = 0
    [cache.anonymous]
    ttl_s = 1
    negative_ttl_s = 1
    max_stale_s = 60
    refresh_ahead_s = 0
    [cache.calltracking]
    ttl_s = 1
    negative_ttl_s = 1
    max_stale_s = 60
    refresh_ahead_s = 0
"#;

/// Just past a one-second TTL (the caches count in tenths of a second).
const PAST_TTL: Duration = Duration::from_millis(1300);

#[tokio::test]
async fn a_cached_number_is_served_without_asking_again() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::NotFound);
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.enable_calltracking(1, 1).await;
    for _ in 0..3 {
        app.phone(1, 1, ANON_CATEGORY)
            .await
            .assert_number(VIRTUAL, "calltracking");
    }
    assert_eq!(
        (
            app.anonymous.calls(),
            app.real.calls(),
            app.calltracking.calls()
        ),
        (1, 1, 1)
    );
    // Another ad of the same seller is another key.
    app.phone(1, 2, ANON_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    assert_eq!(
        (
            app.anonymous.calls(),
            app.real.calls(),
            app.calltracking.calls()
        ),
        (2, 2, 1)
    );
}

#[tokio::test]
async fn a_404_is_cached_too() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::NotFound);
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(404);
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(404);
    assert_eq!(app.real.calls(), 1);
}

#[tokio::test]
async fn failures_are_not_cached() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Status(500));
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(503);
    app.real.reply(Reply::Phone(REAL));
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    assert_eq!(app.real.calls(), 2);
}

/// TTLs of 3 s, so that "still cached" holds on two busy cores; expiry is then
/// waited for by polling (cached answers make no call), not by a guessed sleep.
#[tokio::test]
async fn entries_expire_after_their_ttl() {
    let app = TestApp::spawn_with(
        // No refresh ahead: this is about expiry itself.
        "[cache.real_phone]\nttl_s = 3\nnegative_ttl_s = 3\nmax_stale_s = 60\nrefresh_ahead_s = 0",
    )
    .await;
    app.real.reply(Reply::Phone(REAL));
    let cached = Instant::now();
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.real.reply(Reply::NotFound);
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    assert_eq!(app.real.calls(), 1);
    eventually("the number to expire", Duration::from_secs(10), || async {
        app.phone(1, 1, PLAIN_CATEGORY).await.status == 404
    })
    .await;
    assert!(
        cached.elapsed() >= Duration::from_millis(2900),
        "expired early"
    );
    assert_eq!(app.real.calls(), 2);
    // The 404 has its own TTL.
    let cached = Instant::now();
    app.real.reply(Reply::Phone(REAL));
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(404);
    eventually("the 404 to expire", Duration::from_secs(10), || async {
        app.phone(1, 1, PLAIN_CATEGORY).await.status == 200
    })
    .await;
    assert!(
        cached.elapsed() >= Duration::from_millis(2500),
        "expired early"
    );
    assert_eq!(app.real.calls(), 3);
}

#[tokio::test]
async fn an_expired_number_is_served_while_the_upstream_fails() {
    let app = TestApp::spawn_with(SHORT_TTLS).await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.phone(2, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
    tokio::time::sleep(PAST_TTL).await;
    app.real.reply(Reply::Status(500));
    app.anonymous.reply(Reply::Hang);
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.phone(2, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
    // Stale only while failing: a working upstream's new answer wins.
    app.real.reply(Reply::NotFound);
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(404);
}

#[tokio::test]
async fn an_expired_no_anonymous_number_is_never_used() {
    let app = TestApp::spawn_with(SHORT_TTLS).await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::NotFound);
    app.phone(1, 1, ANON_CATEGORY)
        .await
        .assert_number(REAL, "real");
    tokio::time::sleep(PAST_TTL).await;
    app.anonymous.reply(Reply::Status(500));
    // The seller may have paid since: fail closed, never the real number.
    let got = app.phone(1, 1, ANON_CATEGORY).await;
    got.assert_problem(503);
    assert!(!got.text.contains(REAL));
}

#[tokio::test]
async fn invalidation_drops_every_number_of_the_seller() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.phone(1, 2, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.phone(2, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    assert_eq!(app.real.calls(), 3);
    app.invalidate(&[1]).await;
    app.real.reply(Reply::Phone(crate::NEW_REAL));
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(crate::NEW_REAL, "real");
    app.phone(1, 2, PLAIN_CATEGORY)
        .await
        .assert_number(crate::NEW_REAL, "real");
    assert_eq!(app.real.calls(), 5);
}

#[tokio::test]
async fn invalidated_numbers_are_not_served_stale_either() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.invalidate(&[1]).await;
    app.real.reply(Reply::Status(500));
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(503);
}

#[tokio::test]
async fn a_fetch_started_before_an_invalidation_never_writes_its_answer_back() {
    let app = TestApp::spawn_with(
        "[server]\nrequest_deadline_ms = 10000\n[upstreams.real_phone]\ntimeout_ms = 3000",
    )
    .await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(2000));
    let before = {
        let (public, http) = (app.public.clone(), app.http.clone());
        tokio::spawn(async move {
            let url = format!("{public}/v1/public-phone?user_id=1&ad_id=1&category_id=1");
            crate::support::read(http.get(url).send().await.unwrap()).await
        })
    };
    eventually("the old fetch under way", Duration::from_secs(10), || {
        let calls = app.real.calls();
        async move { calls == 1 }
    })
    .await;
    app.invalidate(&[1]).await;
    app.real.reply(Reply::Phone(crate::NEW_REAL));
    // After the invalidation: not joined to the old fetch.
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(crate::NEW_REAL, "real");
    // The old fetch ends with the old number for its own caller...
    before.await.unwrap().assert_number(REAL, "real");
    // ...and does not overwrite the new one.
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(crate::NEW_REAL, "real");
    assert_eq!(app.real.calls(), 2);
}
