//! Operating it (docs/configuration.md, docs/runbook.md, the README): request
//! ids, every metric family moving, the CPU profile, graceful shutdown,
//! background tasks, a first start, database errors, the command line, and
//! privacy (docs/README.md#privacy; every log line is scanned, `support::privacy`).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::support::child::{Process, Spawned};
use crate::support::paths::{HEALTHZ, METRICS, PROFILE, PUBLIC_PHONE, READYZ, phone_path};
use crate::support::{Fake, Reply, TestApp, Upstream, assert_no_leaks, eventually, pg, read, scan};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

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

/// The binary's `/metrics` before and after [`traffic_moving_every_family`].
struct Scrapes {
    before: String,
    after: String,
}

impl Scrapes {
    #[track_caller]
    fn assert_moved(&self, name: &str, labels: &[(&str, &str)]) {
        let (b, a) = (
            sum(&self.before, name, labels),
            sum(&self.after, name, labels),
        );
        assert!(
            a > b,
            "{name} {labels:?} did not move: {b} -> {a}\n{}",
            self.after
        );
    }
}

/// The metrics recorder is process-wide, so the traffic runs through the
/// binary in a process of its own, scraped before and after, once for all the
/// `metrics_*` tests (again if it failed).
async fn traffic_scrapes() -> &'static Scrapes {
    static SCRAPES: tokio::sync::OnceCell<Scrapes> = tokio::sync::OnceCell::const_new();
    SCRAPES.get_or_init(traffic_moving_every_family).await
}

