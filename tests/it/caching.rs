//! docs/caching.md: TTLs, coalescing, stale-if-error, eviction and
//! invalidation, on one replica and across the fleet.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::support::paths::INVALIDATE;
use crate::support::{Reply, TestApp, eventually, pg};
use crate::{
    ANON, ANON_CATEGORY, NEW_ANON, NEW_REAL, OTHER_VIRTUAL, PLAIN_CATEGORY, REAL, VIRTUAL,
};

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
        app.assert_phone(1, 1, ANON_CATEGORY, VIRTUAL, "calltracking")
            .await;
    }
    app.assert_calls(1, 1, 1);
    // Another ad of the same seller is another key.
    app.assert_phone(1, 2, ANON_CATEGORY, VIRTUAL, "calltracking")
        .await;
    app.assert_calls(2, 2, 1);
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
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    assert_eq!(app.real.calls(), 2);
}

/// TTLs of 3 s, so "still cached" holds on busy cores; expiry is polled for.
#[tokio::test]
async fn entries_expire_after_their_ttl() {
    let app = TestApp::spawn_with(
        "[cache.real_phone]\nttl_s = 3\nnegative_ttl_s = 3\nmax_stale_s = 60\nrefresh_ahead_s = 0",
    )
    .await;
    app.real.reply(Reply::Phone(REAL));
    let cached = Instant::now();
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    app.real.reply(Reply::NotFound);
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
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
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    app.assert_phone(2, 1, ANON_CATEGORY, ANON, "anonymous")
        .await;
    tokio::time::sleep(PAST_TTL).await;
    app.real.reply(Reply::Status(500));
    app.anonymous.reply(Reply::Hang);
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    app.assert_phone(2, 1, ANON_CATEGORY, ANON, "anonymous")
        .await;
    // Stale only while failing: a working upstream's new answer wins.
    app.real.reply(Reply::NotFound);
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(404);
}

#[tokio::test]
async fn an_expired_no_anonymous_number_is_never_used() {
    let app = TestApp::spawn_with(SHORT_TTLS).await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::NotFound);
    app.assert_phone(1, 1, ANON_CATEGORY, REAL, "real").await;
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
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    app.assert_phone(1, 2, PLAIN_CATEGORY, REAL, "real").await;
    app.assert_phone(2, 1, PLAIN_CATEGORY, REAL, "real").await;
    assert_eq!(app.real.calls(), 3);
    app.invalidate(&[1]).await;
    app.real.reply(Reply::Phone(crate::NEW_REAL));
    app.assert_phone(1, 1, PLAIN_CATEGORY, crate::NEW_REAL, "real")
        .await;
    app.assert_phone(1, 2, PLAIN_CATEGORY, crate::NEW_REAL, "real")
        .await;
    assert_eq!(app.real.calls(), 5);
}

