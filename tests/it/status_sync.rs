//! docs/status-sync.md: the call-tracking status set (webhook, snapshot and
//! its floor), replicas converging, what each costs the database, durability,
//! the status feed and its leadership, and PgBouncer in transaction mode.

use crate::support::child::Process;
use crate::support::paths::{
    HEALTHZ, INVALIDATE, READYZ, REVEALS, STATUSES, ad_reveals_path, status_path,
};
use crate::support::pgbouncer::{pooled, server_connections, through};
use crate::support::{Reply, TestApp, captured_logs, eventually, json_with_token, pg};
use crate::{PLAIN_CATEGORY, REAL, VIRTUAL};
use phones_gateway::domain::UserId;
use phones_gateway::sim::{self, SimConfig};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_change_on_one_replica_is_on_the_other_within_a_second() {
    let db = pg::or_skip!(pg::database().await);
    let (a, b) = TestApp::pair(&db.url, "").await;
    let mut took = Vec::new();
    for i in 1..=100u64 {
        let writer = if i % 2 == 0 { &a } else { &b };
        let reader = if i % 2 == 0 { &b } else { &a };
        let sent = Instant::now();
        assert_eq!(writer.set_status(1000 + i, true, i).await, 200);
        reader.converged(1000 + i, i, Duration::from_secs(1)).await;
        took.push(sent.elapsed());
    }
    took.sort();
    eprintln!(
        "replica convergence over 100 changes: p50 {:?}, max {:?}",
        took[49], took[99]
    );
    // B's selection follows a webhook at A.
    b.real.reply(Reply::Phone(REAL));
    b.calltracking.reply(Reply::Phone(crate::OTHER_VIRTUAL));
    assert_eq!(a.set_status(7, true, 1).await, 200);
    b.converged(7, 1, Duration::from_secs(1)).await;
    b.assert_phone(7, 1, PLAIN_CATEGORY, crate::OTHER_VIRTUAL, "calltracking")
        .await;
}