/// Every kind of answer once: miss, hit, call tracking, fail closed, fall
/// through, 404, timeout, stale, shed, rate-limited, webhook and snapshot.
async fn traffic_moving_every_family() -> Scrapes {
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let real = Fake::start(Upstream::RealPhone).await;
    let anonymous = Fake::start(Upstream::Anonymous).await;
    let calltracking = Fake::start(Upstream::Calltracking).await;
    let app = Process::start_with(
        &url,
        &[
            ("RATE_LIMIT__PER_VIEWER_PER_MINUTE", "1"),
            ("SERVER__MAX_IN_FLIGHT", "1"),
            // Only the server's bound is under test: at 1, a fetch outliving
            // its request would make the next real call fail as saturated.
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
    let phone = |user: u64, category: u64| {
        let (app, path) = (&app, phone_path(user, 1, category));
        async move { app.get_public_with(&path, &[]).await }
    };
    let before = app.get_admin(METRICS).await.text;

    real.reply(Reply::Phone(REAL));
    anonymous.reply(Reply::Status(500));
    calltracking.reply(Reply::Phone(VIRTUAL));
    let items = json!({ "items": [
        { "user_id": 2, "enabled": true, "version": 1 },
        { "user_id": 8, "enabled": true, "version": 1 },
    ]});
    assert_eq!(app.send(Method::POST, items).await, 200);
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
    // Past user 1's one-second TTL, with real hanging: stale served.
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
    let as_viewer = [("x-viewer-id", "v")];
    let path = phone_path(1, 1, 1);
    app.get_public_with(&path, &as_viewer)
        .await
        .assert_number(REAL, "real");
    app.get_public_with(&path, &as_viewer)
        .await
        .assert_problem(429);
    let snapshot = json!({ "version": 5, "enabled_user_ids": [2, 7] });
    assert_eq!(app.send(Method::PUT, snapshot).await, 200);

    let after = app.get_admin(METRICS).await.text;
    Scrapes { before, after }
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_status() {
    let scrapes = traffic_scrapes().await;
    for status in ["200", "503"] {
        scrapes.assert_moved(
            "phones_gateway_http_request_duration_seconds_count",
            &[("route", PUBLIC_PHONE), ("status", status)],
        );
    }
}

#[tokio::test]
async fn metrics_count_upstream_calls_by_outcome_and_time_them() {
    let scrapes = traffic_scrapes().await;
    for outcome in ["ok", "not_found", "timeout", "error"] {
        scrapes.assert_moved(
            "phones_gateway_upstream_requests_total",
            &[("outcome", outcome)],
        );
    }
    scrapes.assert_moved(
        "phones_gateway_upstream_request_duration_seconds_count",
        &[("upstream", "real_phone")],
    );
}

#[tokio::test]
async fn metrics_count_cache_lookups_by_result_and_gauge_the_entries() {
    let scrapes = traffic_scrapes().await;
    for result in ["hit", "miss", "stale_served"] {
        scrapes.assert_moved(
            "phones_gateway_cache_lookups_total",
            &[("cache", "real_phone"), ("result", result)],
        );
    }
    assert!(
        sum(
            &scrapes.after,
            "phones_gateway_cache_entries",
            &[("cache", "real_phone")]
        ) >= 1.0
    );
}

#[tokio::test]
async fn metrics_count_selections_and_how_sources_failed() {
    let scrapes = traffic_scrapes().await;
    for (name, labels) in [
        ("phones_gateway_selections_total", [("kind", "real")]),
        (
            "phones_gateway_selections_total",
            [("kind", "calltracking")],
        ),
        (
            "phones_gateway_fail_closed_total",
            [("source", "anonymous")],
        ),
        (
            "phones_gateway_fall_through_total",
            [("source", "calltracking")],
        ),
        (
            "phones_gateway_resolve_failures_total",
            [("reason", "no_phone")],
        ),
    ] {
        scrapes.assert_moved(name, &labels);
    }
}

#[tokio::test]
async fn metrics_count_shed_and_rate_limited_requests() {
    let scrapes = traffic_scrapes().await;
    scrapes.assert_moved("phones_gateway_shed_total", &[("reason", "in_flight")]);
    scrapes.assert_moved("phones_gateway_rate_limited_total", &[]);
}

#[tokio::test]
async fn metrics_time_status_writes_and_gauge_the_status_set() {
    let scrapes = traffic_scrapes().await;
    for operation in ["apply_changes", "apply_snapshot"] {
        scrapes.assert_moved(
            "phones_gateway_db_operation_duration_seconds_count",
            &[("operation", operation)],
        );
    }
    let after = &scrapes.after;
    assert!(sum(after, "phones_gateway_status_set_users", &[]) >= 2.0);
    assert!(sum(after, "phones_gateway_status_last_change_seq", &[]) >= 1.0);
    assert!(after.contains("phones_gateway_status_sync_lag_seconds"));
}

/// Two apps in one process: each one's `/metrics` shows its own request
/// durations, status set, cache entries and reveal buffer, not the other's.
#[tokio::test]
async fn each_app_in_a_process_shows_its_own_metrics() {
    let busy = TestApp::spawn().await;
    let idle = TestApp::spawn_with("[reveals]\nenabled = false\n").await;
    busy.real.reply(Reply::Phone(REAL));
    busy.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    assert_eq!(busy.set_status(7, true, 1).await, 200);
    let lookups = format!(
        "phones_gateway_http_request_duration_seconds_count{{route=\"{PUBLIC_PHONE}\",status=\"200\"}}"
    );
    let entries = "phones_gateway_cache_entries{cache=\"real_phone\"}";
    let users = "phones_gateway_status_set_users";
    let value = |text: &str, series: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map(str::to_owned)
    };
    let busy = busy.get_admin(METRICS).await.text;
    let idle = idle.get_admin(METRICS).await.text;
    assert_eq!(value(&busy, &lookups).as_deref(), Some("1"), "{busy}");
    assert_eq!(value(&idle, &lookups), None, "{idle}");
    assert_eq!(value(&busy, entries).as_deref(), Some("1"), "{busy}");
    assert_eq!(value(&idle, entries).as_deref(), Some("0"), "{idle}");
    assert_eq!(value(&busy, users).as_deref(), Some("1"), "{busy}");
    assert_eq!(value(&idle, users).as_deref(), Some("0"), "{idle}");
    let buffered = "phones_gateway_reveals_buffered";
    assert!(value(&busy, buffered).is_some(), "{busy}");
    assert_eq!(value(&idle, buffered), None, "{idle}");
}

#[tokio::test]
async fn metrics_hold_no_phone_number() {
    let after = &traffic_scrapes().await.after;
    assert!(!after.contains("79161234567") && !after.contains("74951234567"));
}

/// Profiled in a process of its own: SIGPROF stays out of the test binary.
#[tokio::test]
async fn a_cpu_profile_is_taken_on_demand_behind_the_token() {
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let process = crate::support::child::Process::start(&url).await;
    let url = |query: &str| format!("{}{PROFILE}?{query}", process.admin);
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

#[tokio::test]
async fn shutdown_turns_readyz_503_then_drains_in_flight_requests() {
    let mut app = TestApp::spawn_with(
        "[server]\nshutdown_pause_ms = 1500\nrequest_deadline_ms = 10000\n[upstreams.real_phone]\ntimeout_ms = 5000",
    )
    .await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(2500));
    let in_flight = app.phone_in_background(1, 1, PLAIN_CATEGORY);
    app.real
        .until_calls("the request in service", 1, Duration::from_secs(10))
        .await;
    let stopped = app.shutdown();
    // During the pause: not ready, still serving.
    eventually(
        "readyz 503 after the signal",
        Duration::from_secs(1),
        || async { app.get_admin(READYZ).await.status == 503 },
    )
    .await;
    app.get_admin(READYZ).await.assert_problem(503);
    assert_eq!(app.get_admin(HEALTHZ).await.status, 200);
    assert!(
        !in_flight.is_finished(),
        "the in-flight request is still in service"
    );
    in_flight.await.unwrap().assert_number(REAL, "real");
    stopped.await.unwrap().unwrap();
    assert!(
        app.http
            .get(format!("{}/healthz", app.admin))
            .send()
            .await
            .is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn the_drain_has_a_hard_deadline() {
    let mut app = TestApp::spawn_with(
        "[server]\ndrain_timeout_ms = 300\nrequest_deadline_ms = 20000\n[upstreams.real_phone]\ntimeout_ms = 10000",
    )
    .await;
    app.real.reply(Reply::Hang);
    let (public, http) = (app.public.clone(), app.http.clone());
    let _hung = tokio::spawn(async move {
        http.get(format!(
            "{public}/v1/public-phone?user_id=1&ad_id=1&category_id=1"
        ))
        .send()
        .await
    });
    // An idle keep-alive connection must not hold the drain open either.
    assert_eq!(app.get_admin(HEALTHZ).await.status, 200);
    app.real
        .until_calls("the request in service", 1, Duration::from_secs(10))
        .await;
    let start = Instant::now();
    app.shutdown().await.unwrap().unwrap();
    // 300 ms of drain; the request would hold it 10 s.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// SIGTERM while a request is in service: the request is answered, then the
/// process exits 0.
#[tokio::test]
async fn sigterm_drains_an_in_flight_request_and_exits_zero() {
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let real = Fake::start(Upstream::RealPhone).await;
    real.reply_after(Reply::Phone(REAL), Duration::from_millis(1500));
    let process = Process::start_with(
        &url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
            ("UPSTREAMS__REAL_PHONE__TIMEOUT_MS", "5000"),
            ("SERVER__REQUEST_DEADLINE_MS", "8000"),
        ],
    )
    .await;
    let in_flight = {
        let url = format!(
            "{}/v1/public-phone?user_id=1&ad_id=1&category_id={PLAIN_CATEGORY}",
            process.public
        );
        let http = process.http.clone();
        tokio::spawn(async move { read(http.get(url).send().await.unwrap()).await })
    };
    real.until_calls(
        "the request to reach the upstream",
        1,
        Duration::from_secs(10),
    )
    .await;
    let status = tokio::task::spawn_blocking(move || process.sigterm())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    in_flight.await.unwrap().assert_number(REAL, "real");
    assert!(real.unexpected().is_empty(), "{:?}", real.unexpected());
}

#[tokio::test]
async fn dropping_a_running_app_stops_its_background_tasks() {
    let feed = crate::support::Fake::start(crate::support::Upstream::Calltracking).await;
    let dir = tempfile::tempdir().unwrap();
    let config = phones_gateway::config::Config::from_toml(&format!(
        "[database]\nurl = \"sqlite://{}/gw.db\"\n\
         [server]\npublic_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\n\
         [upstreams.calltracking]\nbase_url = \"{}\"\n\
         [upstreams.calltracking.status_feed]\nenabled = true\ninterval_ms = 20",
        dir.path().display(),
        feed.url
    ))
    .unwrap();
    let app = phones_gateway::app::App::build(config).await.unwrap();
    let running = tokio::spawn(app.run(std::future::pending()));
    eventually("the feed is polled", Duration::from_secs(5), || async {
        feed.feed_uris().len() > 2
    })
    .await;
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    // A poll already under way may still land; after that, nothing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let calls = feed.feed_uris().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        feed.feed_uris().len(),
        calls,
        "the feed loop outlived its app"
    );
}

/// The WARN and ERROR lines of a first start, once ready and its first
/// retention round and flush have run.
async fn first_start_complaints(database_url: &str) -> Vec<String> {
    let process = Process::start_with(database_url, &[("REVEALS__FLUSH_INTERVAL_MS", "50")]).await;
    eventually(
        "the first retention round",
        Duration::from_secs(10),
        || async {
            let Ok(answer) = process
                .http
                .get(format!("{}/metrics", process.admin))
                .send()
                .await
            else {
                return false;
            };
            answer.text().await.is_ok_and(|text| {
                text.lines().any(|line| {
                    line.starts_with(
                        "phones_gateway_db_operation_duration_seconds_count{operation=\"delete_reveals\"}",
                    )
                })
            })
        },
    )
    .await;
    process
        .child
        .lines_so_far()
        .into_iter()
        .filter(|line| line.contains("\"WARN\"") || line.contains("\"ERROR\""))
        .collect()
}

#[tokio::test]
async fn a_first_start_on_a_fresh_sqlite_file_logs_no_warning() {
    let (_dir, url) = crate::support::sqlite_file("fresh.db?mode=rwc");
    let complaints = first_start_complaints(&url).await;
    assert!(complaints.is_empty(), "{complaints:#?}");
}

#[tokio::test]
async fn a_first_start_on_a_fresh_postgres_logs_no_warning() {
    let db = pg::or_skip!(pg::database().await);
    let complaints = first_start_complaints(&db.url).await;
    assert!(complaints.is_empty(), "{complaints:#?}");
}

#[tokio::test]
async fn a_database_that_refuses_is_named_with_its_address_and_cause() {
    let port = pg::free_port();
    let url = format!("postgres://gateway:s3cret-pw@127.0.0.1:{port}/gateway");
    let child = Spawned::spawn(serve_json(&url), "phones-gateway serve");
    let mut seen = Vec::new();
    eventually("a line naming the cause", Duration::from_secs(10), || {
        seen.extend(child.lines_so_far());
        let found = seen
            .iter()
            .any(|line| line.contains(&format!("127.0.0.1:{port}")) && line.contains("refused"));
        async move { found }
    })
    .await;
    assert!(
        !seen.iter().any(|line| line.contains("s3cret-pw")),
        "the password was logged"
    );
}

fn built_commit() -> String {
    let output = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        _ => "unknown".to_owned(),
    }
}

/// Call tracking refuses every connection: the failures are logged at WARN by
/// upstream and outcome with their count (a line per 10 s at most).
#[tokio::test]
async fn an_upstreams_failures_are_logged_at_warn_at_the_default_level() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let real = Fake::start(Upstream::RealPhone).await;
    real.reply(Reply::Phone(REAL));
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let calltracking = format!("http://{closed}");
    let process = Process::start_with(
        &url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", real.url.as_str()),
            ("UPSTREAMS__CALLTRACKING__BASE_URL", calltracking.as_str()),
            ("LOG__FILTER", "info"),
        ],
    )
    .await;
    process.track(1..=7).await;
    for user in 1..=7 {
        let got = process
            .get_public_with(&phone_path(user, 1, PLAIN_CATEGORY), &[])
            .await;
        assert_eq!(got.status, 200, "{got:?}");
    }
    let mut warned = Vec::new();
    let started = Instant::now();
    while warned.is_empty() && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        warned = process
            .child
            .lines_so_far()
            .into_iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(&line).ok())
            .filter(|json| {
                json["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("upstream calls failed"))
            })
            .collect();
    }
    let [line] = &warned[..] else {
        panic!("one WARN line within 10 s: {warned:?}");
    };
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["fields"]["upstream"], "calltracking", "{line}");
    assert_eq!(line["fields"]["outcome"], "error", "{line}");
    let error = line["fields"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("could not connect"), "{line}");
    assert!(line["fields"]["count"].as_u64() >= Some(1), "{line}");
}

