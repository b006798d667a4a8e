//! docs/status-sync.md, "Bounded calls" on SQLite: webhooks and snapshots
//! against a locked file or a stalled disk (`test-faults`, src/store/faults.rs)
//! answer 503 within their bound and apply nothing; `server.max_snapshot_uploads`
//! and `server.snapshot_body_timeout_ms` refuse.

use crate::support::paths::{INVALIDATE, READYZ, STATUSES, status_path};
use crate::support::{Answer, Reply, TestApp, bearer};
use crate::{PLAIN_CATEGORY, REAL};
use phones_gateway::store::faults::STALLING_VERSIONS;
use reqwest::Method;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `answer` awaited (panicking after `limit`), printed with `what`, and how
/// long it took.
async fn timed(
    what: &str,
    limit: Duration,
    answer: impl std::future::Future<Output = Answer>,
) -> (Answer, Duration) {
    let sent = Instant::now();
    let answer = tokio::time::timeout(limit, answer)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"));
    let took = sent.elapsed();
    eprintln!("{what}: {} after {took:?}", answer.status);
    (answer, took)
}

/// The file's write lock held past the lock bound: concurrent webhooks and a
/// snapshot each answer 503 within about `lock_timeout_ms` (not one after
/// another), none applies; an invalidation (no write on SQLite) answers at once.
#[tokio::test]
async fn writes_against_a_locked_sqlite_file_answer_503_within_the_lock_bound() {
    const LOCK_MS: u64 = 1000;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.db");
    let url = format!("sqlite://{}", file.display());
    let app = TestApp::spawn_on(
        Some(&url),
        &format!("[database]\nlock_timeout_ms = {LOCK_MS}\n"),
    )
    .await;
    assert_eq!(app.set_status(1, true, 1).await, 200);
    app.real.reply(Reply::Phone(REAL));
    app.assert_phone(7, 1, PLAIN_CATEGORY, REAL, "real").await;

    let mut locker = crate::support::sqlite_connection(&url).await;
    sqlx::Executor::execute(&mut locker, "BEGIN EXCLUSIVE")
        .await
        .unwrap();
    let sends = (0..3u64).map(|i| {
        let app = &app;
        async move {
            let sent = Instant::now();
            let answer = tokio::time::timeout(
                Duration::from_secs(20),
                app.send_status(if i == 0 { 1 } else { 10 + i }, i != 0, 2),
            )
            .await
            .expect("a webhook hung on a locked file");
            (answer, sent.elapsed())
        }
    });
    let answers = futures_util::future::join_all(sends).await;
    for (answer, took) in &answers {
        eprintln!("webhook on a locked file: {} after {took:?}", answer.status);
    }
    for (answer, took) in answers {
        answer.assert_problem(503);
        assert!(answer.retry_after.is_some(), "{answer:?}");
        // One after the other, the third would take three bounds.
        assert!(
            took < Duration::from_millis(LOCK_MS + 800),
            "a webhook took {took:?} with lock_timeout_ms = {LOCK_MS}"
        );
    }
    let snapshot = app.put_snapshot(5, &[13]);
    let (snapshot, took) = timed(
        "snapshot on a locked file",
        Duration::from_secs(20),
        snapshot,
    )
    .await;
    snapshot.assert_problem(503);
    assert!(snapshot.retry_after.is_some(), "{snapshot:?}");
    assert!(
        took < Duration::from_millis(LOCK_MS + 800),
        "a snapshot took {took:?} with lock_timeout_ms = {LOCK_MS}"
    );
    let calls = app.real.calls();
    let body = json!({ "user_ids": [7] });
    let invalidation = app.send_admin(Method::POST, INVALIDATE, &body);
    let what = "invalidation on a locked file";
    let (invalidated, took) = timed(what, Duration::from_secs(20), invalidation).await;
    assert_eq!(invalidated.status, 200, "{invalidated:?}");
    assert!(
        took < Duration::from_millis(LOCK_MS),
        "an invalidation waited {took:?} on a lock it does not need"
    );
    app.assert_phone(7, 1, PLAIN_CATEGORY, REAL, "real").await;
    assert_eq!(app.real.calls(), calls + 1, "the cached number was dropped");
    sqlx::Executor::execute(&mut locker, "ROLLBACK")
        .await
        .unwrap();
    drop(locker);

    for (user, version) in [(1, 1), (11, 0), (12, 0), (13, 0)] {
        let stored = app.get_admin(&status_path(user)).await;
        assert_eq!(
            stored.body["version"], version,
            "nothing applied: {stored:?}"
        );
    }
    assert_eq!(app.set_status(1, false, 2).await, 200);
}

