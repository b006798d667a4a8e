//! Operating it: request ids, every metric family moving after real traffic, the
//! CPU profile.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::support::child::Process;
use crate::support::{Fake, Reply, TOKEN, TestApp, Upstream, eventually, read};
use crate::{ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

#[tokio::test]
async fn request_ids_are_kept_or_made_answered_and_forwarded_upstream() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    let url = format!(
        "{}/v1/public-phone?user_id=1&ad_id=1&category_id=1",
        app.public
    );
    let response = app
        .http
        .get(&url)
        .header("x-request-id", "req-abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "req-abc-123");
    assert_eq!(app.real.request_ids(), ["req-abc-123"]);
    let response = app
        .http
        .get(format!(
            "{}/v1/public-phone?user_id=2&ad_id=1&category_id=1",
            app.public
        ))
        .send()
        .await
        .unwrap();
    let made = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(made.len(), 16, "{made}");
    assert_eq!(app.real.request_ids()[1], made);
    // A header that is not a sane id is replaced.
    let response = app
        .http
        .get(&url)
        .header("x-request-id", "a".repeat(200))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"].len(), 16);
}

/// The sum of a metric's series whose labels include `labels`.
fn sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// The metrics recorder is process-wide: in the test binary, every other test's
/// app moves the same families and sets the same gauges. So this test runs the
/// binary in a process of its own, against fake upstreams of the test's, and
/// scrapes that process: every movement it sees is its own traffic's.
#[tokio::test]
async fn every_metric_family_moves_with_real_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let real = Fake::start(Upstream::RealPhone).await;
    let anonymous = Fake::start(Upstream::Anonymous).await;
    let calltracking = Fake::start(Upstream::Calltracking).await;
    let app = Process::start_with(
        &format!("sqlite://{}/gw.db", dir.path().display()),
        &[
            ("RATE_LIMIT__PER_VIEWER_PER_MINUTE", "1"),
            ("SERVER__MAX_IN_FLIGHT", "1"),
            // The upstreams' bound defaults to server.max_in_flight; at 1, a
            // fetch that outlives its request (user 3's real number, answered
            // 503 by the anonymous source first) made the next real call fail
            // as saturated. Only the server's bound is under test here.
            ("UPSTREAMS__REAL_PHONE__MAX_IN_FLIGHT", "16"),
            ("UPSTREAMS__ANONYMOUS__MAX_IN_FLIGHT", "16"),
            ("UPSTREAMS__CALLTRACKING__MAX_IN_FLIGHT", "16"),
            ("SERVER__REQUEST_DEADLINE_MS", "5000"),
            ("CACHE__REAL_PHONE__TTL_S", "1"),
            ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
            ("UPSTREAMS__REAL_PHONE__TIMEOUT_MS", "3000"),
            ("UPSTREAMS__ANONYMOUS__BASE_URL", &anonymous.url),
            ("UPSTREAMS__CALLTRACKING__BASE_URL", &calltracking.url),
        ],
    )
    .await;
    let get = |base: &str, path: &str, viewer: Option<&str>| {
        let mut request = app.http.get(format!("{base}{path}")).bearer_auth(TOKEN);
        if let Some(viewer) = viewer {
            request = request.header("x-viewer-id", viewer);
        }
        async move { read(request.send().await.unwrap()).await }
    };
    let phone = |user: u64, category: u64| {
        get(
            &app.public,
            &format!("/v1/public-phone?user_id={user}&ad_id=1&category_id={category}"),
            None,
        )
    };
    let statuses = |method: Method, body: serde_json::Value| {
        let request = app
            .http
            .request(
                method,
                format!("{}/admin/v1/calltracking/statuses", app.admin),
            )
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string());
        async move { read(request.send().await.unwrap()).await }
    };
    let scrape = || get(&app.admin, "/metrics", None);
    let before = scrape().await.text;

    real.reply(Reply::Phone(REAL));
    anonymous.reply(Reply::Status(500));
    calltracking.reply(Reply::Phone(VIRTUAL));
    let items = json!({ "items": [
        { "user_id": 2, "enabled": true, "version": 1 },
        { "user_id": 8, "enabled": true, "version": 1 },
    ]});
    assert_eq!(statuses(Method::POST, items).await.status, 200);
    phone(1, PLAIN_CATEGORY).await.assert_number(REAL, "real"); // miss
    phone(1, PLAIN_CATEGORY).await.assert_number(REAL, "real"); // hit
    phone(2, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    phone(3, ANON_CATEGORY).await.assert_problem(503); // fail closed
    calltracking.reply(Reply::Status(500));
    phone(8, PLAIN_CATEGORY).await.assert_number(REAL, "real"); // calltracking falls through
    real.reply(Reply::NotFound);
    phone(4, PLAIN_CATEGORY).await.assert_problem(404);
    real.reply(Reply::Hang);
    phone(5, PLAIN_CATEGORY).await.assert_problem(503); // timeout
    // Past user 1's one-second TTL (a time, not a synchronisation), with real
    // hanging: stale served.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    phone(1, PLAIN_CATEGORY).await.assert_number(REAL, "real");
    // A second request while one is in service: max_in_flight = 1 sheds it.
    real.reply_after(Reply::Phone(REAL), Duration::from_millis(1000));
    let calls = real.calls();
    let (a, b) = tokio::join!(phone(6, PLAIN_CATEGORY), async {
        eventually(
            "the first request in service",
            Duration::from_secs(10),
            || {
                let now = real.calls();
                async move { now > calls }
            },
        )
        .await;
        phone(6, PLAIN_CATEGORY).await
    });
    a.assert_number(REAL, "real");
    b.assert_problem(503);
    get(
        &app.public,
        "/v1/public-phone?user_id=1&ad_id=1&category_id=1",
        Some("v"),
    )
    .await
    .assert_number(REAL, "real");
    get(
        &app.public,
        "/v1/public-phone?user_id=1&ad_id=1&category_id=1",
        Some("v"),
    )
    .await
    .assert_problem(429);
    let snapshot = json!({ "version": 5, "enabled_user_ids": [2, 7] });
    assert_eq!(statuses(Method::PUT, snapshot).await.status, 200);

    let after = scrape().await.text;
    let moved = |name: &str, labels: &[(&str, &str)]| {
        let (b, a) = (sum(&before, name, labels), sum(&after, name, labels));
        assert!(a > b, "{name} {labels:?} did not move: {b} -> {a}\n{after}");
    };
    moved(
        "phones_gateway_http_request_duration_seconds_count",
        &[("route", "/v1/public-phone"), ("status", "200")],
    );
    moved(
        "phones_gateway_http_request_duration_seconds_count",
        &[("route", "/v1/public-phone"), ("status", "503")],
    );
    for outcome in ["ok", "not_found", "timeout", "error"] {
        moved(
            "phones_gateway_upstream_requests_total",
            &[("outcome", outcome)],
        );
    }
    moved(
        "phones_gateway_upstream_request_duration_seconds_count",
        &[("upstream", "real_phone")],
    );
    for result in ["hit", "miss", "stale_served"] {
        moved(
            "phones_gateway_cache_lookups_total",
            &[("cache", "real_phone"), ("result", result)],
        );
    }
    moved("phones_gateway_selections_total", &[("kind", "real")]);
    moved(
        "phones_gateway_selections_total",
        &[("kind", "calltracking")],
    );
    moved(
        "phones_gateway_fail_closed_total",
        &[("source", "anonymous")],
    );
    moved(
        "phones_gateway_fall_through_total",
        &[("source", "calltracking")],
    );
    moved(
        "phones_gateway_resolve_failures_total",
        &[("reason", "no_phone")],
    );
    moved("phones_gateway_shed_total", &[("reason", "in_flight")]);
    moved("phones_gateway_rate_limited_total", &[]);
    moved(
        "phones_gateway_db_operation_duration_seconds_count",
        &[("operation", "apply_changes")],
    );
    moved(
        "phones_gateway_db_operation_duration_seconds_count",
        &[("operation", "apply_snapshot")],
    );
    assert!(sum(&after, "phones_gateway_status_set_users", &[]) >= 2.0);
    assert!(sum(&after, "phones_gateway_status_last_change_seq", &[]) >= 1.0);
    assert!(after.contains("phones_gateway_status_sync_lag_seconds"));
    assert!(
        sum(
            &after,
            "phones_gateway_cache_entries",
            &[("cache", "real_phone")]
        ) >= 1.0
    );
    // No phone number in any label or value line.
    assert!(!after.contains("79161234567") && !after.contains("74951234567"));
}