/// `--version` shows version and commit, `serve` logs them, and
/// `phones_gateway_build_info{version, commit}` is 1.
#[tokio::test]
async fn the_version_and_commit_are_in_the_version_the_start_log_and_a_metric() {
    let commit = built_commit();
    let version = env!("CARGO_PKG_VERSION");
    let mut command = binary();
    command.arg("--version");
    let (output, stdout, stderr) = run(command, "phones-gateway --version");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.trim(),
        format!("phones-gateway {version} ({commit})")
    );

    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let child = Spawned::spawn(serve_json(&url), "phones-gateway serve");
    let limit = Duration::from_secs(30);
    let logged = child
        .logged("phones-gateway starting", &["version", "commit"], limit)
        .await;
    assert_eq!(logged, [version.to_owned(), commit.clone()]);
    let admin = child.logged("listening", &["admin"], limit).await;
    let metrics = reqwest::get(format!("http://{}{METRICS}", admin[0]))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series =
        format!("phones_gateway_build_info{{version=\"{version}\",commit=\"{commit}\"}} 1");
    let reversed =
        format!("phones_gateway_build_info{{commit=\"{commit}\",version=\"{version}\"}} 1");
    assert!(
        metrics
            .lines()
            .any(|line| line == series || line == reversed),
        "no {series}: {}",
        metrics
            .lines()
            .filter(|line| line.contains("build_info"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The `phones_gateway_*` series docs/operations.md lists as absent until
/// first used (a trailing `*` a prefix), without labels.
fn listed_as_absent() -> Vec<String> {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"),
    )
    .unwrap();
    let start = doc
        .find("### Series that are absent until first used")
        .unwrap();
    let section = &doc[start..];
    let section = &section[section.find("These are not").unwrap()..];
    let section = &section[..section.find("What that means for alerts").unwrap()];
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| word.starts_with("phones_gateway_"))
        .map(|word| word.split('{').next().unwrap_or(word).to_owned())
        .collect()
}

/// Every series a chart alert reads is on a fresh replica's /metrics, or
/// docs/operations.md lists it as absent until first used (an alert over a
/// missing series sees nothing, not 0).
#[tokio::test]
async fn every_series_an_alert_reads_is_there_from_the_start_or_listed_as_absent() {
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let process = Process::start(&url).await;
    let metrics = process.get_admin(METRICS).await.text;
    let listed = listed_as_absent();
    let is_listed = |name: &str| {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        listed.iter().any(|l| match l.strip_suffix('*') {
            Some(prefix) => family.starts_with(prefix),
            None => l == family,
        })
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for alert in crate::support::alerts::chart_alerts(root) {
        for (name, labels) in crate::support::alerts::series_read(&alert.expr) {
            let there = metrics.lines().any(|line| {
                (line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
                    && labels.iter().all(|label| line.contains(label.as_str()))
            });
            if !there && !is_listed(&name) {
                missing.push(format!("{}: {name}{labels:?}", alert.name));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "absent on a fresh replica and not listed as such: {missing:#?}"
    );
}

/// `serve` on the database at `url`, listeners on port 0, logging JSON.
fn serve_json(url: &str) -> Command {
    let mut command = binary();
    command
        .arg("serve")
        .env("PHONES_GATEWAY__SERVER__PUBLIC_ADDR", "127.0.0.1:0")
        .env("PHONES_GATEWAY__SERVER__ADMIN_ADDR", "127.0.0.1:0")
        .env("PHONES_GATEWAY__DATABASE__URL", url)
        .env("PHONES_GATEWAY__LOG__FORMAT", "json");
    command
}

fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_phones-gateway"));
    // The settings of whoever runs the tests are not the test's.
    for (name, _) in std::env::vars() {
        if name.starts_with("PHONES_GATEWAY") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    command
}

/// Runs `command` to its end, stdout and stderr piped and scanned for numbers.
fn run(mut command: Command, name: &str) -> (Output, String, String) {
    let output = command.output().expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    scan(&format!("{name} stdout"), &stdout);
    scan(&format!("{name} stderr"), &stderr);
    (output, stdout, stderr)
}

#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let (_dir, url) = crate::support::sqlite_file("gateway.db");
    let mut command = binary();
    command
        .arg("migrate")
        .env("PHONES_GATEWAY__DATABASE__URL", url)
        .env("PHONES_GATEWAY__LOG__FORMAT", "text");
    let (output, stdout, stderr) = run(command, "phones-gateway migrate");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("migrations applied"), "{stdout}\n{stderr}");
    for (stream, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !text.contains("\x1b["),
            "escape codes on {stream}: {text:?}"
        );
    }
}

/// `migrate --status` lists every migration as pending or applied and applies
/// nothing; `migrate` lists what it applied, and again says none pending.
fn migrate_says_what_it_applied_and_what_is_pending(url: &str, kind: &str) {
    let files: Vec<String> = {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(kind);
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
            .iter()
            .map(|name| {
                name.trim_end_matches(".sql")
                    .replacen('_', " ", 1)
                    .replace('_', " ")
            })
            .collect()
    };
    let total = files.len();
    assert!(total >= 8, "{files:?}");
    let migrate = |args: &[&str]| {
        let mut command = binary();
        command
            .arg("migrate")
            .args(args)
            .env("PHONES_GATEWAY__DATABASE__URL", url)
            .env("PHONES_GATEWAY__LOG__FORMAT", "text");
        let (output, stdout, stderr) = run(command, "phones-gateway migrate");
        assert!(output.status.success(), "{stdout}\n{stderr}");
        stdout
    };
    let listed = |stdout: &str, state: &str| -> Vec<String> {
        stdout
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("{state}  ")))
            .map(str::to_owned)
            .collect()
    };
    for _ in 0..2 {
        let stdout = migrate(&["--status"]);
        assert_eq!(listed(&stdout, "pending"), files, "{stdout}");
        assert!(listed(&stdout, "applied").is_empty(), "{stdout}");
        assert!(
            stdout.contains(&format!("{kind}: 0 applied, {total} pending")),
            "{stdout}"
        );
    }
    let stdout = migrate(&[]);
    assert_eq!(listed(&stdout, "applied"), files, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "{kind}: {total} applied now, {total} applied, 0 pending"
        )),
        "{stdout}"
    );
    let stdout = migrate(&[]);
    assert!(listed(&stdout, "applied").is_empty(), "{stdout}");
    assert!(
        stdout.contains("no migration pending: nothing applied"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{kind}: 0 applied now, {total} applied, 0 pending"
        )),
        "{stdout}"
    );
    let stdout = migrate(&["--status"]);
    assert_eq!(listed(&stdout, "applied"), files, "{stdout}");
    assert!(
        stdout.contains(&format!("{kind}: {total} applied, 0 pending")),
        "{stdout}"
    );
}

