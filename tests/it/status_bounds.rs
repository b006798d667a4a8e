//! docs/status-sync.md, "Bounded calls" on the embedded database and the
//! snapshot's own bounds: a webhook against an SQLite file another connection
//! holds locked answers 503 within `database.lock_timeout_ms`, its turn among
//! the local writers included, and applies nothing; one snapshot upload over
//! `server.max_snapshot_uploads` is refused before its body is read; a body
//! that trickles in within the pause bound but past
//! `server.snapshot_body_timeout_ms` is answered 408.

use crate::support::paths::{STATUSES, status_path};
use crate::support::{TestApp, bearer};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Another connection holds the file's write lock (`BEGIN EXCLUSIVE`) for
/// longer than the lock bound: three webhooks sent at once each answer 503
/// with `Retry-After` within about `lock_timeout_ms`, not one after the other
/// (they queue for the local writers' turn, and that wait is inside the
/// bound), and none applies.
#[tokio::test]
async fn webhooks_against_a_locked_sqlite_file_answer_503_within_the_lock_bound() {
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

    let mut locker = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
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
        // The bound and a margin for a loaded machine; one after the other,
        // the third would take three bounds.
        assert!(
            took < Duration::from_millis(LOCK_MS + 800),
            "a webhook took {took:?} with lock_timeout_ms = {LOCK_MS}"
        );
    }
    sqlx::Executor::execute(&mut locker, "ROLLBACK")
        .await
        .unwrap();
    drop(locker);

    for (user, version) in [(1, 1), (11, 0), (12, 0)] {
        let stored = app.get_admin(&status_path(user)).await;
        assert_eq!(
            stored.body["version"], version,
            "nothing applied: {stored:?}"
        );
    }
    // The lock gone, the same change is taken.
    assert_eq!(app.set_status(1, false, 2).await, 200);
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

/// Reads one answer's status line and headers from `stream` (within
/// `limit`); the status and the head's text.
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

/// Two uploads trickle in (the default `server.max_snapshot_uploads`): a third
/// is answered 503, a problem with `Retry-After`, before it sends a byte of its
/// body (without the bound it would wait for its body until
/// `body_read_timeout_ms`, 10 s, and answer 408). The two still apply, and
/// once they are answered an upload is taken again.
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
    // Both are in their handler, waiting for more of their body: each holds
    // one of the two places, so a probe is refused 503 (a probe that got a
    // place would be refused 400 for its body, and apply nothing).
    crate::support::eventually(
        "both uploads to hold their place",
        Duration::from_secs(10),
        || async {
            app.http
                .put(format!("{}{STATUSES}", app.admin))
                .header("authorization", bearer())
                .header("content-type", "application/json")
                .body("not a snapshot")
                .send()
                .await
                .unwrap()
                .status()
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

/// A body that trickles in, each chunk well within `body_read_timeout_ms` of
/// the one before, is still cut off at `snapshot_body_timeout_ms`: a 408
/// problem, and nothing applied.
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
        // A few bytes every 300 ms, for ever (until the server stops reading).
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