#[tokio::test]
async fn invalidated_numbers_are_not_served_stale_either() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
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
    let before = app.phone_in_background(1, 1, PLAIN_CATEGORY);
    app.real
        .until_calls("the old fetch under way", 1, Duration::from_secs(10))
        .await;
    app.invalidate(&[1]).await;
    app.real.reply(Reply::Phone(crate::NEW_REAL));
    // After the invalidation: not joined to the old fetch.
    app.assert_phone(1, 1, PLAIN_CATEGORY, crate::NEW_REAL, "real")
        .await;
    // The old fetch answers its own caller but does not overwrite.
    before.await.unwrap().assert_number(REAL, "real");
    app.assert_phone(1, 1, PLAIN_CATEGORY, crate::NEW_REAL, "real")
        .await;
    assert_eq!(app.real.calls(), 2);
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
async fn a_calltracking_upstream_that_hangs_at_the_end_of_the_chain_serves_its_stale_number() {
    let app = TestApp::spawn_with(
        "[cache.real_phone]\nttl_s = 1\n[cache.calltracking]\nttl_s = 1\n\
         [upstreams.real_phone]\ntimeout_ms = 300\n[upstreams.calltracking]\ntimeout_ms = 300",
    )
    .await;
    app.enable_calltracking(42, 1).await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.assert_phone(42, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // The real number comes late in its timeout, then call tracking hangs:
    // its stale number is served, never the real one.
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(280));
    app.calltracking.reply(Reply::Hang);
    app.assert_phone(42, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
}

#[tokio::test]
async fn invalidation_drops_anonymous_and_calltracking_numbers() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.enable_calltracking(2, 1).await;
    app.assert_phone(1, 1, ANON_CATEGORY, ANON, "anonymous")
        .await;
    app.assert_phone(2, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    app.anonymous.reply(Reply::Phone(NEW_ANON));
    app.calltracking.reply(Reply::Phone(OTHER_VIRTUAL));
    // Still cached.
    app.assert_phone(1, 1, ANON_CATEGORY, ANON, "anonymous")
        .await;
    app.assert_phone(2, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    app.invalidate(&[1, 2]).await;
    app.assert_phone(1, 1, ANON_CATEGORY, NEW_ANON, "anonymous")
        .await;
    app.assert_phone(2, 1, PLAIN_CATEGORY, OTHER_VIRTUAL, "calltracking")
        .await;
    assert_eq!((app.anonymous.calls(), app.calltracking.calls()), (2, 2));
}

#[tokio::test]
async fn a_cache_at_capacity_evicts() {
    let app = TestApp::spawn_with("[cache.real_phone]\ncapacity = 10").await;
    app.real.reply(Reply::Phone(REAL));
    for user in 1..=100 {
        app.assert_phone(user, 1, PLAIN_CATEGORY, REAL, "real")
            .await;
    }
    assert_eq!(app.real.calls(), 100);
    for user in 1..=100 {
        app.assert_phone(user, 1, PLAIN_CATEGORY, REAL, "real")
            .await;
    }
    let again = app.real.calls() - 100;
    assert!(again >= 50, "only {again} of 100 asked again: not bounded");
}

/// Asks for the seller's number until it is `phone`; how long that took.
async fn answers(app: &TestApp, user: u64, phone: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let answer = app.phone(user, 1, PLAIN_CATEGORY).await;
        if answer.body["phone"] == phone {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "still {:?} after {limit:?}",
            answer.body["kind"]
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Replicas A and B, seller 5's old number cached on B, the new one upstream.
async fn b_caching_an_old_number(url: &str, overlay: &str) -> (TestApp, TestApp) {
    let (a, b) = TestApp::pair(url, overlay).await;
    b.real.reply(Reply::Phone(REAL));
    b.assert_phone(5, 1, PLAIN_CATEGORY, REAL, "real").await;
    b.real.reply(Reply::Phone(NEW_REAL));
    b.assert_phone(5, 1, PLAIN_CATEGORY, REAL, "real").await;
    (a, b)
}

/// An invalidation on A; B must ask again within `limit`.
async fn invalidation_on_a_reaches_b(overlay: &str, limit: Duration) -> Duration {
    let db = pg::or_skip!(pg::database().await);
    let (a, b) = b_caching_an_old_number(&db.url, overlay).await;
    let sent = Instant::now();
    a.invalidate(&[5]).await;
    answers(&b, 5, NEW_REAL, limit).await;
    sent.elapsed()
}

#[tokio::test]
async fn an_invalidation_on_one_replica_reaches_the_other_within_a_second() {
    let took = invalidation_on_a_reaches_b("", Duration::from_secs(1)).await;
    eprintln!("invalidation seen on the other replica after {took:?} (LISTEN)");
}

#[tokio::test]
async fn without_listen_an_invalidation_reaches_the_other_replica_by_the_poll() {
    let overlay = "[database]\nlisten = false\nsync_interval_ms = 300\n";
    // The poll's interval plus a round of slack.
    let took = invalidation_on_a_reaches_b(overlay, Duration::from_millis(900)).await;
    eprintln!("invalidation seen on the other replica after {took:?} (poll)");
}

/// docs/caching.md, "Invalidation": the change log is the record, so one
/// written without its NOTIFY still reaches B by its catch-up.
#[tokio::test]
async fn an_invalidation_whose_notification_is_lost_reaches_the_other_replica_by_its_sync() {
    let db = pg::or_skip!(pg::database().await);
    let overlay = "[database]\nsync_interval_ms = 300\n";
    let (_a, b) = b_caching_an_old_number(&db.url, overlay).await;
    let mut conn = crate::support::pg_connection(&db.url).await;
    let listening: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(listening, 2, "both replicas listen");
    let sent = Instant::now();
    sqlx::raw_sql(
        "BEGIN; \
         SELECT pg_advisory_xact_lock(x'6374737461747573'::bigint); \
         INSERT INTO cache_invalidations (change_seq, user_id) \
         VALUES (nextval('calltracking_change_seq'), 5); \
         COMMIT;",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    // The poll's interval plus a round of slack.
    answers(&b, 5, NEW_REAL, Duration::from_millis(900)).await;
    eprintln!(
        "an invalidation without its notification seen on the other replica after {:?}",
        sent.elapsed()
    );
}

/// One sent while B's listener is down reaches B by its catch-up too.
#[tokio::test]
async fn an_invalidation_sent_while_the_listener_is_down_reaches_the_other_replica() {
    let db = pg::or_skip!(pg::database().await);
    let overlay = "[database]\nsync_interval_ms = 300\n";
    let (a, b) = b_caching_an_old_number(&db.url, overlay).await;
    let mut conn = crate::support::pg_connection(&db.url).await;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(killed, [true, true], "both replicas' listeners killed");
    let sent = Instant::now();
    a.invalidate(&[5]).await;
    answers(&b, 5, NEW_REAL, Duration::from_millis(900)).await;
    eprintln!(
        "an invalidation sent while the listeners were down seen on the other replica after {:?}",
        sent.elapsed()
    );
}

#[tokio::test]
async fn a_fetch_in_flight_on_the_other_replica_is_not_written_back() {
    let db = pg::or_skip!(pg::database().await);
    let overlay = "[upstreams.real_phone]\ntimeout_ms = 3000\n";
    let (a, b) = TestApp::pair(&db.url, overlay).await;
    b.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(1500));
    let in_flight = b.phone_in_background(6, 1, PLAIN_CATEGORY);
    b.real
        .until_calls("B's fetch to reach its upstream", 1, Duration::from_secs(5))
        .await;
    // Once B has A's status change after the invalidation, it applied it.
    a.invalidate(&[6]).await;
    assert_eq!(a.set_status(900, true, 1).await, 200);
    b.converged(900, 1, Duration::from_secs(1)).await;
    b.real.reply(Reply::Phone(NEW_REAL));
    assert_eq!(
        in_flight.await.unwrap().status,
        200,
        "the request in flight is answered"
    );
    // What that fetch brought back was not kept: B asks again.
    b.assert_phone(6, 1, PLAIN_CATEGORY, NEW_REAL, "real").await;
}

#[tokio::test]
async fn with_the_database_down_an_invalidation_answers_503_and_drops_locally() {
    let db = pg::or_skip!(pg::cluster());
    let cluster = db.cluster.as_ref().unwrap();
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    a.real.reply(Reply::Phone(REAL));
    a.assert_phone(7, 1, PLAIN_CATEGORY, REAL, "real").await;
    cluster.stop_server().unwrap();
    a.real.reply(Reply::Phone(NEW_REAL));
    let answer = a
        .send_admin(Method::POST, INVALIDATE, &json!({ "user_ids": [7] }))
        .await;
    answer.assert_problem(503);
    assert!(answer.retry_after.is_some());
    // The caller retries; meanwhile this replica already asks again.
    a.assert_phone(7, 1, PLAIN_CATEGORY, NEW_REAL, "real").await;
    cluster.start_server().unwrap();
}

/// A disable and the next enable land in one catch-up of B: B never sees
/// tracking off, yet its cached forwarding number was released in between.
#[tokio::test]
async fn a_re_enable_after_a_disable_answers_the_new_forwarding_number_on_the_other_replica() {
    let db = pg::or_skip!(pg::database().await);
    let overlay = "[database]\nlisten = false\nsync_interval_ms = 1000\n";
    let (a, b) = TestApp::pair(&db.url, overlay).await;
    assert_eq!(a.set_status(8, true, 1).await, 200);
    b.converged(8, 1, Duration::from_secs(3)).await;
    b.real.reply(Reply::Phone(REAL));
    b.calltracking.reply(Reply::Phone(VIRTUAL));
    b.assert_phone(8, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    // Released and handed out anew while tracking was off.
    b.calltracking.reply(Reply::Phone(OTHER_VIRTUAL));
    assert_eq!(a.set_status(8, false, 2).await, 200);
    assert_eq!(a.set_status(8, true, 3).await, 200);
    b.converged(8, 3, Duration::from_secs(3)).await;
    b.assert_phone(8, 1, PLAIN_CATEGORY, OTHER_VIRTUAL, "calltracking")
        .await;
}

#[tokio::test]
async fn snapshots_that_turn_tracking_off_then_on_drop_the_forwarding_number() {
    let app = TestApp::spawn().await;
    app.enable_calltracking(9, 1).await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.assert_phone(9, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    app.calltracking.reply(Reply::Phone(OTHER_VIRTUAL));
    for (version, ids) in [(2, &[][..]), (3, &[9])] {
        let answer = app.put_snapshot(version, ids).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
    }
    app.assert_phone(9, 1, PLAIN_CATEGORY, OTHER_VIRTUAL, "calltracking")
        .await;
}