#[test]
fn migrate_says_what_it_applied_and_what_is_pending_on_sqlite() {
    let (_dir, url) = crate::support::sqlite_file("gateway.db");
    migrate_says_what_it_applied_and_what_is_pending(&url, "sqlite");
}

#[tokio::test]
async fn migrate_says_what_it_applied_and_what_is_pending_on_postgres() {
    let db = pg::or_skip!(pg::database().await);
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || {
        migrate_says_what_it_applied_and_what_is_pending(&url, "postgres");
    })
    .await
    .unwrap();
}

/// A file with three mistakes: unknown key, wrong type, out of range.
const THREE_MISTAKES: &str = "[server]\npublic_adr = \"0.0.0.0:1\"\n\
    [upstreams.real_phone]\ntimeout_ms = \"fast\"\n\
    [cache.anonymous]\ncapacity = 0\n";
const THREE_KEYS: [&str; 3] = [
    "server.public_adr",
    "upstreams.real_phone.timeout_ms",
    "cache.anonymous.capacity",
];

/// `command` (`check-config` or `serve`) on [`THREE_MISTAKES`] by a relative
/// path, with `RUST_BACKTRACE=1`: one run names all three keys, the file by
/// its absolute path, and prints no backtrace.
fn names_every_mistake_at_once(command: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gw.toml"), THREE_MISTAKES).unwrap();
    let mut binary = binary();
    binary
        .args([command, "--config", "gw.toml"])
        .current_dir(dir.path())
        .env("RUST_BACKTRACE", "1")
        .env(
            "PHONES_GATEWAY__DATABASE__URL",
            format!("sqlite://{}/gateway.db", dir.path().display()),
        );
    let (output, stdout, stderr) = run(binary, &format!("phones-gateway {command}"));
    assert_eq!(output.status.code(), Some(2), "{stdout}\n{stderr}");
    for key in THREE_KEYS {
        assert!(stderr.contains(key), "{key} not named: {stderr}");
    }
    assert!(!stderr.contains("default."), "{stderr}");
    let absolute = dir.path().join("gw.toml").display().to_string();
    assert!(
        stderr.contains(&format!("(in {absolute})")),
        "no {absolute}: {stderr}"
    );
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
    assert!(!stderr.contains("  0: "), "a backtrace: {stderr}");
}