/// A disk that stops mid-write holds SQLite's write lock where the busy timeout
/// cannot end it; the gateway's own call bound does (docs/status-sync.md): 503
/// near the bound, nothing applied, and the next writes taken.
#[tokio::test]
async fn on_a_stalled_disk_writes_answer_503_within_the_gateways_own_bound_and_apply_nothing() {
    const LOCK_MS: u64 = 500;
    const STATEMENT_MS: u64 = 500;
    let webhook_bound = Duration::from_millis(LOCK_MS);
    let snapshot_bound = Duration::from_millis(LOCK_MS + 4 * STATEMENT_MS + 1000);
    // What a loaded 2-core runner may add to an answer after the bound.
    let slack = Duration::from_millis(800);
    let stalling = *STALLING_VERSIONS.start();
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let app = TestApp::spawn_on(
        Some(&url),
        &format!(
            "[database]\nlock_timeout_ms = {LOCK_MS}\nstatement_timeout_ms = {STATEMENT_MS}\n"
        ),
    )
    .await;
    assert_eq!(app.set_status(1, true, 1).await, 200);

    // The delivery stalls after its rows are written (user 2 among them).
    let items = json!({ "items": [
        { "user_id": 1, "enabled": false, "version": 2 },
        { "user_id": 2, "enabled": true, "version": stalling },
    ] });
    let webhook = app.send_admin(Method::POST, STATUSES, &items);
    let (webhook, took) = timed(
        "webhook on a stalled disk",
        Duration::from_secs(30),
        webhook,
    )
    .await;
    webhook.assert_problem(503);
    assert!(webhook.retry_after.is_some(), "{webhook:?}");
    assert!(
        took >= webhook_bound && took < webhook_bound + slack,
        "the webhook answered after {took:?}; its bound is {webhook_bound:?}"
    );

    // The snapshot stalls after its update (user 1 disabled, in its transaction).
    let snapshot = app.put_snapshot(stalling, &[3]);
    let what = "snapshot on a stalled disk";
    let (snapshot, took) = timed(what, Duration::from_secs(30), snapshot).await;
    snapshot.assert_problem(503);
    assert!(snapshot.retry_after.is_some(), "{snapshot:?}");
    assert!(
        took >= snapshot_bound && took < snapshot_bound + slack,
        "the snapshot answered after {took:?}; its bound is {snapshot_bound:?}"
    );

    for (user, enabled, version) in [(1, true, 1), (2, false, 0), (3, false, 0)] {
        let stored = app.get_admin(&status_path(user)).await.body;
        assert_eq!(
            (stored["enabled"].as_bool(), stored["version"].as_u64()),
            (Some(enabled), Some(version)),
            "user {user}: nothing stalled applies"
        );
    }
    // Recovered by itself: the write lock is free again.
    assert_eq!(app.get_admin(READYZ).await.status, 200);
    assert_eq!(app.set_status(2, true, 3).await, 200);
    let answer = app.put_snapshot(4, &[2, 3]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    for (user, enabled) in [(1, false), (2, true), (3, true)] {
        let stored = app.get_admin(&status_path(user)).await.body;
        assert_eq!(stored["enabled"], enabled, "user {user}: {stored}");
        assert_eq!(stored["version"], 4, "user {user}: {stored}");
    }
}

/// The head of a chunked snapshot PUT, with `first` as its first chunk.
fn upload_head(first: &str) -> String {
    format!(
        "PUT {STATUSES} HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{}",
        bearer(),
        chunk(first)
    )
}

fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

/// Reads one answer's status line and headers from `stream` within `limit`.
async fn read_head(stream: &mut (impl AsyncReadExt + Unpin), limit: Duration) -> (u16, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed without an answer: {got:?}");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no answer within {limit:?}"));
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text.to_ascii_lowercase())
}

