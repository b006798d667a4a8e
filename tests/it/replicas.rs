//! Issue 4: replicas on one PostgreSQL converge within a second, through
//! notifications, a poll that covers lost ones, and catch-up after restarts.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::support::pg;
use crate::support::{Reply, TestApp};
use crate::{PLAIN_CATEGORY, REAL};

const STATUSES: &str = "/admin/v1/calltracking/statuses";

async fn set(app: &TestApp, user: u64, enabled: bool, version: u64) -> u16 {
    let body = json!({ "items": [{ "user_id": user, "enabled": enabled, "version": version }] });
    app.send_admin(Method::POST, STATUSES, &body).await.status
}

/// Waits until `app` reports `user` at `version`; returns how long it took.
async fn converged(app: &TestApp, user: u64, version: u64, limit: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        let got = app
            .status
            .set()
            .get(phones_gateway::domain::UserId::new(user).unwrap());
        if got.version == version {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("user {user} did not reach version {version} within {limit:?}");
}

#[tokio::test]
async fn a_change_on_one_replica_is_on_the_other_within_a_second() {
    let Some(db) = pg::database().await else {
        return;
    };
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    let b = TestApp::spawn_on(Some(&db.url), "").await;
    let mut took = Vec::new();
    for i in 1..=100u64 {
        let writer = if i % 2 == 0 { &a } else { &b };
        let reader = if i % 2 == 0 { &b } else { &a };
        // From the moment the webhook is sent until the other replica has it.
        let sent = Instant::now();
        assert_eq!(set(writer, 1000 + i, true, i).await, 200);
        converged(reader, 1000 + i, i, Duration::from_secs(1)).await;
        took.push(sent.elapsed());
    }
    took.sort();
    eprintln!(
        "replica convergence over 100 changes: p50 {:?}, max {:?}",
        took[49], took[99]
    );
    // And the other replica's selection follows: call tracking on at B after a
    // webhook at A.
    b.real.reply(Reply::Phone(REAL));
    b.calltracking.reply(Reply::Phone(crate::OTHER_VIRTUAL));
    assert_eq!(set(&a, 7, true, 1).await, 200);
    converged(&b, 7, 1, Duration::from_secs(1)).await;
    b.phone(7, 1, PLAIN_CATEGORY)
        .await
        .assert_number(crate::OTHER_VIRTUAL, "calltracking");
}

#[tokio::test]
async fn a_lost_notification_is_covered_by_the_poll() {
    let Some(db) = pg::database().await else {
        return;
    };
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    // A change committed without a notification (as if it were lost in transit).
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    sqlx::query(
        "INSERT INTO calltracking_status (user_id, enabled, version, change_seq) \
         VALUES (55, true, 9, nextval('calltracking_change_seq'))",
    )
    .execute(&pool)
    .await
    .unwrap();
    converged(&a, 55, 9, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_restarted_replica_catches_up_on_what_it_missed() {
    let Some(db) = pg::database().await else {
        return;
    };
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    let b = TestApp::spawn_on(Some(&db.url), "").await;
    assert_eq!(set(&a, 1, true, 1).await, 200);
    converged(&b, 1, 1, Duration::from_secs(1)).await;
    drop(b);
    for v in 2..=5 {
        assert_eq!(set(&a, 1, v % 2 == 1, v).await, 200);
    }
    let snapshot = json!({ "version": 6, "enabled_user_ids": [2, 3] });
    assert_eq!(
        a.send_admin(Method::PUT, STATUSES, &snapshot).await.status,
        200
    );
    let b = TestApp::spawn_on(Some(&db.url), "").await;
    let got = b.get_admin(&format!("{STATUSES}/1")).await.body;
    assert_eq!(got, json!({ "user_id": 1, "enabled": false, "version": 6 }));
    let got = b.get_admin(&format!("{STATUSES}/3")).await.body;
    assert_eq!(got, json!({ "user_id": 3, "enabled": true, "version": 6 }));
}

#[tokio::test]
async fn replicas_reconnect_and_converge_after_postgres_restarts() {
    let Some(db) = pg::cluster() else { return };
    let cluster = db.cluster.as_ref().unwrap();
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    let b = TestApp::spawn_on(Some(&db.url), "").await;
    assert_eq!(set(&a, 1, true, 1).await, 200);
    converged(&b, 1, 1, Duration::from_secs(1)).await;

    cluster.stop_server().unwrap();
    // The database is down: the webhook refuses, the public API keeps answering
    // from memory and the upstreams, and readiness holds.
    let down = a
        .send_admin(
            Method::POST,
            STATUSES,
            &json!({ "items": [{ "user_id": 2, "enabled": true, "version": 1 }] }),
        )
        .await;
    down.assert_problem(503);
    assert!(down.retry_after.is_some());
    a.real.reply(Reply::Phone(REAL));
    a.phone(2, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    assert_eq!(a.get_admin("/readyz").await.status, 200);
    assert_eq!(
        a.get_admin(&format!("{STATUSES}/2")).await.body["version"],
        0,
        "nothing applied"
    );

    cluster.start_server().unwrap();
    // Both reconnect by themselves; a change on A reaches B.
    let start = Instant::now();
    while set(&a, 3, true, 1).await != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "A never recovered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    converged(&b, 3, 1, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn sqlite_webhook_answers_503_when_the_database_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let app = TestApp::spawn_on(Some(&url), "").await;
    assert_eq!(set(&app, 1, true, 1).await, 200);
    // Another connection holds the write lock past the busy timeout.
    let db_file = dir.path().join("gw.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db_file.display()))
        .await
        .unwrap();
    sqlx::query("PRAGMA locking_mode = EXCLUSIVE")
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut *conn)
        .await
        .unwrap();
    let got = app
        .send_admin(
            Method::POST,
            STATUSES,
            &json!({ "items": [{ "user_id": 1, "enabled": false, "version": 2 }] }),
        )
        .await;
    got.assert_problem(503);
    sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
    drop(conn);
    pool.close().await;
    assert_eq!(
        app.get_admin(&format!("{STATUSES}/1")).await.body["version"],
        1,
        "memory unchanged"
    );
}

#[tokio::test]
async fn readyz_is_503_until_the_status_set_is_loaded() {
    let Some(db) = pg::cluster() else { return };
    let cluster = db.cluster.as_ref().unwrap();
    assert_eq!(
        set(&TestApp::spawn_on(Some(&db.url), "").await, 42, true, 1).await,
        200
    );
    // The database is down when a replica starts: it serves, but is not ready.
    cluster.stop_server().unwrap();
    let app = TestApp::start_on(Some(&db.url), "").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let not_yet = app.get_admin("/readyz").await;
    not_yet.assert_problem(503);
    assert_eq!(app.get_admin("/healthz").await.status, 200);
    cluster.start_server().unwrap();
    // Ready only once loaded, and then with what was stored.
    let start = Instant::now();
    while app.get_admin("/readyz").await.status != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        app.status
            .set()
            .is_enabled(phones_gateway::domain::UserId::new(42).unwrap())
    );
}

/// Sessions of the database that are listening for notifications.
async fn listeners(url: &str) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let n = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%'")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

#[tokio::test]
async fn without_listen_replicas_converge_by_the_poll_alone() {
    let Some(db) = pg::database().await else {
        return;
    };
    let overlay = "[database]\nlisten = false\nsync_interval_ms = 200";
    let a = TestApp::spawn_on(Some(&db.url), overlay).await;
    let b = TestApp::spawn_on(Some(&db.url), overlay).await;
    for i in 1..=5u64 {
        assert_eq!(set(&a, 2000 + i, true, i).await, 200);
        // Within a poll or two, with nobody listening.
        converged(&b, 2000 + i, i, Duration::from_secs(2)).await;
    }
    assert_eq!(listeners(&db.url).await, 0, "no session LISTENs");
    // The default does listen: the check above can tell.
    let listening = TestApp::spawn_on(Some(&db.url), "").await;
    crate::support::eventually("a listener", Duration::from_secs(5), || async {
        listeners(&db.url).await > 0
    })
    .await;
    drop(listening);
}
