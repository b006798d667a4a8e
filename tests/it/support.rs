//! Test harness: the real app on 127.0.0.1:0 against three fake upstreams that are
//! real HTTP servers whose answers, delays and call counts the test controls.
//!
//! Two guards run under every test:
//! - the fakes answer only the request shapes docs/rules.md defines (method, path and
//!   query); anything else is answered 400 and recorded, and `TestApp`'s drop
//!   fails the test, so a wrong path cannot pass as "the seller has no phone";
//! - the privacy scanner (below) reads every log line as it is written, in the
//!   text and the JSON format, at trace level for the crate, and records every
//!   full phone number it finds; `TestApp`'s drop (and `Process`'s for the
//!   binary's own output) fails the test on any leak recorded so far.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use figment::providers::Format;
use phones_gateway::app::App;
use phones_gateway::config::Config;
use serde_json::Value;

pub const TOKEN: &str = "test-admin-token-0123456789";

/// What a fake upstream answers.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with the phone in the upstream's field (`phone` or `virtual_phone`).
    Phone(&'static str),
    /// 404.
    NotFound,
    /// Any status with an empty body.
    Status(u16),
    /// 200 with a body that is not JSON.
    Garbage,
    /// 200 with exactly this body (JSON or not).
    Body(&'static str),
    /// Accept the request and never answer (held for 60 s, far past any timeout).
    Hang,
}

/// Which upstream a fake stands for: it decides the request shapes it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// `GET /v1/users/{user_id}/phone?ad_id={ad_id}`.
    RealPhone,
    /// `GET /v1/anonymous-numbers?user_id={u}&ad_id={a}`.
    Anonymous,
    /// `GET /v1/virtual-numbers?user_id={u}&phone=%2B{digits}` and the status feed
    /// `GET /v1/statuses?limit={n}[&after={cursor}]`.
    Calltracking,
}

impl Upstream {
    fn field(self) -> &'static str {
        match self {
            Upstream::Calltracking => "virtual_phone",
            _ => "phone",
        }
    }
}

#[derive(Clone)]
struct Behaviour {
    reply: Reply,
    delay: Duration,
}

/// The `traceparent` (empty when missing) and `tracestate` of a call.
pub type Traced = (String, Option<String>);

/// A fake upstream: a real HTTP server on 127.0.0.1:0.
#[derive(Clone)]
pub struct Fake {
    pub url: String,
    upstream: Upstream,
    behaviour: Arc<Mutex<Behaviour>>,
    calls: Arc<AtomicUsize>,
    uris: Arc<Mutex<Vec<String>>>,
    unexpected: Arc<Mutex<Vec<String>>>,
    request_ids: Arc<Mutex<Vec<String>>>,
    /// The `traceparent` and `tracestate` (if any) of every number lookup.
    traces: Arc<Mutex<Vec<Traced>>>,
    /// The status feed's items (call tracking only); the cursor is an index.
    feed: Arc<Mutex<Vec<Value>>>,
    feed_uris: Arc<Mutex<Vec<String>>>,
}