#[tokio::test]
async fn a_lost_notification_is_covered_by_the_poll() {
    let db = pg::or_skip!(pg::database().await);
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    // A change committed without a notification.
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    sqlx::query(
        "INSERT INTO calltracking_status (user_id, enabled, version, change_seq) \
         VALUES (55, true, 9, nextval('calltracking_change_seq'))",
    )
    .execute(&pool)
    .await
    .unwrap();
    a.converged(55, 9, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_restarted_replica_catches_up_on_what_it_missed() {
    let db = pg::or_skip!(pg::database().await);
    let (a, b) = TestApp::pair(&db.url, "").await;
    assert_eq!(a.set_status(1, true, 1).await, 200);
    b.converged(1, 1, Duration::from_secs(1)).await;
    drop(b);
    for v in 2..=5 {
        assert_eq!(a.set_status(1, v % 2 == 1, v).await, 200);
    }
    assert_eq!(a.put_snapshot(6, &[2, 3]).await.status, 200);
    let b = TestApp::spawn_on(Some(&db.url), "").await;
    let got = b.get_admin(&status_path(1)).await.body;
    assert_eq!(got, json!({ "user_id": 1, "enabled": false, "version": 6 }));
    let got = b.get_admin(&status_path(3)).await.body;
    assert_eq!(got, json!({ "user_id": 3, "enabled": true, "version": 6 }));
}

#[tokio::test]
async fn replicas_reconnect_and_converge_after_postgres_restarts() {
    let db = pg::or_skip!(pg::cluster());
    let _timing = crate::support::one_timing_test_at_a_time().await;
    let cluster = db.cluster.as_ref().unwrap();
    let (a, b) = TestApp::pair(&db.url, "").await;
    assert_eq!(a.set_status(1, true, 1).await, 200);
    b.converged(1, 1, Duration::from_secs(1)).await;

    cluster.stop_server().unwrap();
    // Database down: the webhook refuses, lookups and readiness hold.
    let down = a.send_status(2, true, 1).await;
    down.assert_problem(503);
    assert!(down.retry_after.is_some());
    a.real.reply(Reply::Phone(REAL));
    a.assert_phone(2, 1, PLAIN_CATEGORY, REAL, "real").await;
    assert_eq!(a.get_admin(READYZ).await.status, 200);
    assert_eq!(
        a.get_admin(&status_path(2)).await.body["version"],
        0,
        "nothing applied"
    );

    cluster.start_server().unwrap();
    // Both reconnect; a change on A reaches B within 1 s of its 2xx.
    let start = Instant::now();
    while a.set_status(3, true, 1).await != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "A never recovered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = b.converged(3, 1, Duration::from_secs(10)).await;
    assert!(
        took < Duration::from_secs(1),
        "the change reached B {took:?} after A's 2xx (docs/status-sync.md: within 1 s)"
    );
}

#[tokio::test]
async fn sqlite_webhook_answers_503_when_the_database_is_gone() {
    let (dir, url) = crate::support::sqlite_file("gw.db");
    let app = TestApp::spawn_on(Some(&url), "").await;
    assert_eq!(app.set_status(1, true, 1).await, 200);
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
    let got = app.send_status(1, false, 2).await;
    got.assert_problem(503);
    sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
    drop(conn);
    pool.close().await;
    assert_eq!(
        app.get_admin(&status_path(1)).await.body["version"],
        1,
        "memory unchanged"
    );
}

#[tokio::test]
async fn readyz_is_503_until_the_status_set_is_loaded() {
    let db = pg::or_skip!(pg::cluster());
    let cluster = db.cluster.as_ref().unwrap();
    assert_eq!(
        TestApp::spawn_on(Some(&db.url), "")
            .await
            .set_status(42, true, 1)
            .await,
        200
    );
    // The database is down when a replica starts: it serves, but is not ready.
    cluster.stop_server().unwrap();
    let app = TestApp::start_on(Some(&db.url), "").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let not_yet = app.get_admin(READYZ).await;
    not_yet.assert_problem(503);
    assert_eq!(app.get_admin(HEALTHZ).await.status, 200);
    cluster.start_server().unwrap();
    let start = Instant::now();
    while app.get_admin(READYZ).await.status != 200 {
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

/// The catch-up read's text, by which a proxy sees each read begin.
pub const CATCH_UP_SQL: &str = "false AS invalidation";

/// docs/status-sync.md: with `database.listen = false`, a change reaches the
/// other replica by polling alone, within `database.sync_interval_ms` of its
/// 2xx. Each change commits mid-way between two reads, not where jitter decides.
#[tokio::test]
async fn without_listen_replicas_converge_by_the_poll_alone() {
    const SYNC_INTERVAL: Duration = Duration::from_millis(200);
    let db = pg::or_skip!(pg::database().await);
    let _timing = crate::support::one_timing_test_at_a_time().await;
    let overlay = format!(
        "[database]\nlisten = false\nsync_interval_ms = {}",
        SYNC_INTERVAL.as_millis()
    );
    let a = TestApp::spawn_on(Some(&db.url), &overlay).await;
    let (proxy, through) = crate::support::proxy::Proxy::in_front_of(&db.url).await;
    let b = TestApp::spawn_on(Some(&through), &overlay).await;
    let reads = proxy.watch(CATCH_UP_SQL);
    let mut took = Vec::new();
    for i in 1..=5u64 {
        // One of B's reads begins; the change goes out a phase later.
        let before = reads.count();
        eventually("a poll of B's", Duration::from_secs(5), || async {
            reads.count() > before
        })
        .await;
        let polled = *reads.times().last().unwrap();
        let phase = SYNC_INTERVAL / 5 + SYNC_INTERVAL * u32::try_from(i - 1).unwrap() / 8;
        tokio::time::sleep_until((polled + phase).into()).await;
        assert_eq!(a.set_status(2000 + i, true, i).await, 200);
        let user = UserId::new(2000 + i).unwrap();
        let learnt =
            crate::support::took_until("the poll to bring it", Duration::from_secs(5), || {
                b.status.set().get(user).version == i
            })
            .await;
        took.push((phase, learnt));
    }
    eprintln!("(phase after a read of B's, learnt after the 2xx): {took:?}");
    for (phase, learnt) in &took {
        assert!(
            *learnt < SYNC_INTERVAL,
            "a change sent {phase:?} after a poll of B's reached it {learnt:?} after its 2xx, \
             past database.sync_interval_ms = {SYNC_INTERVAL:?} (all: {took:?})"
        );
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

/// docs/status-sync.md, cluster size: an idle replica's steady load is one
/// catch-up query per `database.sync_interval_ms`, and the poll does run.
#[tokio::test]
async fn idle_a_replica_reads_the_change_log_once_per_sync_interval() {
    const SYNC_INTERVAL: Duration = Duration::from_millis(100);
    const WINDOW: Duration = Duration::from_secs(2);
    let db = pg::or_skip!(pg::database().await);
    let overlay = format!(
        "[database]\nsync_interval_ms = {}",
        SYNC_INTERVAL.as_millis()
    );
    let (proxy, through) = crate::support::proxy::Proxy::in_front_of(&db.url).await;
    let a = TestApp::spawn_on(Some(&through), &overlay).await;
    let others = [
        TestApp::spawn_on(Some(&db.url), &overlay).await,
        TestApp::spawn_on(Some(&db.url), &overlay).await,
    ];
    let reads = proxy.watch(CATCH_UP_SQL);
    // Past the start's catch-ups.
    eventually("A listening", Duration::from_secs(10), || async {
        listeners(&db.url).await >= 3
    })
    .await;
    tokio::time::sleep(SYNC_INTERVAL * 2).await;
    let start = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let end = Instant::now();
    let counted = reads.between(start, end);
    let intervals = end.duration_since(start).as_millis() / SYNC_INTERVAL.as_millis();
    let most = usize::try_from(intervals).unwrap() + 1;
    eprintln!(
        "catch-up reads of an idle replica in {:?}: {counted} (sync_interval_ms {SYNC_INTERVAL:?})",
        end - start
    );
    assert!(
        counted <= most,
        "{counted} catch-up reads in {:?}, more than one per database.sync_interval_ms \
         ({SYNC_INTERVAL:?}: at most {most})",
        end - start
    );
    assert!(
        counted * 2 >= most - 1,
        "{counted} catch-up reads in {:?}: the poll ({SYNC_INTERVAL:?}) hardly ran",
        end - start
    );
    assert!(a.status.is_loaded() && others.iter().all(|o| o.status.is_loaded()));
}

/// One round of load on `app`: requests at once, then a snapshot.
async fn load_round(app: &TestApp, round: u64) {
    let mut asks = Vec::new();
    for k in 0..24u64 {
        let user = 1 + (round * 24 + k) % 50;
        asks.push(async move {
            let answer = match k % 6 {
                0..=2 => app.get_admin(&format!("{REVEALS}?user_id={user}")).await,
                3 => app.send_status(1000 + user, round % 2 == 0, round).await,
                4 => {
                    let body = json!({ "user_ids": [user] });
                    app.send_admin(Method::POST, INVALIDATE, &body).await
                }
                _ => {
                    let viewer = format!("viewer-{k}");
                    let path = crate::support::paths::phone_path(user, 1, PLAIN_CATEGORY);
                    app.get_public_as(Some(&viewer), &path).await
                }
            };
            assert_eq!(answer.status, 200, "{answer:?}");
        });
    }
    futures_util::future::join_all(asks).await;
    let answer = app.put_snapshot(10_000 + round, &[round]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// docs/status-sync.md, cluster size: a replica costs the database at most its
/// pool, one listener and one while it leads the feed. Loaded past its pool, each
/// reached that bound (so a larger pool would show) and went no further.
#[tokio::test]
async fn a_replica_holds_its_pool_one_connection_for_notifications_and_one_while_leading() {
    const POOL: u64 = 3;
    let db = pg::or_skip!(pg::database().await);
    let feed_url = feed(20).await;
    let common = format!(
        "[database]\nmax_connections = {POOL}\nsync_interval_ms = 100\n\
         [rate_limit]\nper_viewer_per_minute = 10000\nexchange_interval_ms = 100\n\
         [reveals]\nflush_interval_ms = 50\n\
         [upstreams.calltracking]\nbase_url = \"{feed_url}\"\n"
    );
    let leading = format!(
        "{common}[upstreams.calltracking.status_feed]\nenabled = true\n\
         interval_ms = 100\nlimit = 7\nlease_ttl_ms = 1500\n"
    );
    let (proxy_a, through_a) = crate::support::proxy::Proxy::in_front_of(&db.url).await;
    let (proxy_b, through_b) = crate::support::proxy::Proxy::in_front_of(&db.url).await;
    let a = TestApp::spawn_on(Some(&through_a), &leading).await;
    wait_for("A to lead the feed", Duration::from_secs(10), || {
        a.status.is_feed_leader() && enabled(&a, 80)
    })
    .await;
    let b = TestApp::spawn_on(Some(&through_b), &common).await;
    for app in [&a, &b] {
        app.real.reply(Reply::Phone(REAL));
    }
    for round in 1..=10 {
        tokio::join!(load_round(&a, round), load_round(&b, round));
    }
    assert!(a.status.is_feed_leader() && !b.status.is_feed_leader());
    let (most_a, most_b) = (proxy_a.most_open(), proxy_b.most_open());
    eprintln!(
        "connections at once, pool of {POOL}: A (leading) {most_a}, B {most_b}; open now {}, {}",
        proxy_a.open(),
        proxy_b.open()
    );
    assert!(
        most_a <= POOL + 2,
        "A, leading the feed, held {most_a} connections at once \
         (max_connections {POOL}, plus one for notifications and one while leading)"
    );
    assert!(
        most_b <= POOL + 1,
        "B held {most_b} connections at once (max_connections {POOL}, plus one for notifications)"
    );
    assert!(
        most_a > POOL && most_b > POOL,
        "the load did not fill the pools: A {most_a}, B {most_b}, pool {POOL} + a listener"
    );
}

/// A pool busy past its acquire timeout: the sync loop's catch-up fails saying
/// every pooled connection stayed busy, without opening one more. The gateway
/// runs as a process so that the log read is its own.
#[tokio::test]
async fn a_busy_pool_is_explained_without_one_more_connection() {
    let db = pg::or_skip!(pg::database().await);
    let (proxy, through) = crate::support::proxy::Proxy::in_front_of(&db.url).await;
    let process = Process::start_with(
        &through,
        &[
            ("DATABASE__MAX_CONNECTIONS", "1"),
            ("DATABASE__LISTEN", "false"),
            ("DATABASE__LOCK_TIMEOUT_MS", "5000"),
        ],
    )
    .await;
    let status = |enabled: bool, version: u64| {
        let items = json!({ "items": [{ "user_id": 7, "enabled": enabled, "version": version }] });
        process.send(Method::POST, items)
    };
    assert_eq!(status(true, 1).await, 200);
    eventually(
        "start-up's connections closed",
        Duration::from_secs(10),
        || {
            let one = proxy.open() <= 1;
            async move { one }
        },
    )
    .await;
    proxy.reset_most();
    let mut locker = crate::support::pg_connection(&db.url).await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(x'6374737461747573'::bigint)")
        .execute(&mut locker)
        .await
        .unwrap();
    let blocked = status(false, 2);
    let release = async {
        tokio::time::sleep(Duration::from_millis(3600)).await;
        sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    };
    let (blocked, ()) = tokio::join!(blocked, release);
    assert_eq!(blocked, 200);
    let lines = process.child.lines_so_far();
    assert!(
        lines
            .iter()
            .any(|line| line.contains("every pooled connection stayed busy")),
        "the pool timeout was not explained in {} lines",
        lines.len()
    );
    assert_eq!(
        proxy.most_open(),
        1,
        "a replica with a pool of one held more connections at once"
    );
}

#[tokio::test]
async fn webhook_applies_newer_versions_in_order_and_ignores_the_rest() {
    let app = TestApp::spawn().await;
    let body = json!({ "items": [
        { "user_id": 42, "enabled": true, "version": 17 },
        { "user_id": 42, "enabled": false, "version": 17 },
        { "user_id": 42, "enabled": false, "version": 3 },
        { "user_id": 43, "enabled": true, "version": 1 },
    ]});
    let got = app.send_admin(Method::POST, STATUSES, &body).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.body, json!({ "applied": 2, "ignored": 2 }));
    assert_status(&app, 42, true, 17).await;
    let got = app.send_admin(Method::POST, STATUSES, &body).await;
    assert_eq!(got.body, json!({ "applied": 0, "ignored": 4 }));
    let got = app.send_status(42, false, 18).await;
    assert_eq!(got.body, json!({ "applied": 1, "ignored": 0 }));
    assert_status(&app, 42, false, 18).await;
    assert_status(&app, 44, false, 0).await;
}

#[tokio::test]
async fn the_status_set_decides_calltracking() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.assert_phone(42, 1, PLAIN_CATEGORY, REAL, "real").await;
    app.enable_calltracking(42, 1).await;
    app.assert_phone(42, 2, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    assert_eq!(app.set_status(42, false, 2).await, 200);
    app.assert_phone(42, 3, PLAIN_CATEGORY, REAL, "real").await;
}

#[tokio::test]
async fn snapshot_enables_exactly_the_listed_users_except_newer_entries() {
    let app = TestApp::spawn().await;
    let deltas = json!({ "items": [
        { "user_id": 1, "enabled": true, "version": 5 },
        { "user_id": 2, "enabled": true, "version": 50 },
        { "user_id": 3, "enabled": false, "version": 50 },
    ]});
    app.send_admin(Method::POST, STATUSES, &deltas).await;
    let got = app.put_snapshot(10, &[3, 4, 4]).await;
    assert_eq!(got.status, 200, "{got:?}");
    let status = |user| {
        let app = &app;
        async move { app.get_admin(&status_path(user)).await.body }
    };
    assert_eq!(
        status(1).await,
        json!({ "user_id": 1, "enabled": false, "version": 10 })
    );
    assert_eq!(
        status(2).await,
        json!({ "user_id": 2, "enabled": true, "version": 50 })
    );
    assert_eq!(
        status(3).await,
        json!({ "user_id": 3, "enabled": false, "version": 50 })
    );
    assert_eq!(
        status(4).await,
        json!({ "user_id": 4, "enabled": true, "version": 10 })
    );
    // Deltas older than the snapshot's version no longer apply to its entries.
    let late = app.send_status(1, true, 9).await;
    assert_eq!(late.body, json!({ "applied": 0, "ignored": 1 }));
}

#[tokio::test]
async fn snapshot_bodies_stream_in_any_key_order_and_bad_ones_change_nothing() {
    let app =
        TestApp::spawn_with("[server]\nmax_body_bytes = 1000\nmax_snapshot_bytes = 200000").await;
    let headers = json_with_token();
    let put = |body: String| app.admin_request(Method::PUT, STATUSES, &headers, body);
    // Version after the ids, unknown keys, over the ordinary body limit.
    let ids: Vec<u64> = (1..=20_000).collect();
    let body = format!(
        r#"{{"enabled_user_ids": {}, "note": {{"x": [1, "y"]}}, "version": 4}}"#,
        json!(ids)
    );
    assert!(body.len() > 1000);
    let got = put(body).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        app.get_admin(&status_path(20000)).await.body["enabled"],
        true
    );

    // A bad id deep in the body, trailing garbage, over the snapshot limit:
    // nothing applies.
    let mut bad = ids.clone();
    bad[15_000] = 0;
    let got = put(format!(
        r#"{{"version": 5, "enabled_user_ids": {}}}"#,
        json!(bad)
    ))
    .await;
    got.assert_problem(400);
    assert!(got.detail().contains("enabled_user_ids[15000]"), "{got:?}");
    put(r#"{"version": 5, "enabled_user_ids": [1]} x"#.to_string())
        .await
        .assert_problem(400);
    put(r#"{"version": 5, "enabled_user_ids": [1], "enabled_user_ids": [2]}"#.to_string())
        .await
        .assert_problem(400);
    put(r#"{"version": 5, "enabled_user_ids": [1.5]}"#.to_string())
        .await
        .assert_problem(400);
    let huge: Vec<u64> = (1..=40_000).collect();
    put(format!(
        r#"{{"version": 5, "enabled_user_ids": {}}}"#,
        json!(huge)
    ))
    .await
    .assert_problem(413);
    assert_status(&app, 1, true, 4).await;
}

#[tokio::test]
async fn a_webhook_of_ten_thousand_items_applies_in_one_delivery() {
    let app = TestApp::spawn().await;
    let items: Vec<_> = (1..=10_000u64)
        .map(|u| json!({ "user_id": u, "enabled": u % 2 == 0, "version": 1 }))
        .collect();
    let got = app
        .send_admin(Method::POST, STATUSES, &json!({ "items": items }))
        .await;
    assert_eq!(
        got.body,
        json!({ "applied": 10_000, "ignored": 0 }),
        "{got:?}"
    );
    assert_status(&app, 10_000, true, 1).await;
}

/// A trickling snapshot upload holds no pooled connection: with more open than
/// the pool, webhooks still answer 200, and an upload that ends applies.
#[tokio::test]
async fn slow_snapshot_uploads_hold_no_database_connection() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const UPLOADS: usize = 12;
    let app = TestApp::spawn_with(&format!("[server]\nmax_snapshot_uploads = {UPLOADS}")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let admin = app.admin.trim_start_matches("http://").to_owned();
    let chunk = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
    let mut uploads = Vec::new();
    for _ in 0..UPLOADS {
        let mut stream = tokio::net::TcpStream::connect(&admin).await.unwrap();
        let head = format!(
            "PUT {STATUSES} HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\
             content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{}",
            crate::support::bearer(),
            chunk(r#"{"version": 9, "enabled_user_ids": ["#)
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let stop = stop.clone();
        uploads.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                stream.write_all(chunk("7, ").as_bytes()).await.unwrap();
            }
            stream
        }));
    }
    // Every upload holds one of `max_snapshot_uploads` places: one more is
    // refused 503 before its body is read (with a place it would be 400).
    crate::support::eventually(
        "every upload to hold its place",
        Duration::from_secs(10),
        || async {
            let probe = "not a snapshot";
            let headers = crate::support::json_with_token();
            app.admin_request(Method::PUT, STATUSES, &headers, probe)
                .await
                .status
                == 503
        },
    )
    .await;
    for user in 1..=3u64 {
        let answer = tokio::time::timeout(
            Duration::from_secs(30),
            app.send_status(100 + user, true, 1),
        )
        .await
        .expect("a webhook hung behind slow snapshot uploads");
        assert_eq!(answer.status, 200, "webhook {user}: {answer:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let mut streams = Vec::new();
    for upload in uploads {
        streams.push(upload.await.unwrap());
    }
    // One upload ends and applies (user 7 on at 9; the webhook's users off).
    let mut last = streams.pop().unwrap();
    last.write_all(format!("{}0\r\n\r\n", chunk("8]}")).as_bytes())
        .await
        .unwrap();
    let mut answer = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(30), last.read(&mut answer))
        .await
        .expect("the finished upload was not answered")
        .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    drop(streams);
    assert_status(&app, 7, true, 9).await;
    assert_status(&app, 8, true, 9).await;
    assert_status(&app, 101, false, 9).await;
}

/// docs/api.md: an entry above the snapshot's version keeps its state; one at
/// exactly V takes the snapshot's.
#[tokio::test]
async fn a_snapshot_overrides_an_entry_at_exactly_its_version() {
    let app = TestApp::spawn().await;
    let items = json!({ "items": [
        { "user_id": 1, "enabled": true, "version": 7 },
        { "user_id": 2, "enabled": false, "version": 7 },
        { "user_id": 3, "enabled": true, "version": 8 },
    ]});
    assert_eq!(
        app.send_admin(Method::POST, STATUSES, &items).await.status,
        200
    );
    let got = app.put_snapshot(7, &[2]).await;
    assert_eq!(got.status, 200, "{got:?}");
    for (user, enabled, version) in [(1, false, 7), (2, true, 7), (3, true, 8)] {
        assert_status(&app, user, enabled, version).await;
    }
}

fn feed_overlay() -> &'static str {
    r#"
    [upstreams.calltracking.status_feed]
    enabled = true
    interval_ms = 50
    limit = 7
    "#
}

fn feed_items(users: std::ops::RangeInclusive<u64>) -> Vec<(u64, bool, u64)> {
    users.map(|user| (user, true, 1)).collect()
}

async fn status_of(app: &TestApp, user: u64) -> Value {
    app.get_admin(&status_path(user)).await.body
}

/// docs/status-sync.md: the first poll has no `after`; a restarted replica
/// resumes from its stored cursor.
#[tokio::test]
async fn a_restarted_replica_resumes_the_feed_from_its_stored_cursor() {
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let first = TestApp::spawn_on(Some(&url), feed_overlay()).await;
    first.calltracking.feed(&feed_items(1..=30));
    eventually("the whole feed", Duration::from_secs(10), || async {
        status_of(&first, 30).await["enabled"] == true
    })
    .await;
    let polls = first.calltracking.feed_uris();
    assert_eq!(polls[0], "/v1/statuses?limit=7", "{polls:?}");
    assert!(polls.iter().any(|p| p.contains("after=28")), "{polls:?}");
    drop(first);

    let second = TestApp::spawn_on(Some(&url), feed_overlay()).await;
    second.calltracking.feed(&feed_items(1..=33));
    eventually("the feed's new items", Duration::from_secs(10), || async {
        status_of(&second, 33).await["enabled"] == true
    })
    .await;
    let polls = second.calltracking.feed_uris();
    assert!(
        polls[0].contains("after=30"),
        "resumed from the start, not the stored cursor: {polls:?}"
    );
    assert!(polls.iter().all(|p| p.contains("after=")), "{polls:?}");
}

/// PUT a snapshot at 100 listing only user 1, then a late delta for user 7.
async fn snapshot_then_late_delta(app: &TestApp) {
    let put = app.put_snapshot(100, &[1]).await;
    assert_eq!(put.status, 200, "{put:?}");
    let late = app.send_status(7, true, 50).await;
    assert_eq!(late.body, json!({ "applied": 0, "ignored": 1 }), "{late:?}");
}

async fn assert_status(app: &TestApp, user: u64, enabled: bool, version: u64) {
    let got = app.get_admin(&status_path(user)).await;
    assert_eq!(
        got.body,
        json!({ "user_id": user, "enabled": enabled, "version": version }),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_snapshot_speaks_for_users_it_never_saw_and_survives_a_restart() {
    let (_dir, url) = crate::support::sqlite_file("floor.db");
    let mut app = TestApp::spawn_on(Some(&url), "").await;
    snapshot_then_late_delta(&app).await;
    assert_status(&app, 7, false, 100).await;
    assert_status(&app, 1, true, 100).await;
    app.shutdown().await.unwrap().unwrap();

    let app = TestApp::spawn_on(Some(&url), "").await;
    assert_status(&app, 7, false, 100).await;
    let got = app.send_status(8, true, 100).await;
    assert_eq!(got.body, json!({ "applied": 0, "ignored": 1 }), "{got:?}");
    let got = app.send_status(8, true, 101).await;
    assert_eq!(got.body, json!({ "applied": 1, "ignored": 0 }), "{got:?}");
    assert_status(&app, 8, true, 101).await;
    // An older snapshot arriving late lowers nothing.
    assert_eq!(app.put_snapshot(90, &[7]).await.status, 200);
    assert_status(&app, 7, false, 100).await;
    assert_status(&app, 9, false, 100).await;
}

#[tokio::test]
async fn every_replica_agrees_on_the_snapshot_floor_on_postgres() {
    let db = pg::or_skip!(pg::database().await);
    let (a, b) = TestApp::pair(&db.url, "").await;
    let put = a.put_snapshot(100, &[1]).await;
    assert_eq!(put.status, 200, "{put:?}");
    // The late delta reaches the other replica: it is ignored there too.
    let got = b.send_status(7, true, 50).await;
    assert_eq!(got.body, json!({ "applied": 0, "ignored": 1 }), "{got:?}");
    for app in [&a, &b] {
        eventually("the floor replicated", Duration::from_secs(5), || async {
            app.get_admin(&status_path(7)).await.body["version"] == 100
        })
        .await;
        assert_status(app, 7, false, 100).await;
    }
    drop((a, b));
    let c = TestApp::spawn_on(Some(&db.url), "").await;
    assert_status(&c, 7, false, 100).await;
    assert_status(&c, 1, true, 100).await;
}

/// A snapshot of sellers 1..=ids at version 2 through `app`, over one unlisted
/// seller (turned off) and one above it (stays on); how long until answered.
/// Set-up webhooks are retried: the 100 ms lock bound may rightly refuse one.
async fn put_large_snapshot(app: &TestApp, ids: u64) -> Duration {
    for (user, version) in [(ids + 1, 1), (ids + 2, 5)] {
        eventually(
            "a set-up webhook to be taken",
            Duration::from_secs(30),
            || async { app.set_status(user, true, version).await == 200 },
        )
        .await;
    }
    let body = json!({ "version": 2, "enabled_user_ids": (1..=ids).collect::<Vec<u64>>() });
    let sent = Instant::now();
    let put = app.send_admin(Method::PUT, STATUSES, &body).await;
    let took = sent.elapsed();
    assert_eq!(put.status, 200, "{put:?}");
    took
}

/// Asserts `app` holds the whole of a [`put_large_snapshot`] of `ids`.
async fn assert_sees_large_snapshot(app: &TestApp, ids: u64, when: &str) {
    let set = app.status.set();
    let stale = (1..=ids)
        .filter(|user| {
            set.get(UserId::new(*user).unwrap())
                != phones_gateway::domain::Status {
                    enabled: true,
                    version: 2,
                }
        })
        .count();
    assert_eq!(
        stale, 0,
        "{when}: {stale} of the {ids} sellers the snapshot enabled were not enabled at its version"
    );
    assert_status(app, ids, true, 2).await;
    assert_status(app, ids + 1, false, 2).await;
    assert_status(app, ids + 2, true, 5).await;
}

/// A [`put_large_snapshot`] through `a` of two replicas on `url`: whole on `a`
/// when answered, on the other within 10 s. Returns `a` and both times.
async fn large_snapshot_on_two(
    url: &str,
    overlay: &str,
    ids: u64,
) -> (TestApp, Duration, Duration) {
    let (a, b) = TestApp::pair(url, overlay).await;
    let took = put_large_snapshot(&a, ids).await;
    let answered = Instant::now();
    assert_sees_large_snapshot(&a, ids, "when answered").await;
    let (last, unlisted) = (UserId::new(ids).unwrap(), UserId::new(ids + 1).unwrap());
    eventually(
        "the other replica to see the snapshot",
        Duration::from_secs(10),
        || async {
            let set = b.status.set();
            set.is_enabled(last) && set.get(unlisted).version == 2
        },
    )
    .await;
    let later = answered.elapsed();
    assert_sees_large_snapshot(&b, ids, "on the other replica").await;
    (a, took, later)
}

/// docs/status-sync.md, "The snapshot and its floor": the replica answering a
/// snapshot 2xx sees all of it, however large. Under a 100 ms lock bound, one
/// that read it back through the change log would answer before it saw it.
#[tokio::test]
async fn a_large_snapshot_is_seen_whole_by_its_replica_when_it_answers() {
    const IDS: u64 = 200_000;
    let (_dir, url) = crate::support::sqlite_file("large.db");
    let overlay = "[database]\nlock_timeout_ms = 100\n";
    let mut app = TestApp::spawn_on(Some(&url), overlay).await;
    let took = put_large_snapshot(&app, IDS).await;
    eprintln!("a snapshot of {IDS} ids on SQLite: answered after {took:?}");
    assert_sees_large_snapshot(&app, IDS, "when answered").await;
    // Nothing of the snapshot is left for a catch-up to read back.
    assert_eq!(
        app.status.catch_up().await.unwrap(),
        0,
        "rows left to catch up after the answer"
    );
    assert_sees_large_snapshot(&app, IDS, "after a catch-up").await;
    // Restarted, the replica reads the snapshot's rows back in pages.
    app.shutdown().await.unwrap().unwrap();
    let app = TestApp::spawn_on(Some(&url), "").await;
    assert_sees_large_snapshot(&app, IDS, "after a restart").await;
}

/// The same on PostgreSQL: the answering replica sees it whole at once, the
/// other within 10 s (docs/status-sync.md), through the change log.
#[tokio::test]
async fn a_large_snapshot_on_postgres_is_whole_on_its_replica_at_once_and_on_another_within_10_s() {
    const IDS: u64 = 200_000;
    let db = pg::or_skip!(pg::database().await);
    let overlay = "[database]\nlock_timeout_ms = 100\n";
    let (_, took, later) = large_snapshot_on_two(&db.url, overlay, IDS).await;
    eprintln!(
        "a snapshot of {IDS} ids on PostgreSQL: answered after {took:?}, on the other replica {later:?} later"
    );
}

/// The largest snapshot in short (`benches/load/snapshot_reach.py` runs it in
/// full), with the defaults: answered 2xx and seen whole by its replica.
#[tokio::test]
async fn a_snapshot_of_a_million_ids_with_the_defaults_is_answered_and_seen_on_sqlite() {
    const IDS: u64 = 1_000_000;
    let (_dir, url) = crate::support::sqlite_file("million.db");
    let app = TestApp::spawn_on(Some(&url), "").await;
    let took = put_large_snapshot(&app, IDS).await;
    eprintln!("a snapshot of {IDS} ids on SQLite, defaults: answered after {took:?}");
    assert_sees_large_snapshot(&app, IDS, "when answered").await;
}

/// The same on PostgreSQL with two replicas, under a statement timeout that fits
/// a batch of rows, not one statement over every id.
#[tokio::test]
async fn a_snapshot_of_a_million_ids_is_answered_and_seen_on_postgres_each_statement_within_3_s() {
    const IDS: u64 = 1_000_000;
    let db = pg::or_skip!(pg::database().await);
    let overlay = "[database]\nstatement_timeout_ms = 3000\nlock_timeout_ms = 1000\n";
    let (a, took, later) = large_snapshot_on_two(&db.url, overlay, IDS).await;
    let metrics = a.get_admin(crate::support::paths::METRICS).await.text;
    let finish = "phones_gateway_db_operation_duration_seconds_sum{operation=\"finish_snapshot\"}";
    let finish = crate::support::series_value(&metrics, finish);
    eprintln!(
        "a snapshot of {IDS} ids on PostgreSQL, 3 s a statement: answered after {took:?} \
         (its finish {finish:?} s), on the other replica {later:?} later"
    );
}

/// How many times the process ran database `operation`, by its /metrics.
async fn db_operations(process: &Process, operation: &str) -> f64 {
    let series =
        format!("phones_gateway_db_operation_duration_seconds_count{{operation=\"{operation}\"}}");
    let text = process.get_admin(crate::support::paths::METRICS).await.text;
    crate::support::series_value(&text, &series).unwrap_or(0.0)
}

/// On PostgreSQL a large snapshot leaves its listing in the database: a replica
/// started after it loads it in one read, not a change-log page per batch of
/// rows, and answers as the snapshot says.
#[tokio::test]
async fn another_replica_applies_a_large_snapshot_from_its_listing() {
    const IDS: u64 = 200_000;
    let db = pg::or_skip!(pg::database().await);
    let a = TestApp::spawn_on(Some(&db.url), "").await;
    put_large_snapshot(&a, IDS).await;
    // No poll nor notification: only the load reads.
    let b = Process::start_with(
        &db.url,
        &[
            ("DATABASE__LISTEN", "false"),
            ("DATABASE__SYNC_INTERVAL_MS", "60000"),
        ],
    )
    .await;
    for (user, enabled, version) in [
        (1, true, 2),
        (IDS / 2, true, 2),
        (IDS, true, 2),
        (IDS + 1, false, 2),
        (IDS + 2, true, 5),
        (IDS + 3, false, 2),
    ] {
        assert_eq!(
            b.status(user).await,
            json!({ "user_id": user, "enabled": enabled, "version": version }),
            "seller {user} on the replica that loaded the snapshot"
        );
    }
    let listings = db_operations(&b, "snapshot_listing").await;
    let pages = db_operations(&b, "changes_after").await;
    assert!(
        listings == 1.0 && pages <= 2.0,
        "the snapshot was read back row by row: {listings} listing read(s), {pages} pages"
    );
}

/// A snapshot applies over what another replica stored just before it: memory
/// catches up first. A seller above its version keeps its state; one turned off
/// and on by it does not serve the number cached before.
#[tokio::test]
async fn a_snapshot_applies_over_what_another_replica_stored_just_before_it() {
    let db = pg::or_skip!(pg::database().await);
    let overlay = "[database]\nlisten = false\nsync_interval_ms = 60000\n";
    let a = TestApp::spawn_on(Some(&db.url), overlay).await;
    let b = TestApp::spawn_on(Some(&db.url), "").await;
    a.enable_calltracking(7, 1).await;
    a.real.reply(Reply::Phone(REAL));
    a.calltracking.reply(Reply::Phone(VIRTUAL));
    a.assert_phone(7, 1, PLAIN_CATEGORY, VIRTUAL, "calltracking")
        .await;
    // Released and handed out anew while tracking was off.
    a.calltracking.reply(Reply::Phone(crate::OTHER_VIRTUAL));
    assert_eq!(b.set_status(7, false, 2).await, 200);
    assert_eq!(b.set_status(8, true, 5).await, 200);
    let answer = a.put_snapshot(4, &[7, 9]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_status(&a, 7, true, 4).await;
    assert_status(&a, 8, true, 5).await;
    assert_status(&a, 9, true, 4).await;
    assert_status(&a, 10, false, 4).await;
    a.assert_phone(7, 1, PLAIN_CATEGORY, crate::OTHER_VIRTUAL, "calltracking")
        .await;
}

async fn statuses_survive_sigkill(database_url: &str) {
    let first = Process::start(database_url).await;
    let items = json!({ "items": [
        { "user_id": 1, "enabled": true, "version": 3 },
        { "user_id": 2, "enabled": true, "version": 1 },
    ]});
    assert_eq!(first.send(reqwest::Method::POST, items).await, 200);
    let snapshot = json!({ "version": 2, "enabled_user_ids": [3] });
    assert_eq!(first.send(reqwest::Method::PUT, snapshot).await, 200);
    first.sigkill();

    let second = Process::start(database_url).await;
    assert_eq!(
        second.status(1).await,
        json!({ "user_id": 1, "enabled": true, "version": 3 })
    );
    assert_eq!(
        second.status(2).await,
        json!({ "user_id": 2, "enabled": false, "version": 2 })
    );
    assert_eq!(
        second.status(3).await,
        json!({ "user_id": 3, "enabled": true, "version": 2 })
    );
    // Ordering still holds against what was stored before the kill.
    let stale = json!({ "items": [{ "user_id": 1, "enabled": false, "version": 3 }] });
    assert_eq!(second.send(reqwest::Method::POST, stale).await, 200);
    assert_eq!(second.status(1).await["enabled"], true);
}

#[tokio::test]
async fn sqlite_statuses_survive_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    // A directory not there yet: created on first run.
    let url = format!("sqlite://{}/data/gateway.db", dir.path().display());
    statuses_survive_sigkill(&url).await;
}

#[tokio::test]
async fn postgres_statuses_survive_a_sigkill() {
    let db = pg::or_skip!(pg::database().await);
    statuses_survive_sigkill(&db.url).await;
}

/// Another session holds every table (a stuck migration): writes answer 503
/// within the lock bound and apply nothing, and are taken once it lets go.
#[tokio::test]
async fn with_every_table_locked_writes_answer_503_in_bounded_time_and_apply_nothing() {
    let db = pg::or_skip!(pg::database().await);
    let a = TestApp::spawn_on(Some(&db.url), "[database]\nlock_timeout_ms = 500\n").await;
    let mut locker = crate::support::pg_connection(&db.url).await;
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
    // Lookups never wait on the database.
    a.real.reply(Reply::Phone(REAL));
    a.assert_phone(11, 1, PLAIN_CATEGORY, REAL, "real").await;
    sqlx::Executor::execute(&mut locker, "ROLLBACK")
        .await
        .unwrap();
    let stored = a.get_admin(&status_path(10)).await;
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

/// The simulator as the call-tracking upstream, its feed listing `statuses`.
pub async fn feed(statuses: u64) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let config = SimConfig {
        statuses,
        ..SimConfig::default()
    };
    tokio::spawn(sim::serve(listener, config, std::future::pending()));
    url
}

fn overlay(feed_url: &str) -> String {
    format!(
        r#"
        [upstreams.calltracking]
        base_url = "{feed_url}"
        [upstreams.calltracking.status_feed]
        enabled = true
        interval_ms = 100
        limit = 7
        lease_ttl_ms = 1000
        "#
    )
}

pub async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn enabled(app: &TestApp, user: u64) -> bool {
    app.status.set().is_enabled(UserId::new(user).unwrap())
}

#[tokio::test]
async fn the_feed_is_pulled_into_the_set_with_its_cursor_stored() {
    let feed_url = feed(30).await;
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let app = TestApp::spawn_on(Some(&url), &overlay(&feed_url)).await;
    wait_for("the whole feed", Duration::from_secs(5), || {
        enabled(&app, 120)
    })
    .await;
    assert!(enabled(&app, 4) && !enabled(&app, 5) && !enabled(&app, 124));
    assert!(app.status.is_feed_leader());
    let cursor = app.status.store().feed_cursor().await.unwrap();
    assert_eq!(cursor.as_deref(), Some("30"));
}

#[tokio::test]
async fn feed_leadership_moves_when_the_leader_dies() {
    let db = pg::or_skip!(pg::database().await);
    let feed_url = feed(20).await;
    let a = TestApp::spawn_on(Some(&db.url), &overlay(&feed_url)).await;
    let b = TestApp::spawn_on(Some(&db.url), &overlay(&feed_url)).await;
    wait_for("a leader", Duration::from_secs(5), || {
        a.status.is_feed_leader() || b.status.is_feed_leader()
    })
    .await;
    leads_alone_then_fails_over(a, b).await;
}

/// Two replicas polling `feed(20)`: exactly one leads; once it is dropped the
/// other leads with the stored cursor. Returns how long the takeover took.
pub async fn leads_alone_then_fails_over(a: TestApp, b: TestApp) -> Duration {
    wait_for("the whole feed on both", Duration::from_secs(5), || {
        enabled(&a, 80) && enabled(&b, 80)
    })
    .await;
    for _ in 0..10 {
        assert!(
            a.status.is_feed_leader() ^ b.status.is_feed_leader(),
            "one leader at a time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (leader, follower) = if a.status.is_feed_leader() {
        (a, b)
    } else {
        (b, a)
    };
    let start = Instant::now();
    drop(leader);
    wait_for("the follower to lead", Duration::from_secs(5), || {
        follower.status.is_feed_leader()
    })
    .await;
    let took = start.elapsed();
    assert_eq!(
        follower
            .status
            .store()
            .feed_cursor()
            .await
            .unwrap()
            .as_deref(),
        Some("20"),
        "the cursor survived the leader"
    );
    took
}

#[tokio::test]
async fn replicas_behind_a_transaction_pooler_converge_by_polling() {
    let (db, bouncer) = pg::or_skip!(pooled());
    let overlay = through(&bouncer, &db, "");
    let a = TestApp::spawn_on(Some(&bouncer.url()), &overlay).await;
    let b = TestApp::spawn_on(Some(&bouncer.url()), &overlay).await;
    let c = TestApp::spawn_on(Some(&bouncer.url()), &overlay).await;
    // Webhook deliveries on every replica, seen by all three by polling alone.
    for (i, app) in [&a, &b, &c].into_iter().enumerate() {
        let users: Vec<_> = (0..50)
            .map(|k| json!({"user_id": 1000 * (i as u64 + 1) + k, "enabled": true, "version": 1}))
            .collect();
        let answer = app
            .send_admin(reqwest::Method::POST, STATUSES, &json!({ "items": users }))
            .await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
    }
    wait_for(
        "every delivery on every replica",
        Duration::from_secs(5),
        || {
            [&a, &b, &c].iter().all(|app| {
                [1000, 1049, 2000, 2049, 3000, 3049]
                    .iter()
                    .all(|&u| enabled(app, u))
            })
        },
    )
    .await;
    let answer = b.put_snapshot(5, &[7, 8, 9]).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    wait_for(
        "the snapshot on every replica",
        Duration::from_secs(5),
        || {
            [&a, &b, &c]
                .iter()
                .all(|app| enabled(app, 7) && !enabled(app, 1000) && !enabled(app, 3049))
        },
    )
    .await;
    // More client connections than the pooler's three server connections.
    assert!(server_connections(&db.url).await <= 3 + 1);
    let d = TestApp::spawn_on(Some(&bouncer.url()), &overlay).await;
    assert!(enabled(&d, 8) && !enabled(&d, 2000));
}

#[tokio::test]
async fn the_reveal_log_is_written_and_read_through_the_pooler() {
    let (db, bouncer) = pg::or_skip!(pooled());
    let overlay = through(&bouncer, &db, "[reveals]\nflush_interval_ms = 100");
    let a = TestApp::spawn_on(Some(&bouncer.url()), &overlay).await;
    a.real.reply(crate::support::Reply::Phone(crate::REAL));
    for _ in 0..3 {
        let path = crate::support::paths::phone_path(5, 77, crate::PLAIN_CATEGORY);
        let answer = a.get_public_as(Some("buyer-1"), &path).await;
        assert_eq!(answer.status, 200);
    }
    eventually("three reveals counted", Duration::from_secs(5), || async {
        let counts = a.get_admin(&ad_reveals_path(77)).await;
        counts.body["total"] == 3
    })
    .await;
    let log = a.get_admin(&format!("{REVEALS}?user_id=5")).await;
    assert_eq!(log.status, 200, "{:?}", log.body);
    assert_eq!(
        log.body["items"].as_array().map(Vec::len),
        Some(3),
        "{}",
        log.body
    );
}

#[tokio::test]
async fn the_feed_has_one_leader_behind_the_pooler_and_fails_over() {
    let (db, bouncer) = pg::or_skip!(pooled());
    let feed_url = feed(20).await;
    let overlay = through(
        &bouncer,
        &db,
        &format!(
            "[upstreams.calltracking]\nbase_url = \"{feed_url}\"\n\
             [upstreams.calltracking.status_feed]\nenabled = true\ninterval_ms = 100\nlimit = 7\n\
             lease_ttl_ms = 1000"
        ),
    );
    let a = TestApp::spawn_on(Some(&bouncer.url()), &overlay).await;
    let b = TestApp::spawn_on(Some(&bouncer.url()), &overlay).await;
    let took = leads_alone_then_fails_over(a, b).await;
    eprintln!("feed failover behind the pooler: {took:?}");
}

/// `database.url` is PgBouncer in transaction mode: without `direct_url` a
/// replica stops naming the key; with it, it listens on PostgreSQL itself and
/// its webhooks pass (through the pooler, stray NotificationResponses).
#[tokio::test]
async fn a_would_be_listener_through_a_pooler_harms_no_other_replica() {
    let (db, bouncer) = pg::or_skip!(crate::support::pgbouncer::pooled());
    let good = TestApp::spawn_on(
        Some(&bouncer.url()),
        &crate::support::pgbouncer::through(&bouncer, &db, ""),
    )
    .await;
    let mut refused = TestApp::start_on(Some(&bouncer.url()), "").await;
    // direct_url set, but to the pooler as well.
    let mut misdirected = TestApp::start_on(
        Some(&bouncer.url()),
        &format!("[database]\ndirect_url = \"{}\"\n", bouncer.url()),
    )
    .await;
    let listener = TestApp::spawn_on(
        Some(&bouncer.url()),
        &format!("[database]\ndirect_url = \"{}\"\n", db.url),
    )
    .await;
    for i in 1..=40u64 {
        let body =
            serde_json::json!({ "items": [{ "user_id": i, "enabled": true, "version": 1 }] });
        for app in [&good, &listener] {
            let answer = app.send_admin(reqwest::Method::POST, STATUSES, &body).await;
            assert_eq!(answer.status, 200, "webhook {i}: {:?}", answer.body);
        }
    }
    for app in [&mut refused, &mut misdirected] {
        let error = app
            .stopped_by_itself(Duration::from_secs(15))
            .await
            .expect_err("a pooler without a session connection stops the replica");
        let message = error.to_string();
        assert!(
            message.contains("database.direct_url") && message.contains("database.listen"),
            "{message}"
        );
    }
    assert!(
        captured_logs()
            .lines()
            .all(|l| !l.contains("NotificationResponse"))
    );
}

#[tokio::test]
async fn the_session_check_tells_a_transaction_pooler_from_postgres() {
    let (db, bouncer) = pg::or_skip!(crate::support::pgbouncer::pooled());
    let options = |url: &str| url.parse::<sqlx::postgres::PgConnectOptions>().unwrap();
    let keeps = phones_gateway::store::keeps_sessions;
    assert!(
        keeps(&options(&db.url)).await.unwrap(),
        "PostgreSQL keeps sessions"
    );
    assert!(
        !keeps(&options(&bouncer.url())).await.unwrap(),
        "a transaction-mode pooler does not"
    );
}