#[test]
fn check_config_names_every_mistake_in_one_run() {
    names_every_mistake_at_once("check-config");
}

#[test]
fn a_start_with_a_bad_configuration_names_every_mistake_in_one_run() {
    names_every_mistake_at_once("serve");
}

/// `check-config` names a bad `selection.order` source, a capacity of 0 and a
/// bad category variable in one run, list elements by index.
#[test]
fn check_config_names_a_bad_list_element_among_the_other_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gw.toml");
    std::fs::write(
        &file,
        "[selection]\norder = [\"anonymous\", \"bogus\"]\n[cache.anonymous]\ncapacity = 0\n",
    )
    .unwrap();
    let mut command = binary();
    command.args(["check-config", "--config"]).arg(&file).env(
        "PHONES_GATEWAY__SELECTION__ANONYMOUS_CATEGORIES",
        "[9, \"x\"]",
    );
    let (output, stdout, stderr) = run(command, "phones-gateway check-config");
    assert_eq!(output.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("3 mistakes"), "{stderr}");
    let absolute = file.display().to_string();
    for (key, source) in [
        ("selection.order[1]", format!("(in {absolute})")),
        ("cache.anonymous.capacity", format!("(in {absolute})")),
        (
            "selection.anonymous_categories[1]",
            "(from environment variable PHONES_GATEWAY__SELECTION__ANONYMOUS_CATEGORIES)"
                .to_owned(),
        ),
    ] {
        let line = stderr
            .lines()
            .find(|line| line.trim_start().starts_with(&format!("{key}: ")))
            .unwrap_or_else(|| panic!("{key} not named: {stderr}"));
        assert!(line.ends_with(&source), "{key} without {source}: {stderr}");
    }
}

