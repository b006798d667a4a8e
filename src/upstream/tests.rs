//! The calls over the wire, against a keep-alive upstream of the test's own.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use std::time::Duration;

use super::endpoint::status_error;
use super::*;
use crate::config::Config;

/// A keep-alive upstream for the real number, counting the connections it
/// accepted and the requests it read; it answers by seller: 500, 404, 422, 429
/// and 503 (with `Retry-After`; 5030 without) that status, 7 a phone that does
/// not normalise, 9 never; else 200. A path from `/close` is hung up on after
/// its answer; with `once`, every connection is at its second request.
pub(super) async fn upstream(once: bool) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (accepted, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (accepts, count) = (accepted.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            accepts.fetch_add(1, Ordering::SeqCst);
            let count = count.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut answered = false;
                while let Some(head) = pool::read_head(&mut socket, &mut buffer).await {
                    if once && answered {
                        return;
                    }
                    answered = true;
                    count.fetch_add(1, Ordering::SeqCst);
                    let user = head
                        .split("/v1/users/")
                        .nth(1)
                        .and_then(|rest| rest.split('/').next())
                        .unwrap_or("");
                    let (status, extra, body) = match user {
                        u if u.starts_with("500") => ("500 Internal Server Error", "", "{}"),
                        "404" => ("404 Not Found", "", "{}"),
                        "422" => ("422 Unprocessable Content", "", "{}"),
                        "429" => ("429 Too Many Requests", "", "{}"),
                        "503" => ("503 Service Unavailable", "retry-after: 1\r\n", "{}"),
                        "5030" => ("503 Service Unavailable", "", "{}"),
                        "7" => ("200 OK", "", r#"{"phone": "not a phone"}"#),
                        "9" => {
                            // Holds the connection and never answers.
                            let _ = socket.read(&mut [0u8; 1]).await;
                            return;
                        }
                        _ => ("200 OK", "", r#"{"phone": "+79161234567"}"#),
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\n{extra}content-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let close = head.starts_with("GET /close");
                    if socket.write_all(reply.as_bytes()).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (address, accepted, requests)
}

/// The clients, the real number's upstream at `address`, plus `overlay`.
pub(super) fn upstreams(address: &str, overlay: &str) -> Upstreams {
    let config = Config::from_toml(&format!(
        "[upstreams.real_phone]\nbase_url = \"http://{address}\"\n{overlay}"
    ))
    .unwrap();
    Upstreams::new(&config.upstreams, config.breaker, 1024)
}

pub(super) async fn real_phone(
    upstreams: &Upstreams,
    user: u64,
    request: u64,
) -> Result<Option<Phone>, UpstreamError> {
    let call = Call {
        ticket: Ticket(request),
        ..Call::default()
    };
    let (user, ad) = (UserId::new(user).unwrap(), AdId::new(1).unwrap());
    upstreams.real_phone(user, ad, call).await
}

fn answer(status: u16, retry_after: bool) -> hyper::Response<()> {
    let mut response = hyper::Response::builder().status(status);
    if retry_after {
        response = response.header(hyper::header::RETRY_AFTER, "1");
    }
    response.body(()).unwrap()
}

/// 429, and 503 with `Retry-After`, refuse load; any other is a status.
#[test]
fn load_refusals_are_429_and_503_with_retry_after() {
    let table = [
        (429, false, UpstreamError::LoadRefused(429)),
        (429, true, UpstreamError::LoadRefused(429)),
        (503, true, UpstreamError::LoadRefused(503)),
        (503, false, UpstreamError::Status(503)),
        (500, true, UpstreamError::Status(500)),
        (502, false, UpstreamError::Status(502)),
        (422, false, UpstreamError::Status(422)),
        (302, false, UpstreamError::Status(302)),
    ];
    for (status, retry_after, error) in table {
        let got = status_error(&answer(status, retry_after));
        assert_eq!(got, error, "{status}, Retry-After {retry_after}");
    }
}

/// Each answer as the call classifies it, over the wire.
#[tokio::test]
async fn a_call_classifies_what_the_upstream_answered() {
    let (address, _, requests) = upstream(false).await;
    let upstreams = upstreams(&address, "");
    assert!(real_phone(&upstreams, 1, 1).await.unwrap().is_some());
    let table = [
        (500, UpstreamError::Status(500)),
        (422, UpstreamError::Status(422)),
        (429, UpstreamError::LoadRefused(429)),
        (503, UpstreamError::LoadRefused(503)),
        (5030, UpstreamError::Status(503)),
        (7, UpstreamError::Decode("phone does not normalise")),
    ];
    for (user, error) in table {
        assert_eq!(real_phone(&upstreams, user, 1).await, Err(error), "{user}");
    }
    assert_eq!(requests.load(Ordering::SeqCst), 7);
}

/// The timeout runs from the call's start. The lost-time tolerance is wider
/// than the timeout, so nothing is given back (late timers change nothing).
#[tokio::test]
async fn the_timeout_runs_from_the_calls_start() {
    let (address, ..) = upstream(false).await;
    let upstreams = upstreams(
        &address,
        "timeout_ms = 1000\n[upstreams]\nlost_time_tolerance_ms = 2000",
    );
    assert!(real_phone(&upstreams, 1, 1).await.unwrap().is_some());
    let timed_out = real_phone(&upstreams, 9, 2).await;
    assert_eq!(timed_out, Err(UpstreamError::Timeout));
}

/// Health failures for two sellers in two requests open a breaker that needs
/// two of each, and the next call is not made.
#[tokio::test]
async fn health_failures_reach_the_breaker() {
    let (address, _, requests) = upstream(false).await;
    let upstreams = upstreams(
        &address,
        "[breaker]\nconsecutive_failures = 2\nmin_sellers = 2\nmin_requests = 2",
    );
    let calls = [
        (500, Err(UpstreamError::Status(500))),
        (5030, Err(UpstreamError::Status(503))),
        (1, Err(UpstreamError::CircuitOpen)),
    ];
    for (request, (user, end)) in (1..).zip(calls) {
        assert_eq!(real_phone(&upstreams, user, request).await, end, "{user}");
    }
    assert_eq!(requests.load(Ordering::SeqCst), 2, "called while open");
}

/// A half-open breaker's probe whose call is dropped frees its place at once:
/// the next call goes out as a probe, long before a lost probe is replaced.
#[tokio::test]
async fn a_dropped_probe_frees_its_place() {
    let (address, _, requests) = upstream(false).await;
    let open = Duration::from_millis(1500);
    let upstreams = upstreams(
        &address,
        &format!(
            "[breaker]\nconsecutive_failures = 1\nmin_sellers = 1\nmin_requests = 1\nopen_ms = {}",
            open.as_millis()
        ),
    );
    let calls = [
        (500, Err(UpstreamError::Status(500))),
        (1, Err(UpstreamError::CircuitOpen)),
    ];
    for (request, (user, end)) in (1..).zip(calls) {
        assert_eq!(real_phone(&upstreams, user, request).await, end, "{user}");
    }
    tokio::time::sleep(open).await;
    // The probe: sent, then dropped while the upstream holds it.
    let mut probe = Box::pin(real_phone(&upstreams, 9, 3));
    let sent = async {
        while requests.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        _ = &mut probe => panic!("the held probe was answered"),
        () = sent => {}
    }
    drop(probe);
    let next = real_phone(&upstreams, 1, 4).await;
    assert!(next.unwrap().is_some(), "the dropped probe kept its place");
    let closed = real_phone(&upstreams, 2, 5).await;
    assert!(closed.unwrap().is_some(), "closed");
}

/// A health failure at the usual rate is the upstream's verdict; a burst of
/// them well above what it carried is load, and the gateway backs off.
#[tokio::test]
async fn failures_above_what_was_carried_are_load() {
    let (address, ..) = upstream(false).await;
    let upstreams = upstreams(&address, "[breaker]\nenabled = false");
    // What the upstream carried: one call a bucket for 2.5 s.
    for i in 0..10 {
        assert!(real_phone(&upstreams, 100 + i, 1).await.unwrap().is_some());
        tokio::time::sleep(backoff::BUCKET).await;
    }
    let usual = real_phone(&upstreams, 500, 2).await;
    assert_eq!(usual, Err(UpstreamError::Status(500)), "at the usual rate");
    // Forty sellers' calls at once, each failing.
    let calls = (0..40).map(|i| real_phone(&upstreams, 500_000 + i, 3 + i));
    let ends = futures_util::future::join_all(calls).await;
    let load = ends.iter().filter(|&end| *end == Err(UpstreamError::Load));
    let load = load.count();
    assert!(load >= 20, "{ends:?}");
    use UpstreamError::{BackingOff, Load, Status};
    let undecided_or_500 = |end: &_| matches!(end, Err(Load | Status(500) | BackingOff));
    assert!(ends.iter().all(undecided_or_500), "{ends:?}");
}

/// A reused connection closed under the request before any answer is sent
/// again on a new one: no verdict.
#[tokio::test]
async fn a_request_on_a_connection_closed_under_it_is_sent_again() {
    let (address, _, requests) = upstream(true).await;
    let upstreams = upstreams(&address, "");
    for request in 1..=5 {
        let phone = real_phone(&upstreams, request, request).await.unwrap();
        assert!(phone.is_some(), "call {request}");
    }
    assert_eq!(requests.load(Ordering::SeqCst), 5);
}
