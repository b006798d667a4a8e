//! Back off first, judge after (docs/rules.md, "Whose load", "Whose time",
//! "Verdict or undecided"): load shows no tracked seller their real number; a
//! real outage still falls through once backed off.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::paths::METRICS;
use crate::support::{Reply, TestApp};
use crate::{PLAIN_CATEGORY, REAL, VIRTUAL};

async fn outcomes(app: &TestApp) -> Vec<String> {
    app.get_admin(METRICS)
        .await
        .text
        .lines()
        .filter(|l| {
            l.starts_with("phones_gateway_upstream_requests_total")
                && l.contains("upstream=\"calltracking\"")
                && !l.ends_with(" 0")
        })
        .map(str::to_owned)
        .collect()
}

/// What `path` shows on `app`, or `error` when the request failed below HTTP.
async fn ask(app: &TestApp, path: &str) -> String {
    match reqwest::get(format!("{}{path}", app.public)).await {
        Ok(answer) => {
            let status = answer.status().as_u16();
            let text = answer.text().await.unwrap_or_default();
            let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            body["kind"]
                .as_str()
                .map_or_else(|| status.to_string(), str::to_owned)
        }
        Err(_) => "error".to_owned(),
    }
}

/// A cold call-tracking lookup: a phone of its own for `n`.
fn lookup(user: u64, n: u64) -> String {
    format!(
        "/v1/public-phone?user_id={user}&ad_id={}&category_id={PLAIN_CATEGORY}&phone=%2B7926{:07}",
        n + 1,
        n % 10_000_000
    )
}

/// The kind an answer shows, or its status.
fn kind_of(answer: &crate::support::Answer) -> String {
    answer.body["kind"]
        .as_str()
        .map_or_else(|| format!("{}", answer.status), str::to_owned)
}

/// How a raw call-tracking upstream answers a lookup.
#[derive(Clone, Copy)]
enum Serve {
    /// Always a virtual number; connections idle this long are closed.
    ClosingIdle(Duration),
    /// This many a second, 500 beyond.
    Capacity(usize),
}