/// A start that cannot go on (port taken) ends with one line and exit status
/// 1, also with `RUST_BACKTRACE=1`.
#[test]
fn a_fatal_start_is_one_line_without_a_backtrace() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (_dir, url) = crate::support::sqlite_file("gateway.db");
    let mut command = binary();
    command
        .arg("serve")
        .env("RUST_BACKTRACE", "1")
        .env(
            "PHONES_GATEWAY__SERVER__PUBLIC_ADDR",
            taken.local_addr().unwrap().to_string(),
        )
        .env("PHONES_GATEWAY__SERVER__ADMIN_ADDR", "127.0.0.1:0")
        .env("PHONES_GATEWAY__DATABASE__URL", url);
    let (output, stdout, stderr) = run(command, "phones-gateway serve");
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Error: binding server.public_addr"),
        "{stdout}\n{stderr}"
    );
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
    assert!(!stderr.contains("  0: "), "a backtrace: {stderr}");
}

#[test]
fn check_config_warns_of_a_mistyped_environment_prefix() {
    let mut command = binary();
    command
        .arg("check-config")
        .env("PHONES_GATEWAY_ADMIN__TOKEN", "not-read-0123456789")
        // The scripts' own variable (scripts/cluster), not an override.
        .env("PHONES_GATEWAY_BIN", "/somewhere/phones-gateway");
    let (output, stdout, stderr) = run(command, "phones-gateway check-config");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("warning: environment variable PHONES_GATEWAY_ADMIN__TOKEN is not read"),
        "{stderr}"
    );
    assert!(!stderr.contains("PHONES_GATEWAY_BIN"), "{stderr}");
    // The token is empty too (it was not read): check-config says what that means.
    assert!(
        stderr.contains(
            "admin.token is empty and no [[admin.tokens]] is set: every /admin/ route will answer 401"
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains("not-read-0123456789"),
        "the value: {stderr}"
    );
}

