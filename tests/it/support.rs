//! Test harness: the real app on 127.0.0.1:0 against three fake upstreams that are
//! real HTTP servers whose answers, delays and call counts the test controls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
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
    /// Accept the request and never answer (held for 60 s, far past any timeout).
    Hang,
}

#[derive(Clone)]
struct Behaviour {
    reply: Reply,
    delay: Duration,
}

/// A fake upstream: a real HTTP server on 127.0.0.1:0.
#[derive(Clone)]
pub struct Fake {
    pub url: String,
    field: &'static str,
    behaviour: Arc<Mutex<Behaviour>>,
    calls: Arc<AtomicUsize>,
    uris: Arc<Mutex<Vec<String>>>,
    request_ids: Arc<Mutex<Vec<String>>>,
}

impl Fake {
    pub async fn start(field: &'static str) -> Fake {
        let fake = Fake {
            url: String::new(),
            field,
            behaviour: Arc::new(Mutex::new(Behaviour {
                reply: Reply::NotFound,
                delay: Duration::ZERO,
            })),
            calls: Arc::new(AtomicUsize::new(0)),
            uris: Arc::new(Mutex::new(Vec::new())),
            request_ids: Arc::new(Mutex::new(Vec::new())),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let router = Router::new().fallback(answer).with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Fake { url, ..fake }
    }

    /// Answer `reply` from now on, at once.
    pub fn reply(&self, reply: Reply) {
        self.reply_after(reply, Duration::ZERO);
    }

    /// Answer `reply` from now on, after `delay`.
    pub fn reply_after(&self, reply: Reply, delay: Duration) {
        *self.behaviour.lock().unwrap() = Behaviour { reply, delay };
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn uris(&self) -> Vec<String> {
        self.uris.lock().unwrap().clone()
    }

    /// The `x-request-id` of every call received.
    pub fn request_ids(&self) -> Vec<String> {
        self.request_ids.lock().unwrap().clone()
    }
}

async fn answer(State(fake): State<Fake>, request: Request) -> Response {
    fake.calls.fetch_add(1, Ordering::SeqCst);
    fake.uris.lock().unwrap().push(request.uri().to_string());
    if let Some(id) = request.headers().get("x-request-id") {
        fake.request_ids
            .lock()
            .unwrap()
            .push(id.to_str().unwrap().to_owned());
    }
    let Behaviour { reply, delay } = fake.behaviour.lock().unwrap().clone();
    tokio::time::sleep(delay).await;
    match reply {
        Reply::Phone(phone) => axum::Json(serde_json::json!({ fake.field: phone })).into_response(),
        Reply::NotFound => StatusCode::NOT_FOUND.into_response(),
        Reply::Status(code) => StatusCode::from_u16(code).unwrap().into_response(),
        Reply::Garbage => (StatusCode::OK, "<html>oops</html>").into_response(),
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
    }
}

/// Every `+` followed by 8 or more digits (separators allowed) in `text`.
pub fn full_numbers(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (start, _) in text.match_indices('+') {
        let digits: String = text[start + 1..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || matches!(c, ' ' | '-' | '(' | ')'))
            .filter(char::is_ascii_digit)
            .collect();
        if digits.len() >= 8 {
            found.push(format!("+{digits}"));
        }
    }
    found
}

/// Everything the app logs, captured once for the whole test binary.
pub fn captured_logs() -> String {
    String::from_utf8_lossy(&LOGS.get_or_init(Default::default).lock().unwrap()).into_owned()
}

static LOGS: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.get_or_init(Default::default)
            .lock()
            .unwrap()
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn init_logs() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("phones_gateway=debug,info")
            .with_ansi(false)
            .with_writer(|| LogWriter)
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
    /// Privacy across the whole suite: whatever traffic ran so far, in any test,
    /// left no full phone number in the logs.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let leaked = full_numbers(&captured_logs());
            assert!(
                leaked.is_empty(),
                "full phone numbers in the logs: {leaked:?}"
            );
        }
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
        let real = Fake::start("phone").await;
        let anonymous = Fake::start("phone").await;
        let calltracking = Fake::start("virtual_phone").await;
        let dir = tempfile::tempdir().unwrap();
        let base = format!(
            r#"
            [database]
            url = "{}"
            [server]
            public_addr = "127.0.0.1:0"
            admin_addr = "127.0.0.1:0"
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