/// Call tracking as a raw HTTP/1.1 server with its own idle close; counts lookups.
async fn raw_calltracking(serve: Serve) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let answered: Arc<std::sync::Mutex<std::collections::VecDeque<tokio::time::Instant>>> =
        Arc::default();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let calls = counted.clone();
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                loop {
                    let idle = match serve {
                        Serve::ClosingIdle(idle) => idle,
                        Serve::Capacity(_) => Duration::from_secs(60),
                    };
                    let head = match tokio::time::timeout(idle, read_head(&mut socket, &mut buffer))
                        .await
                    {
                        Ok(Some(head)) => head,
                        _ => return,
                    };
                    let (status, body) = if head.starts_with("GET /v1/statuses") {
                        ("200 OK", r#"{"items": [], "next_cursor": null}"#.to_owned())
                    } else {
                        calls.fetch_add(1, Ordering::SeqCst);
                        let ok = match serve {
                            Serve::ClosingIdle(_) => true,
                            Serve::Capacity(max) => {
                                let now = tokio::time::Instant::now();
                                let mut recent = answered.lock().unwrap();
                                while recent.front().is_some_and(|t| {
                                    now.duration_since(*t) > Duration::from_secs(1)
                                }) {
                                    recent.pop_front();
                                }
                                let ok = recent.len() < max;
                                if ok {
                                    recent.push_back(now);
                                }
                                ok
                            }
                        };
                        if ok {
                            ("200 OK", format!(r#"{{"virtual_phone": "{VIRTUAL}"}}"#))
                        } else {
                            ("500 Internal Server Error", "{}".to_owned())
                        }
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if socket.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, calls)
}

/// The next request head on `socket`; `None` once the peer hangs up.
async fn read_head(socket: &mut tokio::net::TcpStream, buffer: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 1024];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    buffer.drain(..end);
    Some(head)
}

/// A request written on a just-closed connection is sent again, breaker or not.
#[tokio::test]
async fn an_upstream_closing_idle_connections_shows_no_tracked_seller_a_real_number() {
    for breaker in ["false", "true"] {
        let (url, calls) = raw_calltracking(Serve::ClosingIdle(Duration::from_millis(300))).await;
        let app = TestApp::spawn_with(&format!(
            "[breaker]\nenabled = {breaker}\n[upstreams]\npool_idle_timeout_ms = 20000\n[upstreams.calltracking]\nbase_url = \"{url}\""
        ))
        .await;
        app.real.reply(Reply::Phone(REAL));
        app.track(1..=20).await;
        let mut kinds = Vec::new();
        for wave in 0..14 * crate::support::scale() {
            let asks = (1..=20u64).map(|user| {
                let path = lookup(user, wave * 100 + user);
                let app = &app;
                async move { kind_of(&app.get_public(&path).await) }
            });
            kinds.extend(futures_util::future::join_all(asks).await);
            tokio::time::sleep(Duration::from_millis(290 + (wave % 4) * 10)).await;
        }
        crate::support::tally(&format!("idle close, breaker {breaker}"), &kinds);
        let real = kinds.iter().filter(|k| *k == "real").count();
        assert_eq!(
            real,
            0,
            "breaker {breaker}: {real} of {} shown real: {kinds:?}",
            kinds.len()
        );
        let answered = kinds.iter().filter(|k| *k == "calltracking").count();
        assert!(
            answered * 10 >= kinds.len() * 9,
            "breaker {breaker}: {kinds:?}"
        );
        assert!(calls.load(Ordering::SeqCst) >= 280 * crate::support::scale() as usize);
    }
}

/// A burst past capacity after raising the baseline is load: nobody sees real.
#[tokio::test]
async fn a_caller_that_raised_the_baseline_then_bursts_shows_nobody_a_real_number() {
    let (url, calls) = raw_calltracking(Serve::Capacity(100)).await;
    let app = TestApp::spawn_with(&format!("[upstreams.calltracking]\nbase_url = \"{url}\"")).await;
    app.real.reply(Reply::Phone(REAL));
    let honest: Vec<u64> = (50_001..=50_006).collect();
    app.track((1..=200).chain(honest.iter().copied())).await;
    let send_at = |rate: u64, seconds: u64, first: u64| {
        let app = &app;
        async move {
            let mut kinds = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(1000 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut pending = Vec::new();
            for i in 0..rate * seconds {
                tick.tick().await;
                let path = lookup(1 + i % 200, first + i);
                pending.push(tokio::spawn({
                    let public = app.public.clone();
                    async move {
                        let answer = reqwest::get(format!("{public}{path}")).await;
                        match answer {
                            Ok(answer) => {
                                let text = answer.text().await.unwrap_or_default();
                                let body: Value =
                                    serde_json::from_str(&text).unwrap_or(Value::Null);
                                body["kind"].as_str().unwrap_or("503").to_owned()
                            }
                            Err(_) => "failed".to_owned(),
                        }
                    }
                }));
            }
            for task in pending {
                kinds.push(task.await.unwrap());
            }
            kinds
        }
    };
    let warm = send_at(80, 8, 1_000_000).await;
    let answered = warm.iter().filter(|k| *k == "calltracking").count();
    // Mostly answered (a busy process may bunch a few past capacity).
    assert!(
        answered * 10 >= warm.len() * 7,
        "{answered} of {}: {warm:?} {:?}",
        warm.len(),
        outcomes(&app).await
    );
    let before = calls.load(Ordering::SeqCst);
    let honest_asks = async {
        let mut kinds = Vec::new();
        for round in 0..20 * crate::support::scale() {
            for &user in &honest {
                kinds.push(kind_of(
                    &app.get_public(&lookup(user, 3_000_000 + round * 10 + user % 10))
                        .await,
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        kinds
    };
    let (burst, honest_kinds) = tokio::join!(
        send_at(110, 4 * crate::support::scale(), 2_000_000),
        honest_asks
    );
    let real_burst = burst.iter().filter(|k| *k == "real").count();
    let real_honest = honest_kinds.iter().filter(|k| *k == "real").count();
    crate::support::tally("raised then burst, the burst", &burst);
    crate::support::tally("raised then burst, honest", &honest_kinds);
    assert_eq!(
        (real_burst, real_honest),
        (0, 0),
        "shown real: burst {real_burst} of {}, honest {real_honest} of {}",
        burst.len(),
        honest_kinds.len()
    );
    assert!(
        calls.load(Ordering::SeqCst) > before,
        "the burst reached the upstream"
    );
}

/// Open-loop fresh lookups at `rate` a second; each kind with when asked.
async fn asks_at(
    app: &TestApp,
    n: &AtomicUsize,
    rate: u64,
    duration: Duration,
) -> Vec<(Duration, String)> {
    let every = Duration::from_millis(1000 / rate);
    crate::support::open_loop(every, duration, |_| {
        let i = n.fetch_add(1, Ordering::SeqCst) as u64;
        let path = lookup(1 + i % 500, 5_000_000 + i);
        async move { ask(app, &path).await }
    })
    .await
}

/// [`crate::support::assert_fell_through_after_ten_seconds`], with outcomes.
async fn fell_through_after_ten_seconds(app: &TestApp, what: &str, outage: &[(Duration, String)]) {
    let outcomes = outcomes(app).await;
    crate::support::assert_fell_through_after_ten_seconds(what, outage, &outcomes);
}

/// An outage after demand rose fivefold: after 10 s at least 90% fall through.
#[tokio::test]
async fn an_outage_during_a_surge_falls_through_after_ten_seconds() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.track(1..=500).await;
    let n = AtomicUsize::new(0);
    let ask_for = |rate, duration| asks_at(&app, &n, rate, duration);
    ask_for(20, Duration::from_secs(3)).await;
    ask_for(60, Duration::from_secs(1)).await;
    ask_for(100, Duration::from_secs(2)).await;
    app.calltracking.reply(Reply::Status(500));
    let outage = ask_for(100, Duration::from_secs(10 + 4 * crate::support::scale())).await;
    fell_through_after_ten_seconds(&app, "outage in a surge, after 10 s", &outage).await;
}

/// An outage in a ramp beside one always-failing seller, whose failures are
/// judged at once: after 10 s at least 90% fall through.
#[tokio::test]
async fn an_outage_beside_one_failing_seller_falls_through_after_ten_seconds() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    const FAILING: u64 = 900;
    app.track((1..=500).chain([FAILING])).await;
    app.calltracking.reply_for(FAILING, Reply::Status(500));
    let stop = tokio_util::sync::CancellationToken::new();
    let one = {
        let (app, stop) = (&app, stop.clone());
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let mut asked = 0u64;
            while !stop.is_cancelled() {
                ask(app, &lookup(FAILING, 9_000_000 + asked)).await;
                asked += 1;
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_secs(4)) => {}
                }
            }
            asked
        }
    };
    let n = AtomicUsize::new(0);
    let traffic = async {
        asks_at(&app, &n, 4, Duration::from_secs(4)).await;
        for rate in [10, 20, 40, 60] {
            asks_at(&app, &n, rate, Duration::from_secs(2)).await;
        }
        app.calltracking.reply(Reply::Status(500));
        app.calltracking.reply_for(FAILING, Reply::Status(500));
        let outage = asks_at(
            &app,
            &n,
            60,
            Duration::from_secs(10 + 4 * crate::support::scale()),
        )
        .await;
        stop.cancel();
        outage
    };
    let (asked, outage) = tokio::join!(one, traffic);
    assert!(asked >= 5, "the failing seller asked {asked} times");
    fell_through_after_ten_seconds(
        &app,
        "outage beside one failing seller, after 10 s",
        &outage,
    )
    .await;
}

/// Half-open probes refused for load end undecided, not `circuit_open`.
#[tokio::test]
async fn a_half_open_breaker_whose_probes_are_refused_for_load_shows_no_real_number() {
    let app = TestApp::spawn_with("[breaker]\nopen_ms = 300").await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Status(500));
    app.track(1..=40).await;
    for user in 1..=8 {
        let answer = app.get_public(&lookup(user, 100 + user)).await;
        assert_eq!(kind_of(&answer), "real", "{answer:?}");
    }
    app.calltracking.reply(Reply::RetryAfter(429));
    tokio::time::sleep(Duration::from_millis(350)).await;
    // Half-open: the first asks are its probes, refused for load.
    for user in 1..=5 {
        let answer = app.get_public(&lookup(user, 500 + user)).await;
        assert_ne!(kind_of(&answer), "real", "{answer:?}");
    }
    let mut kinds = Vec::new();
    for round in 0..crate::support::scale() {
        let asks = (6..=40u64).map(|user| {
            let app = &app;
            async move {
                kind_of(
                    &app.get_public(&lookup(user, 1_000 + round * 100 + user))
                        .await,
                )
            }
        });
        kinds.extend(futures_util::future::join_all(asks).await);
    }
    crate::support::tally("half-open, probes refused for load", &kinds);
    let real = kinds.iter().filter(|k| *k == "real").count();
    assert_eq!(real, 0, "shown real while half-open: {kinds:?}");
}