impl Fake {
    pub async fn start(upstream: Upstream) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Fake {
            url: format!("http://{}", listener.local_addr().unwrap()),
            upstream,
            behaviour: Arc::new(Mutex::new(Behaviour {
                reply: Reply::NotFound,
                delay: Duration::ZERO,
            })),
            calls: Arc::new(AtomicUsize::new(0)),
            uris: Arc::new(Mutex::new(Vec::new())),
            unexpected: Arc::new(Mutex::new(Vec::new())),
            request_ids: Arc::new(Mutex::new(Vec::new())),
            traces: Arc::new(Mutex::new(Vec::new())),
            feed: Arc::new(Mutex::new(Vec::new())),
            feed_uris: Arc::new(Mutex::new(Vec::new())),
        };
        let router = Router::new().fallback(answer).with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        fake
    }

    /// Answer `reply` from now on, at once.
    pub fn reply(&self, reply: Reply) {
        self.reply_after(reply, Duration::ZERO);
    }

    /// Answer `reply` from now on, after `delay`.
    pub fn reply_after(&self, reply: Reply, delay: Duration) {
        *self.behaviour.lock().unwrap() = Behaviour { reply, delay };
    }

    /// Number lookups received (the status feed's polls are not counted).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The path and query of every number lookup received.
    pub fn uris(&self) -> Vec<String> {
        self.uris.lock().unwrap().clone()
    }

    /// Requests that are not a shape docs/rules.md defines for this upstream.
    pub fn unexpected(&self) -> Vec<String> {
        self.unexpected.lock().unwrap().clone()
    }

    /// The `x-request-id` of every call received.
    pub fn request_ids(&self) -> Vec<String> {
        self.request_ids.lock().unwrap().clone()
    }

    /// The `traceparent` (empty when missing) and `tracestate` of every number
    /// lookup received.
    pub fn traces(&self) -> Vec<Traced> {
        self.traces.lock().unwrap().clone()
    }

    /// Serves `(user_id, enabled, version)` items on the status feed (call
    /// tracking only), in this order; cursors are positions in the list.
    pub fn feed(&self, items: &[(u64, bool, u64)]) {
        *self.feed.lock().unwrap() = items
            .iter()
            .map(|&(user_id, enabled, version)| {
                serde_json::json!({ "user_id": user_id, "enabled": enabled, "version": version })
            })
            .collect();
    }

    /// The path and query of every status-feed poll received.
    pub fn feed_uris(&self) -> Vec<String> {
        self.feed_uris.lock().unwrap().clone()
    }
}

/// A positive decimal id that fits an i64, as the app sends ids.
fn is_id(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && !text.starts_with('0')
        && text.parse::<i64>().is_ok()
}

/// The query's `key=value` pairs, in order, undecoded.
fn pairs(query: &str) -> Vec<(&str, &str)> {
    query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .collect()
}

/// What a request to `upstream` is, if it is one docs/rules.md defines.
enum Shape {
    Lookup,
    /// A status-feed poll: the position after which to answer, and the limit.
    Feed(usize, usize),
}

fn shape(upstream: Upstream, method: &Method, path: &str, query: &str) -> Option<Shape> {
    if method != Method::GET {
        return None;
    }
    let query = pairs(query);
    match upstream {
        Upstream::RealPhone => {
            let user = path.strip_prefix("/v1/users/")?.strip_suffix("/phone")?;
            (is_id(user) && matches!(query[..], [("ad_id", ad)] if is_id(ad))).then_some(Shape::Lookup)
        }
        Upstream::Anonymous => (path == "/v1/anonymous-numbers"
            && matches!(query[..], [("user_id", u), ("ad_id", a)] if is_id(u) && is_id(a)))
        .then_some(Shape::Lookup),
        Upstream::Calltracking if path == "/v1/virtual-numbers" => {
            matches!(query[..], [("user_id", u), ("phone", p)]
                if is_id(u) && p.strip_prefix("%2B").is_some_and(|d| (8..=15).contains(&d.len()) && is_id(d)))
            .then_some(Shape::Lookup)
        }
        Upstream::Calltracking if path == "/v1/statuses" => {
            let (mut after, mut limit) = (None, None);
            for (key, value) in query {
                match key {
                    "after" if after.is_none() => after = Some(value.parse().ok()?),
                    "limit" if limit.is_none() => limit = Some(value.parse().ok()?),
                    _ => return None,
                }
            }
            Some(Shape::Feed(after.unwrap_or(0), limit.filter(|&l| l > 0)?))
        }
        Upstream::Calltracking => None,
    }
}