/// Past `server.max_snapshot_uploads` trickling uploads, another is refused 503
/// before its body is read (not 408 later); the two apply and free their places.
#[tokio::test]
async fn a_third_concurrent_snapshot_upload_is_refused_before_its_body_is_read() {
    let app = TestApp::spawn().await;
    let admin = app.admin.trim_start_matches("http://").to_owned();
    let mut uploads = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&admin).await.unwrap();
        stream
            .write_all(upload_head(r#"{"version": 9, "enabled_user_ids": [7"#).as_bytes())
            .await
            .unwrap();
        uploads.push(stream);
    }
    // Each holds one of the two places: a probe is refused 503 (with a place
    // it would be 400 for its body).
    crate::support::eventually(
        "both uploads to hold their place",
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

    let mut third = TcpStream::connect(&admin).await.unwrap();
    let head = format!(
        "PUT {STATUSES} HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n",
        bearer(),
    );
    third.write_all(head.as_bytes()).await.unwrap();
    let asked = Instant::now();
    let (status, head) = read_head(&mut third, Duration::from_secs(5)).await;
    eprintln!("third upload: {status} after {:?}", asked.elapsed());
    assert_eq!(status, 503, "{head}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    assert!(head.contains("retry-after:"), "{head}");
    drop(third);

    for (i, mut stream) in uploads.into_iter().enumerate() {
        stream
            .write_all(format!("{}0\r\n\r\n", chunk(&format!(", {}]}}", 20 + i))).as_bytes())
            .await
            .unwrap();
        let (status, head) = read_head(&mut stream, Duration::from_secs(30)).await;
        assert_eq!(status, 200, "{head}");
    }
    let answer = app
        .send_admin(
            reqwest::Method::PUT,
            STATUSES,
            &serde_json::json!({ "version": 10, "enabled_user_ids": [8] }),
        )
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// A body trickling in within `body_read_timeout_ms` a chunk is still cut off
/// at `snapshot_body_timeout_ms`: 408, nothing applied.
#[tokio::test]
async fn a_snapshot_body_trickling_past_its_total_time_is_answered_408() {
    const TOTAL_MS: u64 = 2500;
    let app = TestApp::spawn_with(&format!(
        "[server]\nbody_read_timeout_ms = 1000\nsnapshot_body_timeout_ms = {TOTAL_MS}\n"
    ))
    .await;
    let admin = app.admin.trim_start_matches("http://").to_owned();
    let stream = TcpStream::connect(&admin).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    writer
        .write_all(upload_head(r#"{"version": 9, "enabled_user_ids": [7"#).as_bytes())
        .await
        .unwrap();
    let sent = Instant::now();
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if writer.write_all(chunk(", 7").as_bytes()).await.is_err() {
                break;
            }
        }
    });
    let (status, head) = read_head(&mut reader, Duration::from_millis(TOTAL_MS + 5000)).await;
    let took = sent.elapsed();
    eprintln!("trickling snapshot: {status} after {took:?}");
    trickle.abort();
    assert_eq!(status, 408, "{head}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    assert!(
        took >= Duration::from_millis(TOTAL_MS),
        "cut off early: {took:?}"
    );
    let stored = app.get_admin(&status_path(7)).await;
    assert_eq!(stored.body["version"], 0, "nothing applied: {stored:?}");
}

/// Another connection holds the write lock: a snapshot answers 503 within its
/// finish's bound and applies nothing, an invalidation answers at once and drops
/// the seller's cached numbers; once the lock is gone the snapshot is taken.
#[tokio::test]
async fn a_snapshot_against_a_locked_sqlite_file_answers_503_within_its_bound_and_applies_nothing()
{
    const LOCK_MS: u64 = 300;
    const STATEMENT_MS: u64 = 300;
    const LOCK: Duration = Duration::from_millis(LOCK_MS);
    // docs/status-sync.md, "Every call and its bound": a snapshot's finish.
    const FINISH_BOUND: Duration = Duration::from_millis(LOCK_MS + 4 * STATEMENT_MS + 1000);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("gw.db").display());
    let app = TestApp::spawn_on(
        Some(&url),
        &format!(
            "[database]\nlock_timeout_ms = {LOCK_MS}\nstatement_timeout_ms = {STATEMENT_MS}\n"
        ),
    )
    .await;
    let put = app.put_snapshot(1, &[1]).await;
    assert_eq!(put.status, 200, "{put:?}");
    app.real.reply(Reply::Phone(REAL));
    app.assert_phone(5, 1, PLAIN_CATEGORY, REAL, "real").await;
    app.assert_phone(5, 1, PLAIN_CATEGORY, REAL, "real").await;
    assert_eq!(app.real.calls(), 1, "cached");

    let mut locker = crate::support::sqlite_connection(&url).await;
    sqlx::Executor::execute(&mut locker, "BEGIN IMMEDIATE")
        .await
        .unwrap();
    let limit = Duration::from_secs(60);
    let snapshot = app.put_snapshot(2, &[2]);
    let (refused, took) = timed("snapshot on a locked file", limit, snapshot).await;
    let body = json!({ "user_ids": [5] });
    let invalidation = app.send_admin(Method::POST, INVALIDATE, &body);
    let what = "invalidation on a locked file";
    let (invalidated, invalidation_took) = timed(what, limit, invalidation).await;
    refused.assert_problem(503);
    assert!(refused.retry_after.is_some(), "{refused:?}");
    assert!(
        took < FINISH_BOUND,
        "the snapshot answered after {took:?} (its documented bound: {FINISH_BOUND:?})"
    );
    assert!(
        took >= LOCK,
        "the snapshot was refused after {took:?}, before it waited lock_timeout_ms ({LOCK:?})"
    );
    assert_eq!(invalidated.status, 200, "{invalidated:?}");
    assert!(
        invalidation_took < LOCK,
        "the invalidation waited {invalidation_took:?} on the locked file"
    );
    // Nothing of the snapshot applied, in memory or in the file (read inside
    // the locker's transaction).
    for (user, enabled) in [(1, true), (2, false)] {
        let stored = app.get_admin(&status_path(user)).await;
        assert_eq!(
            stored.body,
            json!({ "user_id": user, "enabled": enabled, "version": 1 }),
            "nothing applied: {stored:?}"
        );
    }
    let floor: i64 =
        sqlx::query_scalar("SELECT version FROM calltracking_status WHERE user_id = 0")
            .fetch_one(&mut locker)
            .await
            .unwrap();
    assert_eq!(floor, 1, "the stored floor moved");
    // The invalidation dropped the seller's number: asked again.
    app.assert_phone(5, 1, PLAIN_CATEGORY, REAL, "real").await;
    assert_eq!(app.real.calls(), 2, "the cached number was dropped");

    sqlx::Executor::execute(&mut locker, "ROLLBACK")
        .await
        .unwrap();
    drop(locker);
    let put = app.put_snapshot(2, &[2]).await;
    assert_eq!(put.status, 200, "taken once the lock is gone: {put:?}");
    let stored = app.get_admin(&status_path(2)).await;
    assert_eq!(stored.body["enabled"], true, "{stored:?}");
}
