//! One fleet, one truth (docs/caching.md "Invalidation", docs/status-sync.md
//! "Bounded calls"): an invalidation taken by one replica reaches the others, a
//! flip of call tracking drops forwarding numbers everywhere, and a database
//! that cannot answer makes a write answer 503 in bounded time, never hang.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::support::pg;
use crate::support::{Reply, TestApp};
use crate::{NEW_REAL, OTHER_VIRTUAL, PLAIN_CATEGORY, REAL, VIRTUAL};

const STATUSES: &str = "/admin/v1/calltracking/statuses";
const INVALIDATE: &str = "/admin/v1/cache/invalidate";

async fn set(app: &TestApp, user: u64, enabled: bool, version: u64) -> u16 {
    let body = json!({ "items": [{ "user_id": user, "enabled": enabled, "version": version }] });
    app.send_admin(Method::POST, STATUSES, &body).await.status
}

/// Waits until `app` holds `user` at `version`.
async fn converged(app: &TestApp, user: u64, version: u64, limit: Duration) {
    let start = Instant::now();
    let user_id = phones_gateway::domain::UserId::new(user).unwrap();
    while app.status.set().get(user_id).version != version {
        assert!(
            start.elapsed() < limit,
            "user {user} did not reach version {version} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asks `app` for the seller's number until it is `phone`; returns how long
/// that took, or fails after `limit`.
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

/// Replica B cached the seller's number; the invalidation goes to A; B must
/// ask its upstream again within `limit`.
async fn invalidation_on_a_reaches_b(overlay: &str, limit: Duration) -> Duration {
    let Some(db) = pg::database().await else {
        return Duration::ZERO;
    };
    let a = TestApp::spawn_on(Some(&db.url), overlay).await;
    let b = TestApp::spawn_on(Some(&db.url), overlay).await;
    b.real.reply(Reply::Phone(REAL));
    b.phone(5, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    // The seller changed the number: B's upstream knows, B's cache does not.
    b.real.reply(Reply::Phone(NEW_REAL));
    b.phone(5, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
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
    // The poll's interval, plus a round of slack for two busy cores.
    let took = invalidation_on_a_reaches_b(overlay, Duration::from_millis(900)).await;
    eprintln!("invalidation seen on the other replica after {took:?} (poll)");
}

#[tokio::test]
async fn a_fetch_in_flight_on_the_other_replica_is_not_written_back() {
    let Some(db) = pg::database().await else {
        return;
    };
    // Room for a slow upstream call.
    let overlay = "[upstreams.real_phone]\ntimeout_ms = 3000\n";
    let a = TestApp::spawn_on(Some(&db.url), overlay).await;
    let b = TestApp::spawn_on(Some(&db.url), overlay).await;
    // B starts a fetch of the old number that takes a while.
    b.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(1500));
    let in_flight = {
        let public = b.public.clone();
        let http = b.http.clone();
        tokio::spawn(async move {
            http.get(format!(
                "{public}/v1/public-phone?user_id=6&ad_id=1&category_id={PLAIN_CATEGORY}"
            ))
            .send()
            .await
            .unwrap()
            .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The invalidation lands on A while B's fetch is under way; a status change
    // after it is a marker: once B has that, it has applied the invalidation.
    a.invalidate(&[6]).await;
    assert_eq!(set(&a, 900, true, 1).await, 200);
    converged(&b, 900, 1, Duration::from_secs(1)).await;
    b.real.reply(Reply::Phone(NEW_REAL));
    assert_eq!(
        in_flight.await.unwrap(),
        200,
        "the request in flight is answered"
    );
    // What that fetch brought back was not kept: B asks again.
    b.phone(6, 1, PLAIN_CATEGORY)
        .await
        .assert_number(NEW_REAL, "real");
}

#[tokio::test]
async fn with_the_database_down_an_invalidation_answers_503_and_drops_locally() {
    let Some(db) = pg::cluster() else { return };
    let cluster = db.cluster.as_ref().unwrap();
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    a.real.reply(Reply::Phone(REAL));
    a.phone(7, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    cluster.stop_server().unwrap();
    a.real.reply(Reply::Phone(NEW_REAL));
    let answer = a
        .send_admin(Method::POST, INVALIDATE, &json!({ "user_ids": [7] }))
        .await;
    answer.assert_problem(503);
    assert!(answer.retry_after.is_some());
    // The caller retries; meanwhile this replica already asks again.
    a.phone(7, 1, PLAIN_CATEGORY)
        .await
        .assert_number(NEW_REAL, "real");
    cluster.start_server().unwrap();
}

/// A disable and the next enable both land in one catch-up of B (polling,
/// with a long interval): B never sees call tracking off, yet the forwarding
/// number it cached before was released in between.
#[tokio::test]
async fn a_re_enable_after_a_disable_answers_the_new_forwarding_number_on_the_other_replica() {
    let Some(db) = pg::database().await else {
        return;
    };
    let overlay = "[database]\nlisten = false\nsync_interval_ms = 1000\n";
    let a = TestApp::spawn_on(Some(&db.url), overlay).await;
    let b = TestApp::spawn_on(Some(&db.url), overlay).await;
    assert_eq!(set(&a, 8, true, 1).await, 200);
    converged(&b, 8, 1, Duration::from_secs(3)).await;
    b.real.reply(Reply::Phone(REAL));
    b.calltracking.reply(Reply::Phone(VIRTUAL));
    b.phone(8, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    // Released and handed out anew while tracking was off.
    b.calltracking.reply(Reply::Phone(OTHER_VIRTUAL));
    assert_eq!(set(&a, 8, false, 2).await, 200);
    assert_eq!(set(&a, 8, true, 3).await, 200);
    converged(&b, 8, 3, Duration::from_secs(3)).await;
    b.phone(8, 1, PLAIN_CATEGORY)
        .await
        .assert_number(OTHER_VIRTUAL, "calltracking");
}

#[tokio::test]
async fn snapshots_that_turn_tracking_off_then_on_drop_the_forwarding_number() {
    let app = TestApp::spawn().await;
    app.enable_calltracking(9, 1).await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.phone(9, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    app.calltracking.reply(Reply::Phone(OTHER_VIRTUAL));
    for (version, ids) in [(2, json!([])), (3, json!([9]))] {
        let snapshot = json!({ "version": version, "enabled_user_ids": ids });
        let answer = app.send_admin(Method::PUT, STATUSES, &snapshot).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
    }
    app.phone(9, 1, PLAIN_CATEGORY)
        .await
        .assert_number(OTHER_VIRTUAL, "calltracking");
}

/// Another session holds every table (a stuck migration): writes answer 503
/// within the lock bound and apply nothing, and are taken once it lets go.
#[tokio::test]
async fn with_every_table_locked_writes_answer_503_in_bounded_time_and_apply_nothing() {
    let Some(db) = pg::database().await else {
        return;
    };
    let a = TestApp::spawn_on(Some(&db.url), "[database]\nlock_timeout_ms = 500\n").await;
    let mut locker = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    sqlx::Executor::execute(
        &mut locker,
        "BEGIN; LOCK TABLE calltracking_status, cache_invalidations, status_feed_cursor, \
         reveals, ad_reveal_counts IN ACCESS EXCLUSIVE MODE",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let writes = [
        (
            Method::POST,
            STATUSES,
            json!({ "items": [{ "user_id": 10, "enabled": true, "version": 1 }] }),
        ),
        (
            Method::PUT,
            STATUSES,
            json!({ "version": 4, "enabled_user_ids": [10] }),
        ),
        (Method::POST, INVALIDATE, json!({ "user_ids": [10] })),
    ];
    for (method, path, body) in &writes {
        let sent = Instant::now();
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            a.send_admin(method.clone(), path, body),
        )
        .await
        .unwrap_or_else(|_| panic!("{method} {path} hung with the tables locked"));
        answer.assert_problem(503);
        assert!(
            sent.elapsed() < Duration::from_secs(3),
            "{method} {path} took {:?}",
            sent.elapsed()
        );
    }
    eprintln!("three writes refused in {:?}", started.elapsed());
    // The public API never waits on the database.
    a.real.reply(Reply::Phone(REAL));
    a.phone(11, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    sqlx::Executor::execute(&mut locker, "ROLLBACK")
        .await
        .unwrap();
    let stored = a.get_admin(&format!("{STATUSES}/10")).await;
    assert_eq!(
        stored.body["version"], 0,
        "nothing applied: {:?}",
        stored.body
    );
    for (method, path, body) in &writes {
        let answer = a.send_admin(method.clone(), path, body).await;
        assert_eq!(answer.status, 200, "{method} {path}: {:?}", answer.body);
    }
}