async fn answer(State(fake): State<Fake>, request: Request) -> Response {
    let uri = request.uri().to_string();
    let shape = shape(
        fake.upstream,
        request.method(),
        request.uri().path(),
        request.uri().query().unwrap_or(""),
    );
    let (after, limit) = match shape {
        None => {
            fake.unexpected
                .lock()
                .unwrap()
                .push(format!("{} {uri}", request.method()));
            return (
                StatusCode::BAD_REQUEST,
                "not a request docs/rules.md defines",
            )
                .into_response();
        }
        Some(Shape::Feed(after, limit)) => (after, limit),
        Some(Shape::Lookup) => (usize::MAX, 0),
    };
    if after != usize::MAX {
        fake.feed_uris.lock().unwrap().push(uri);
        let items = fake.feed.lock().unwrap().clone();
        let start = after.min(items.len());
        let end = (start + limit).min(items.len());
        return axum::Json(serde_json::json!({
            "items": &items[start..end],
            "next_cursor": end.to_string(),
        }))
        .into_response();
    }
    fake.calls.fetch_add(1, Ordering::SeqCst);
    fake.uris.lock().unwrap().push(uri);
    if let Some(id) = request.headers().get("x-request-id") {
        fake.request_ids
            .lock()
            .unwrap()
            .push(id.to_str().unwrap().to_owned());
    }
    let trace = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        (
            header("traceparent").unwrap_or_default(),
            header("tracestate"),
        )
    };
    fake.traces.lock().unwrap().push(trace);
    let Behaviour { reply, delay } = fake.behaviour.lock().unwrap().clone();
    tokio::time::sleep(delay).await;
    match reply {
        Reply::Phone(phone) => {
            axum::Json(serde_json::json!({ fake.upstream.field(): phone })).into_response()
        }
        Reply::NotFound => StatusCode::NOT_FOUND.into_response(),
        Reply::Status(code) => StatusCode::from_u16(code).unwrap().into_response(),
        Reply::Garbage => (StatusCode::OK, "<html>oops</html>").into_response(),
        Reply::Body(body) => {
            (StatusCode::OK, [("content-type", "application/json")], body).into_response()
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
    }
}

/// Polls `done` every 10 ms until it holds; panics naming `what` after `limit`.
/// Used instead of sleeping a guessed time: on two busy cores a guess is either
/// too short (flaky) or too long (slow).
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

// ---------------------------------------------------------------------------
// The privacy scanner (docs/README.md#privacy).

/// Characters a number may be written with between its digits.
fn is_separator(c: char) -> bool {
    matches!(c, ' ' | '-' | '(' | ')' | '.' | '/')
}

/// `%XX` escapes decoded (lossy); other text kept as is.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        let escape = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| Some(hex(bytes[i + 1])? * 16 + hex(bytes[i + 2])?))
            .flatten();
        match escape {
            Some(byte) => {
                out.push(byte as u8);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The full phone numbers in one log line:
/// - `+` then 8 or more digits, separators (space, `-`, `()`, `.`, `/`) allowed;
/// - a fixture number's digits (`crate::NUMBERS`), with or without `+`;
/// - a mask that shows more than the last two digits (`+*******4567`,
///   `7916*****67`);
///
/// each in the line as written and percent-decoded (`%2B7916...`).
pub fn leaks_in(line: &str) -> Vec<String> {
    let decoded = percent_decoded(line);
    let mut found = Vec::new();
    for text in [line, decoded.as_str()] {
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !(c.is_ascii_digit() || c == '*' || c == '+') {
                i += 1;
                continue;
            }
            // A run: an optional `+`, then digits and `*`, separators between them.
            let mut run = String::new();
            if c == '+' {
                run.push('+');
                i += 1;
            }
            loop {
                if i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '*') {
                    run.push(chars[i]);
                    i += 1;
                    continue;
                }
                let mut j = i;
                while j < chars.len() && is_separator(chars[j]) {
                    j += 1;
                }
                let continues = j > i
                    && j < chars.len()
                    && (chars[j].is_ascii_digit() || chars[j] == '*')
                    && run.len() > usize::from(run.starts_with('+'));
                if !continues {
                    break;
                }
                i = j;
            }
            let digits: String = run.chars().filter(char::is_ascii_digit).collect();
            let masked = run.contains('*');
            let leak = if masked {
                digits.len() > 2
            } else {
                (run.starts_with('+') && digits.len() >= 8)
                    || crate::NUMBERS
                        .iter()
                        .any(|n| digits.contains(n.trim_start_matches('+')))
            };
            if leak && !found.contains(&run) {
                found.push(run);
            }
        }
    }
    found
}

/// Every full number found so far, with where it was written.
static LEAKS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Everything the test binary logged (text format), for tests that look at it.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// Lines logged in each format, to prove both are on.
pub static TEXT_LINES: AtomicUsize = AtomicUsize::new(0);
pub static JSON_LINES: AtomicUsize = AtomicUsize::new(0);

/// Scans `text` line by line and records any leak, naming `source`.
pub fn scan(source: &str, text: &str) {
    for line in text.lines() {
        let leaks = leaks_in(line);
        if !leaks.is_empty() {
            LEAKS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(format!("{source}: {leaks:?} in {line:?}"));
        }
    }
}