#[tokio::test]
async fn a_start_warns_of_a_mistyped_environment_prefix() {
    let (_dir, url) = crate::support::sqlite_file("gateway.db");
    let mut command = serve_json(&url);
    command.env("PHONES_GATEWAY_ADMIN__TOKEN", "not-read-0123456789");
    let child = crate::support::child::Spawned::spawn(command, "phones-gateway serve");
    let named = child
        .logged(
            "environment variable not read: overrides start with PHONES_GATEWAY__",
            &["variable"],
            std::time::Duration::from_secs(30),
        )
        .await;
    assert_eq!(named, ["PHONES_GATEWAY_ADMIN__TOKEN"]);
}

/// A gateway process in each log format: its lines speak of numbers, masked,
/// and hold no full one.
#[tokio::test]
async fn no_full_phone_number_in_the_logs() {
    for format in ["json", "text"] {
        let real = Fake::start(Upstream::RealPhone).await;
        let anonymous = Fake::start(Upstream::Anonymous).await;
        let calltracking = Fake::start(Upstream::Calltracking).await;
        let (_dir, url) = crate::support::sqlite_file("gw.db");
        let process = Process::start_with(
            &url,
            &[
                ("LOG__FORMAT", format),
                ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
                ("UPSTREAMS__ANONYMOUS__BASE_URL", &anonymous.url),
                ("UPSTREAMS__CALLTRACKING__BASE_URL", &calltracking.url),
            ],
        )
        .await;
        real.reply(Reply::Phone(REAL));
        anonymous.reply(Reply::Phone(ANON));
        calltracking.reply(Reply::Phone(VIRTUAL));
        let tracked = json!({ "items": [
            { "user_id": 61, "enabled": true, "version": 1 },
            { "user_id": 64, "enabled": true, "version": 1 },
        ]});
        assert_eq!(process.send(Method::POST, tracked).await, 200);
        let get = |path: String| {
            let process = &process;
            async move { process.get_public_with(&path, &[]).await }
        };
        get(phone_path(60, 1, ANON_CATEGORY))
            .await
            .assert_number(ANON, "anonymous");
        get(phone_path(61, 1, PLAIN_CATEGORY))
            .await
            .assert_number(VIRTUAL, "calltracking");
        get(phone_path(62, 1, PLAIN_CATEGORY))
            .await
            .assert_number(REAL, "real");
        for phone in ["%2B7916123456x", "79161234567"] {
            get(format!(
                "{}&phone={phone}",
                phone_path(63, 1, PLAIN_CATEGORY)
            ))
            .await
            .assert_problem(400);
        }
        calltracking.reply(Reply::Status(500));
        get(phone_path(64, 1, PLAIN_CATEGORY))
            .await
            .assert_number(REAL, "real");
        let lines = process.child.lines_so_far();
        assert!(
            lines.iter().any(|line| line.contains("+*********67")),
            "no masked number in the {format} log's {} lines",
            lines.len()
        );
    }
    assert_no_leaks();
}

