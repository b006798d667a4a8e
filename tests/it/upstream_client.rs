//! The upstream client's guarantees (src/upstream/mod.rs), against a raw HTTP/1.1
//! server that shows what arrives on the wire: connections kept alive and
//! reused, the user agent and request id sent, a body over the bound refused, one
//! timeout over head and body, redirects not followed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::TestApp;
use crate::{PLAIN_CATEGORY, REAL};

/// What the raw upstream answers to every request.
#[derive(Clone, Copy)]
enum Raw {
    /// 200 with a phone, keep-alive.
    Phone,
    /// 200 with a phone padded with whitespace to 8 MiB (valid JSON, so only
    /// the bound can refuse it).
    Huge,
    /// 200 with its head at once and the body one byte every 100 ms.
    Trickle,
    /// 302 to the same server.
    Redirect,
}

struct RawUpstream {
    url: String,
    connections: Arc<Mutex<usize>>,
    heads: Arc<Mutex<Vec<String>>>,
}

impl RawUpstream {
    async fn start(raw: Raw) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(Mutex::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (count, seen, location) = (connections.clone(), heads.clone(), url.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                *count.lock().unwrap() += 1;
                tokio::spawn(serve(stream, raw, seen.clone(), location.clone()));
            }
        });
        RawUpstream {
            url,
            connections,
            heads,
        }
    }

    fn connections(&self) -> usize {
        *self.connections.lock().unwrap()
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn serve(mut stream: TcpStream, raw: Raw, heads: Arc<Mutex<Vec<String>>>, url: String) {
    let mut buffer = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let Ok(n) = stream.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buffer.extend_from_slice(&chunk[..n]);
        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            buffer.drain(..end + 4);
            heads.lock().unwrap().push(head);
            let ok = match raw {
                Raw::Phone => {
                    let body = format!("{{\"phone\":\"{REAL}\"}}");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    stream.write_all(answer.as_bytes()).await.is_ok()
                }
                Raw::Huge => {
                    let head = "HTTP/1.1 200 OK\r\ncontent-length: 8388608\r\n\r\n";
                    let phone = format!("{{\"phone\":\"{REAL}\"}}");
                    let mut first = vec![b' '; 64 * 1024];
                    first[..phone.len()].copy_from_slice(phone.as_bytes());
                    if stream.write_all(head.as_bytes()).await.is_err()
                        || stream.write_all(&first).await.is_err()
                    {
                        return;
                    }
                    let block = vec![b' '; 64 * 1024];
                    for _ in 1..128 {
                        if stream.write_all(&block).await.is_err() {
                            return;
                        }
                    }
                    true
                }
                Raw::Trickle => {
                    let body = format!("{{\"phone\":\"{REAL}\"}}");
                    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    for byte in body.bytes() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if stream.write_all(&[byte]).await.is_err() {
                            return;
                        }
                    }
                    true
                }
                Raw::Redirect => {
                    let answer = format!(
                        "HTTP/1.1 302 Found\r\nlocation: {url}/v1/users/1/phone?ad_id=1\r\ncontent-length: 0\r\n\r\n"
                    );
                    stream.write_all(answer.as_bytes()).await.is_ok()
                }
            };
            if !ok {
                return;
            }
        }
    }
}

/// The real-number upstream at `raw`, with a 500 ms timeout and a request
/// deadline far past it, so only the client's own timeout can cut a call.
async fn app_on(raw: &RawUpstream) -> TestApp {
    TestApp::spawn_with(&format!(
        "[server]\nrequest_deadline_ms = 10000\n[upstreams.real_phone]\nbase_url = \"{}\"\ntimeout_ms = 500",
        raw.url
    ))
    .await
}

#[tokio::test]
async fn calls_reuse_one_kept_alive_connection_and_say_who_is_calling() {
    let raw = RawUpstream::start(Raw::Phone).await;
    let app = app_on(&raw).await;
    for user in 1..=20 {
        let answer = app
            .http
            .get(format!(
                "{}/v1/public-phone?user_id={user}&ad_id=1&category_id={PLAIN_CATEGORY}",
                app.public
            ))
            .header("x-request-id", format!("req-{user}"))
            .send()
            .await
            .unwrap();
        crate::support::read(answer)
            .await
            .assert_number(REAL, "real");
    }
    assert_eq!(raw.heads().len(), 20, "one call per uncached seller");
    assert_eq!(
        raw.connections(),
        1,
        "one after another, the calls share a connection"
    );
    let heads = raw.heads();
    let first = heads[0].to_ascii_lowercase();
    assert!(
        first.starts_with("get /v1/users/1/phone?ad_id=1 http/1.1"),
        "{first}"
    );
    assert!(first.contains("\r\nuser-agent: phones-gateway/"), "{first}");
    assert!(first.contains("\r\nhost: 127.0.0.1:"), "{first}");
    assert!(first.contains("\r\nx-request-id: req-1"), "{first}");
}

#[tokio::test]
async fn a_body_over_the_bound_is_refused_not_read_whole() {
    let raw = RawUpstream::start(Raw::Huge).await;
    let app = app_on(&raw).await;
    let start = Instant::now();
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(503);
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn one_timeout_covers_the_body_too() {
    let raw = RawUpstream::start(Raw::Trickle).await;
    let app = app_on(&raw).await;
    let start = Instant::now();
    // The head comes at once; the 27-byte body would take 2.7 s.
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(503);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(450), "{took:?}");
    assert!(
        took < Duration::from_millis(2500),
        "cut at the 500 ms timeout: {took:?}"
    );
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let raw = RawUpstream::start(Raw::Redirect).await;
    let app = app_on(&raw).await;
    app.phone(1, 1, PLAIN_CATEGORY).await.assert_problem(503);
    assert_eq!(
        raw.heads().len(),
        1,
        "a 3xx is an unexpected status, not followed"
    );
}