/// Fails the calling test if any log line written so far, by any test, held a
/// full number. Leaks are never cleared: the test that caused one fails, and so
/// does every later check, which is what a leak deserves.
#[track_caller]
pub fn assert_no_leaks() {
    let leaks = LEAKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert!(
        leaks.is_empty(),
        "full phone numbers in the logs: {leaks:#?}"
    );
}

/// Everything the app logged in this test binary so far, text format.
pub fn captured_logs() -> String {
    String::from_utf8_lossy(
        &LOGS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned()
}

/// One event's output, scanned when the formatter is done with it (a fmt layer
/// writes each event through its own writer).
struct ScanningWriter {
    json: bool,
    buffer: Vec<u8>,
}

impl std::io::Write for ScanningWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ScanningWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buffer);
        let thread = std::thread::current();
        let source = format!(
            "{} log of thread {}",
            if self.json { "json" } else { "text" },
            thread.name().unwrap_or("?")
        );
        scan(&source, &text);
        if self.json {
            JSON_LINES.fetch_add(1, Ordering::Relaxed);
        } else {
            TEXT_LINES.fetch_add(1, Ordering::Relaxed);
            LOGS.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(&self.buffer);
        }
    }
}

/// Both production formats, the crate at trace level, every line scanned.
fn init_logs() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let text = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(|| ScanningWriter {
                json: false,
                buffer: Vec::new(),
            });
        // As `telemetry::init_logs` configures JSON for production.
        let json = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(|| ScanningWriter {
                json: true,
                buffer: Vec::new(),
            });
        let _ = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(
                "phones_gateway=trace,info",
            ))
            .with(text)
            .with(json)
            .try_init();
    });
}

/// A running app and its fake upstreams.
pub struct TestApp {
    pub public: String,
    pub admin: String,
    pub real: Fake,
    pub anonymous: Fake,
    pub calltracking: Fake,
    pub http: reqwest::Client,
    /// The app's status service (leadership, direct checks).
    pub status: phones_gateway::status::StatusService,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Drop for TestApp {
    /// Every request the app made had a shape docs/rules.md defines, and no log line
    /// written so far, by this test or any other, held a full number.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        for fake in [&self.real, &self.anonymous, &self.calltracking] {
            let unexpected = fake.unexpected();
            assert!(
                unexpected.is_empty(),
                "{:?} upstream got requests docs/rules.md does not define: {unexpected:?}",
                fake.upstream
            );
        }
        assert_no_leaks();
    }
}

