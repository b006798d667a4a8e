//! Request limits: header size, slow clients, body sizes (the latter in bad_input).

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Reply, TestApp, read};
use crate::{PLAIN_CATEGORY, REAL};

const LIMITS: &str =
    "[server]\nmax_header_bytes = 4096\nheader_read_timeout_ms = 300\nbody_read_timeout_ms = 300";

#[tokio::test]
async fn oversized_headers_are_refused_with_431() {
    let app = TestApp::spawn_with(LIMITS).await;
    app.real.reply(Reply::Phone(REAL));
    let url = format!(
        "{}/v1/public-phone?user_id=1&ad_id=1&category_id={PLAIN_CATEGORY}",
        app.public
    );
    let got = read(
        app.http
            .get(&url)
            .header("x-big", "a".repeat(5000))
            .send()
            .await
            .unwrap(),
    )
    .await;
    got.assert_problem(431);
    // Far over the limit, hyper refuses before the router sees it.
    let got = app
        .http
        .get(&url)
        .header("x-huge", "a".repeat(100_000))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 431);
    // Normal requests still pass.
    read(app.http.get(&url).send().await.unwrap())
        .await
        .assert_number(REAL, "real");
}

fn host_port(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

#[tokio::test]
async fn a_body_sent_too_slowly_gets_408() {
    let app = TestApp::spawn_with(LIMITS).await;
    let mut stream = TcpStream::connect(host_port(&app.public)).await.unwrap();
    stream
        .write_all(b"POST /v1/public-phones/batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 60\r\n\r\n{\"items\": [")
        .await
        .unwrap();
    let start = Instant::now();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_request_head_sent_too_slowly_closes_the_connection() {
    let app = TestApp::spawn_with(LIMITS).await;
    let mut stream = TcpStream::connect(host_port(&app.public)).await.unwrap();
    stream
        .write_all(b"GET /v1/public-phone?user_id=1 HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "the server kept a slow client's connection open"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    // The admin listener applies the same rule.
    let mut stream = TcpStream::connect(host_port(&app.admin)).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let read =
        tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut Vec::new())).await;
    assert!(read.is_ok());
}

#[tokio::test]
async fn a_connection_in_service_is_kept_and_an_idle_one_is_closed() {
    // Head deadline 200 ms; the answer takes 700 ms, over three deadlines.
    let app = TestApp::spawn_with(
        "[server]\nheader_read_timeout_ms = 200\nrequest_deadline_ms = 3000\n\
         [upstreams.real_phone]\ntimeout_ms = 2000",
    )
    .await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(700));
    let mut stream = TcpStream::connect(host_port(&app.public)).await.unwrap();
    let head = format!(
        "GET /v1/public-phone?user_id=1&ad_id=1&category_id={PLAIN_CATEGORY} HTTP/1.1\r\nhost: x\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.ends_with(b"}") {
        let n = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut chunk))
            .await
            .expect("no answer")
            .unwrap();
        assert!(n > 0, "closed while the request was in service: {answer:?}");
        answer.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // Idle after its answer: closed after one to two periods (plus slack for two
    // busy cores); a connection kept would hold the read for the whole 10 s.
    let idle = Instant::now();
    let read =
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut Vec::new())).await;
    assert!(read.is_ok(), "an idle keep-alive connection was kept");
    assert!(
        idle.elapsed() < Duration::from_secs(4),
        "{:?}",
        idle.elapsed()
    );
    assert!(
        idle.elapsed() >= Duration::from_millis(190),
        "{:?}",
        idle.elapsed()
    );
}
