//! `TestApp`: the real app in-process on 127.0.0.1:0 (both listeners), against
//! three fake upstreams, on a fresh SQLite file unless a database URL is given;
//! the requests tests send it and the answers they read.

use std::time::Duration;

use figment::providers::Format;
use phones_gateway::app::App;
use phones_gateway::config::Config;
use reqwest::Method;
use serde_json::Value;

use super::fakes::{Fake, Upstream};
use super::paths::{INVALIDATE, READYZ, STATUSES, phone_path};
use super::privacy::{assert_no_leaks, init_logs};
use super::raw::{RawAnswer, raw_request};

pub const TOKEN: &str = "test-admin-token-0123456789";

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
    /// The app's upstream clients (their adaptive limits are the app's own;
    /// /metrics shows the process's).
    pub upstreams: std::sync::Arc<phones_gateway::upstream::Upstreams>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    running: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Drop for TestApp {
    /// Every request the app made had a shape docs/rules.md defines, and no
    /// log line written so far held a full number.
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
    pub allow: Option<String>,
    pub body: Value,
    pub text: String,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with("").await
    }

    /// Starts the app with `overlay` (TOML) over the test defaults.
    pub async fn spawn_with(overlay: &str) -> TestApp {
        Self::spawn_on(None, overlay).await
    }

    /// Starts the app on the database at `url` (fresh SQLite when `None`) and
    /// waits until it is ready.
    pub async fn spawn_on(url: Option<&str>, overlay: &str) -> TestApp {
        let app = Self::start_on(url, overlay).await;
        app.wait_ready().await;
        app
    }

    /// Two replicas on the database at `url`, started one after the other.
    pub async fn pair(url: &str, overlay: &str) -> (TestApp, TestApp) {
        let a = TestApp::spawn_on(Some(url), overlay).await;
        (a, TestApp::spawn_on(Some(url), overlay).await)
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
            # turns it on (overload.rs).
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
        let upstreams = app.upstreams().clone();
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
            http: crate::support::client(),
            status,
            upstreams,
            stop: Some(stop),
            running: Some(running),
            _dir: dir,
        }
    }

    /// Waits (up to 5 s) until `/readyz` answers 200: the status set is loaded.
    pub async fn wait_ready(&self) {
        for _ in 0..500 {
            if self.get_admin(READYZ).await.status == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("app never became ready");
    }

    /// Sends the shutdown signal (as SIGTERM does); the app's handle
    /// completes once it has drained.
    pub fn shutdown(&mut self) -> tokio::task::JoinHandle<anyhow::Result<()>> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.running.take().expect("shut down once")
    }

    /// Waits up to `limit` for the app to stop by itself; what `App::run`
    /// returned.
    pub async fn stopped_by_itself(&mut self, limit: Duration) -> anyhow::Result<()> {
        let running = self.running.take().expect("still running");
        tokio::time::timeout(limit, running)
            .await
            .expect("the app stops by itself")
            .expect("the app's task does not panic")
    }

    pub async fn phone(&self, user: u64, ad: u64, category: u64) -> Answer {
        self.get_public(&phone_path(user, ad, category)).await
    }

    /// [`TestApp::phone`] in a task of its own.
    pub fn phone_in_background(
        &self,
        user: u64,
        ad: u64,
        category: u64,
    ) -> tokio::task::JoinHandle<Answer> {
        let (http, public) = (self.http.clone(), self.public.clone());
        let path = phone_path(user, ad, category);
        tokio::spawn(async move { get_with(&http, &public, &path, &[]).await })
    }

    /// Asserts a 200 with this number and kind for the seller's number.
    pub async fn assert_phone(&self, user: u64, ad: u64, category: u64, phone: &str, kind: &str) {
        self.phone(user, ad, category)
            .await
            .assert_number(phone, kind);
    }

    pub async fn get_public(&self, path_and_query: &str) -> Answer {
        self.get_public_with(path_and_query, &[]).await
    }

    pub async fn get_public_with(&self, path_and_query: &str, headers: &[(&str, &str)]) -> Answer {
        get_with(&self.http, &self.public, path_and_query, headers).await
    }

    /// A GET on the public listener as `viewer` (`x-viewer-id`), or anonymous.
    pub async fn get_public_as(&self, viewer: Option<&str>, path_and_query: &str) -> Answer {
        let headers: Vec<(&str, &str)> = viewer.map(|v| ("x-viewer-id", v)).into_iter().collect();
        self.get_public_with(path_and_query, &headers).await
    }

    /// The status of a HEAD on the public listener.
    pub async fn head_public(&self, path_and_query: &str) -> u16 {
        let url = format!("{}{path_and_query}", self.public);
        self.http.head(url).send().await.unwrap().status().as_u16()
    }

    /// A GET on the admin listener with the token.
    pub async fn get_admin(&self, path: &str) -> Answer {
        self.admin_request(Method::GET, path, &[("authorization", &bearer())], "")
            .await
    }

    pub async fn get_admin_without_token(&self, path: &str) -> Answer {
        self.admin_request(Method::GET, path, &[], "").await
    }

    pub async fn post_public(&self, path: &str, body: impl Into<reqwest::Body>) -> Answer {
        self.post_public_with(path, &[], body).await
    }

    pub async fn post_public_with(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> Answer {
        let request = self
            .http
            .post(format!("{}{path}", self.public))
            .header("content-type", "application/json")
            .body(body);
        send_with(request, headers).await
    }

    /// A JSON body to an admin route, with the token.
    pub async fn send_admin(&self, method: Method, path: &str, body: &Value) -> Answer {
        self.admin_request(method, path, &json_with_token(), body.to_string())
            .await
    }

    /// An admin request of any method, path, headers and body, sent as given
    /// (no token unless `headers` carries one: see `bearer()`).
    pub async fn admin_request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> Answer {
        let request = self
            .http
            .request(method, format!("{}{path}", self.admin))
            .body(body);
        send_with(request, headers).await
    }

    /// An admin request on a bare socket, so any method and path bytes go out
    /// as given: the token only when `token` is given, an empty JSON body;
    /// the answer with all its headers.
    pub async fn raw_admin_request(
        &self,
        method: &Method,
        path: &str,
        token: Option<&str>,
    ) -> RawAnswer {
        let auth = token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"));
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        raw_request(&self.admin, request.as_bytes()).await
    }

    /// Asserts each fake's calls so far: real phone, anonymous, call tracking.
    #[track_caller]
    pub fn assert_calls(&self, real: usize, anonymous: usize, calltracking: usize) {
        assert_eq!(
            (
                self.real.calls(),
                self.anonymous.calls(),
                self.calltracking.calls()
            ),
            (real, anonymous, calltracking),
            "calls to the (real, anonymous, calltracking) upstreams"
        );
    }

    /// Sends one status change to the webhook; the answer.
    pub async fn send_status(&self, user: u64, enabled: bool, version: u64) -> Answer {
        let body = serde_json::json!({ "items": [{ "user_id": user, "enabled": enabled, "version": version }] });
        self.send_admin(Method::POST, STATUSES, &body).await
    }

    /// Sends one status change to the webhook; its status code.
    pub async fn set_status(&self, user: u64, enabled: bool, version: u64) -> u16 {
        self.send_status(user, enabled, version).await.status
    }

    /// Waits until this replica holds `user` at `version` in memory; how long
    /// that took. Fails after `limit`.
    pub async fn converged(&self, user: u64, version: u64, limit: Duration) -> Duration {
        let start = std::time::Instant::now();
        let user_id = phones_gateway::domain::UserId::new(user).unwrap();
        while self.status.set().get(user_id).version != version {
            assert!(
                start.elapsed() < limit,
                "user {user} did not reach version {version} within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        start.elapsed()
    }

    /// A status snapshot of `version` listing `ids`.
    pub async fn put_snapshot(&self, version: u64, ids: &[u64]) -> Answer {
        let body = serde_json::json!({ "version": version, "enabled_user_ids": ids });
        self.send_admin(Method::PUT, STATUSES, &body).await
    }

    /// Turns call tracking on for `user` at `version`; panics unless 200.
    pub async fn enable_calltracking(&self, user: u64, version: u64) {
        let answer = self.send_status(user, true, version).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }

    /// Turns call tracking on for every seller of `users`; panics unless 200.
    pub async fn track(&self, users: impl IntoIterator<Item = u64>) {
        for body in super::tracking(users) {
            let answer = self.send_admin(Method::POST, STATUSES, &body).await;
            assert_eq!(answer.status, 200, "{answer:?}");
        }
    }

    pub async fn invalidate(&self, users: &[u64]) {
        let body = serde_json::json!({ "user_ids": users });
        let answer = self.send_admin(Method::POST, INVALIDATE, &body).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
}

/// The `authorization` value carrying the test token.
pub fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// The headers of a JSON body to an admin route, with the token.
pub fn json_with_token() -> [(&'static str, &'static str); 2] {
    static BEARER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    [
        ("authorization", BEARER.get_or_init(bearer)),
        ("content-type", "application/json"),
    ]
}

/// A GET of `path` on `base` (`http://host:port`) with these headers.
pub async fn get_with(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Answer {
    send_with(http.get(format!("{base}{path}")), headers).await
}

/// Sends `request` with these headers added; the answer read whole.
pub async fn send_with(mut request: reqwest::RequestBuilder, headers: &[(&str, &str)]) -> Answer {
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    read(request.send().await.unwrap()).await
}

pub async fn read(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    Answer::new(status, &headers, response.text().await.unwrap())
}

impl Answer {
    pub fn new(status: u16, headers: &reqwest::header::HeaderMap, text: String) -> Answer {
        let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
        Answer {
            status,
            content_type: header("content-type").unwrap_or_default(),
            retry_after: header("retry-after"),
            allow: header("allow"),
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// Asserts a 200 with this number and kind.
    #[track_caller]
    pub fn assert_number(&self, phone: &str, kind: &str) {
        assert_eq!(self.status, 200, "{self:?}");
        assert_eq!(self.body["phone"], phone, "{self:?}");
        assert_eq!(self.body["kind"], kind, "{self:?}");
    }

    /// The problem document's `detail` ("" when there is none).
    pub fn detail(&self) -> &str {
        self.body["detail"].as_str().unwrap_or_default()
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