/// Profiled in a process of its own: the profiler's SIGPROF stays out of the
/// test binary.
#[tokio::test]
async fn a_cpu_profile_is_taken_on_demand_behind_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let process =
        crate::support::child::Process::start(&format!("sqlite://{}/gw.db", dir.path().display()))
            .await;
    let url = |query: &str| format!("{}/admin/v1/debug/pprof/profile?{query}", process.admin);
    let without = read(process.http.get(url("seconds=1")).send().await.unwrap()).await;
    without.assert_problem(401);
    let get = |query: &'static str| {
        let (http, url) = (process.http.clone(), url(query));
        async move {
            read(
                http.get(url)
                    .bearer_auth(crate::support::TOKEN)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    get("seconds=0").await.assert_problem(400);
    get("seconds=1&format=pdf").await.assert_problem(400);
    let top = get("seconds=1&format=top").await;
    assert_eq!(top.status, 200, "{top:?}");
    assert!(top.text.contains("samples over 1s"), "{}", top.text);
    // Some work to sample while the flamegraph is taken.
    let busy = {
        let (http, admin) = (process.http.clone(), process.admin.clone());
        tokio::spawn(async move {
            for _ in 0..300 {
                let _ = http.get(format!("{admin}/metrics")).send().await;
            }
        })
    };
    let svg = get("seconds=1").await;
    busy.abort();
    assert_eq!(svg.status, 200);
    assert_eq!(svg.content_type, "image/svg+xml");
    assert!(
        svg.text.contains("<svg"),
        "{}",
        &svg.text[..svg.text.len().min(200)]
    );
}
