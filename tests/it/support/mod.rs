//! Test harness: the real app on 127.0.0.1:0 against three fake upstreams
//! that are real HTTP servers the test controls. Two guards run under every
//! test: the fakes answer only the request shapes docs/rules.md defines (else
//! recorded, failing on `TestApp`'s drop), and the privacy scanner (`privacy`)
//! fails it on any full number logged.
use std::time::{Duration, Instant};

pub mod alerts;
pub mod app;
pub mod child;
pub mod fakes;
pub mod front;
pub mod paths;
pub mod pg;
pub mod pgbouncer;
pub mod privacy;
pub mod proxy;
pub mod raw;

pub use app::*;
pub use fakes::*;
pub use privacy::*;
pub use raw::*;

/// Prints what a finding's test showed, by kind (or status).
pub fn tally(test: &str, kinds: &[String]) {
    let mut counts = std::collections::BTreeMap::new();
    for kind in kinds {
        *counts.entry(kind.as_str()).or_insert(0usize) += 1;
    }
    eprintln!("{test}: {} lookups, by kind {counts:?}", kinds.len());
}

/// Asks `ask(n)` for n = 0, 1, ... every `every` for `length` without waiting
/// for the answers (an open loop; a missed tick is skipped); each answer with
/// when it was asked.
pub async fn open_loop<T, F: std::future::Future<Output = T>>(
    every: Duration,
    length: Duration,
    mut ask: impl FnMut(u64) -> F,
) -> Vec<(Duration, T)> {
    use futures_util::{FutureExt as _, StreamExt as _};
    let began = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut pending = futures_util::stream::FuturesUnordered::new();
    let mut answers = Vec::new();
    let mut n = 0;
    while began.elapsed() < length {
        tick.tick().await;
        let (at, asked) = (began.elapsed(), ask(n));
        n += 1;
        pending.push(asked.map(move |answer| (at, answer)));
        // Keep the answers flowing without waiting for each.
        while let Some(Some(answered)) = pending.next().now_or_never() {
            answers.push(answered);
        }
    }
    answers.extend(pending.collect::<Vec<_>>().await);
    answers
}

/// The kinds of the answers asked at least 10 s into an outage; asserts at
/// least 90% fell through to the real number (`on_error`), of 200 or more.
/// `context` is printed when it fails.
pub fn assert_fell_through_after_ten_seconds(
    what: &str,
    outage: &[(Duration, String)],
    context: &dyn std::fmt::Debug,
) {
    let late: Vec<String> = outage
        .iter()
        .filter(|(at, _)| *at >= Duration::from_secs(10))
        .map(|(_, kind)| kind.clone())
        .collect();
    let fell_through = late.iter().filter(|k| *k == "real").count();
    tally(what, &late);
    assert!(late.len() >= 200, "{}", late.len());
    assert!(
        fell_through * 10 >= late.len() * 9,
        "{what}: {fell_through} of {} fell through after 10 s: {late:?} {context:?}",
        late.len(),
    );
}

/// How many times over the findings' tests run their lookups:
/// `FINDINGS_SCALE` (1 by default; `scripts/findings` sets it).
pub fn scale() -> u64 {
    std::env::var("FINDINGS_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// Held by each test asserting a tight time bound, so that such tests run one
/// at a time and do not take each other's CPU on a busy two-core machine.
/// Taken after the test's PostgreSQL cluster (`pg`), never before, so that no
/// test holding it waits for a cluster held by a test waiting for it.
pub async fn one_timing_test_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static TIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TIMING.lock().await
}

/// Polls `done` every millisecond until it holds; returns how long that took
/// (the caller checks its bound), panicking naming `what` after `limit`.
pub async fn took_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    start.elapsed()
}

/// Polls `done` every 10 ms until it holds; panics naming `what` after `limit`.
pub async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Status items turning call tracking on (version 1) for `users`, in
/// deliveries of 1,000 (a status write takes at most 10,000).
pub fn tracking(users: impl IntoIterator<Item = u64>) -> Vec<serde_json::Value> {
    let items: Vec<serde_json::Value> = users
        .into_iter()
        .map(|user| serde_json::json!({"user_id": user, "enabled": true, "version": 1}))
        .collect();
    items
        .chunks(1000)
        .map(|items| serde_json::json!({ "items": items }))
        .collect()
}

/// The value of `series` (name and labels as written) in a /metrics text.
pub fn series_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().unwrap())
}

/// A connection of the test's own to the PostgreSQL database at `url`.
pub async fn pg_connection(url: &str) -> sqlx::PgConnection {
    <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .unwrap()
}

/// A connection of the test's own to the SQLite database at `url`.
pub async fn sqlite_connection(url: &str) -> sqlx::SqliteConnection {
    <sqlx::SqliteConnection as sqlx::Connection>::connect(url)
        .await
        .unwrap()
}

/// A temporary directory and the URL of the SQLite file `name` in it.
pub fn sqlite_file(name: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/{name}", dir.path().display());
    (dir, url)
}

/// The tests' HTTP client: it drops pooled connections idle for 2 s, under
/// the gateway's head deadline (`server.header_read_timeout_ms`), so a request
/// never races the gateway closing its connection.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_idle_timeout(std::time::Duration::from_secs(2))
        .build()
        .unwrap()
}