/// A parser's message quotes the body: a number in a body must not reach the
/// log of the failed call.
#[tokio::test]
async fn upstream_bodies_quoting_a_number_are_never_logged() {
    let app = TestApp::spawn().await;
    app.enable_calltracking(2, 1).await;
    let bodies: [(&str, &str); 6] = [
        (
            r#"{"phone": 79161234567}"#,
            r#"{"virtual_phone": 74951234567}"#,
        ),
        (
            r#"{"phone": "79161234567"}"#,
            r#"{"virtual_phone": "74951234567"}"#,
        ),
        (
            r#"{"phone": "+7916123456789012"}"#,
            r#"{"virtual_phone": "+7 495 123.45.67"}"#,
        ),
        (
            r#"{"phone": ["+79161234567"]}"#,
            r#"{"virtual_phone": {"n": "+74951234567"}}"#,
        ),
        (
            r#"{"phone": "+79161234567""#,
            r#"{"virtual_phone": +74951234567}"#,
        ),
        ("79161234567", "+74951234567"),
    ];
    for (i, (phone_body, virtual_body)) in bodies.into_iter().enumerate() {
        let ad = i as u64 + 1;
        app.anonymous.reply(Reply::Body(phone_body));
        app.real.reply(Reply::Phone(REAL));
        app.phone(1, ad, ANON_CATEGORY).await.assert_problem(503);
        app.calltracking.reply(Reply::Body(virtual_body));
        app.assert_phone(2, ad, PLAIN_CATEGORY, REAL, "real").await;
        app.real.reply(Reply::Body(phone_body));
        app.phone(3, ad, PLAIN_CATEGORY).await.assert_problem(503);
    }
    assert_eq!(app.anonymous.calls(), 6);
    assert_eq!(app.calltracking.calls(), 6);
    assert_no_leaks();
}
