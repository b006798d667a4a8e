//! The cold path's limit on this machine: a bare HTTP client of the library stack
//! the gateway uses (hyper's HTTP/1.1 connection API; here each task keeps one
//! connection of its own, so there is no pool at all), making the gateway's real-number call (a GET of
//! `/v1/users/{id}/phone?ad_id={id}`, every call a new seller, the body read and
//! decoded) against the same simulator, on one worker thread. The load harness
//! runs it pinned to the gateway's core and divides the process's CPU time by the
//! calls it made (`benches/load/harness.py --cold`).
//!
//! Usage: `bare_client BASE_URL CONCURRENCY SECONDS [hyper|reqwest]`; prints the
//! number of calls made and failed.

// A load tool: it measures wall time.
#![allow(clippy::disallowed_types)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

#[derive(serde::Deserialize)]
struct PhoneBody {
    #[allow(dead_code)]
    phone: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let base = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:19300".into());
    let concurrency: u64 = args.next().and_then(|c| c.parse().ok()).unwrap_or(32);
    let seconds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let stack = args.next().unwrap_or_else(|| "hyper".into());
    let calls = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(async {
            let end = Instant::now() + Duration::from_secs(seconds);
            let authority = base
                .strip_prefix("http://")
                .unwrap_or(&base)
                .trim_end_matches('/')
                .to_owned();
            let reqwest_client = reqwest::Client::new();
            let mut tasks = Vec::new();
            for task in 0..concurrency {
                let (base, calls, failed) = (base.clone(), calls.clone(), failed.clone());
                let (authority, reqwest_client) = (authority.clone(), reqwest_client.clone());
                let stack = stack.clone();
                tasks.push(tokio::spawn(async move {
                    let mut sender: Option<http1::SendRequest<Empty<Bytes>>> = None;
                    let mut n = task * 100_000_000;
                    while Instant::now() < end {
                        n += 1;
                        let body = if stack == "reqwest" {
                            let url = format!("{base}/v1/users/{n}/phone?ad_id={n}");
                            match reqwest_client.get(&url).send().await {
                                Ok(response) => response.bytes().await.ok(),
                                Err(_) => None,
                            }
                        } else {
                            // A connection of this task's own, (re)made when
                            // there is none or it closed (the simulator may
                            // still be starting).
                            if sender.as_ref().is_none_or(http1::SendRequest::is_closed) {
                                sender = connect(&authority).await;
                            }
                            let Some(sender) = sender.as_mut() else {
                                failed.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            };
                            let request =
                                hyper::Request::get(format!("/v1/users/{n}/phone?ad_id={n}"))
                                    .header(hyper::header::HOST, &authority)
                                    .body(Empty::new())
                                    .expect("a valid request");
                            let response = match sender.ready().await {
                                Ok(()) => sender.send_request(request).await.ok(),
                                Err(_) => None,
                            };
                            match response {
                                Some(response) => response
                                    .into_body()
                                    .collect()
                                    .await
                                    .ok()
                                    .map(|b| b.to_bytes()),
                                None => None,
                            }
                        };
                        // One seller in fifty has no phone (404): an answer all the same.
                        let _ = body
                            .as_ref()
                            .map(|b| serde_json::from_slice::<PhoneBody>(b));
                        if body.is_some() { &calls } else { &failed }
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
        });
    println!(
        "{{\"calls\": {}, \"failed\": {}}}",
        calls.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    Ok(())
}

/// A new HTTP/1.1 connection to `authority`, its task spawned; `None` if the
/// server cannot be reached.
async fn connect(authority: &str) -> Option<http1::SendRequest<Empty<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(authority).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(connection);
    Some(sender)
}