/// An HTTP answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub retry_after: Option<String>,
    pub body: Value,
    pub text: String,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with("").await
    }

    /// Starts the app with `overlay` (TOML) over the test defaults, on a fresh
    /// SQLite file.
    pub async fn spawn_with(overlay: &str) -> TestApp {
        Self::spawn_on(None, overlay).await
    }

    /// Starts the app on the database at `url` (a fresh SQLite file when `None`)
    /// and waits until it is ready.
    pub async fn spawn_on(url: Option<&str>, overlay: &str) -> TestApp {
        let app = Self::start_on(url, overlay).await;
        app.wait_ready().await;
        app
    }

    /// Starts the app without waiting for readiness.
    pub async fn start_on(url: Option<&str>, overlay: &str) -> TestApp {
        init_logs();
        let real = Fake::start(Upstream::RealPhone).await;
        let anonymous = Fake::start(Upstream::Anonymous).await;
        let calltracking = Fake::start(Upstream::Calltracking).await;
        let dir = tempfile::tempdir().unwrap();
        let base = format!(
            r#"
            [database]
            url = "{}"
            [server]
            public_addr = "127.0.0.1:0"
            admin_addr = "127.0.0.1:0"
            # Cold admission off: two busy cores running tests in parallel can
            # keep a test's runtime saturated for a moment; the test of it
            # turns it on (abuse.rs).
            max_queue_delay_ms = 0
            [admin]
            token = "{TOKEN}"
            [upstreams.real_phone]
            base_url = "{}"
            [upstreams.anonymous]
            base_url = "{}"
            [upstreams.calltracking]
            base_url = "{}"
            "#,
            url.map_or_else(
                || format!("sqlite://{}/gateway.db", dir.path().display()),
                str::to_owned
            ),
            real.url,
            anonymous.url,
            calltracking.url
        );
        let figment = figment::Figment::from(figment::providers::Toml::string(
            phones_gateway::config::DEFAULT_TOML,
        ))
        .merge(figment::providers::Toml::string(&base))
        .merge(figment::providers::Toml::string(overlay));
        let config = Config::from_figment(figment).expect("test config is valid");
        Self::start_config(config, real, anonymous, calltracking, dir).await
    }

    async fn start_config(
        config: Config,
        real: Fake,
        anonymous: Fake,
        calltracking: Fake,
        dir: tempfile::TempDir,
    ) -> TestApp {
        let app = App::build(config).await.expect("app builds");
        let public = format!("http://{}", app.public_addr());
        let admin = format!("http://{}", app.admin_addr());
        let status = app.status().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(app.run(async move {
            let _ = stopped.await;
        }));
        TestApp {
            public,
            admin,
            real,
            anonymous,
            calltracking,
            http: reqwest::Client::new(),
            status,
            stop: Some(stop),
            running: Some(running),
            _dir: dir,
        }
    }

    /// Waits (up to 5 s) until `/readyz` answers 200: the status set is loaded.
    pub async fn wait_ready(&self) {
        for _ in 0..500 {
            if self.get_admin("/readyz").await.status == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("app never became ready");
    }

    /// Sends the shutdown signal (as SIGTERM does) and returns the running app's
    /// handle, which completes once it has drained.
    pub fn shutdown(&mut self) -> tokio::task::JoinHandle<anyhow::Result<()>> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.running.take().expect("shut down once")
    }

    /// Waits up to `limit` for the app to stop by itself (a start-up mistake
    /// no retry mends); what `App::run` returned.
    pub async fn stopped_by_itself(&mut self, limit: Duration) -> anyhow::Result<()> {
        let running = self.running.take().expect("still running");
        tokio::time::timeout(limit, running)
            .await
            .expect("the app stops by itself")
            .expect("the app's task does not panic")
    }

    pub async fn phone(&self, user: u64, ad: u64, category: u64) -> Answer {
        self.get_public(&format!(
            "/v1/public-phone?user_id={user}&ad_id={ad}&category_id={category}"
        ))
        .await
    }

    pub async fn get_public(&self, path_and_query: &str) -> Answer {
        read(
            self.http
                .get(format!("{}{path_and_query}", self.public))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    pub async fn get_admin(&self, path: &str) -> Answer {
        read(
            self.http
                .get(format!("{}{path}", self.admin))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    pub async fn post_public(&self, path: &str, body: impl Into<reqwest::Body>) -> Answer {
        read(
            self.http
                .post(format!("{}{path}", self.public))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    pub async fn send_admin(&self, method: reqwest::Method, path: &str, body: &Value) -> Answer {
        read(
            self.http
                .request(method, format!("{}{path}", self.admin))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// Delivers status changes through the webhook; panics unless 200.
    pub async fn enable_calltracking(&self, user: u64, version: u64) {
        let body = serde_json::json!({ "items": [{ "user_id": user, "enabled": true, "version": version }] });
        let answer = self
            .send_admin(
                reqwest::Method::POST,
                "/admin/v1/calltracking/statuses",
                &body,
            )
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }

    pub async fn invalidate(&self, users: &[u64]) {
        let body = serde_json::json!({ "user_ids": users });
        let answer = self
            .send_admin(reqwest::Method::POST, "/admin/v1/cache/invalidate", &body)
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
}

pub async fn read(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let content_type = header("content-type").unwrap_or_default();
    let retry_after = header("retry-after");
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        content_type,
        retry_after,
        body,
        text,
    }
}

impl Answer {
    /// Asserts a 200 with this number and kind.
    #[track_caller]
    pub fn assert_number(&self, phone: &str, kind: &str) {
        assert_eq!(self.status, 200, "{self:?}");
        assert_eq!(self.body["phone"], phone, "{self:?}");
        assert_eq!(self.body["kind"], kind, "{self:?}");
    }

    /// Asserts a problem document with this status.
    #[track_caller]
    pub fn assert_problem(&self, status: u16) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.content_type, "application/problem+json", "{self:?}");
        assert_eq!(self.body["status"], status, "{self:?}");
        assert!(self.body["title"].is_string(), "{self:?}");
    }
}
