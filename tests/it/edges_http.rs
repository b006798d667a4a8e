//! Issue 10 items 6-8 over real sockets: the admin token is checked before
//! anything else; every rejection is a problem document, also the ones hyper
//! makes before a route is chosen; JSON routes demand a JSON content type.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Reply, TOKEN, TestApp};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

const STATUSES: &str = "/admin/v1/calltracking/statuses";

/// An answer read off a raw socket.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Raw {
    /// Asserts a whole problem document with this status: the content type, a
    /// `content-length` that matches the body, and `title` and `status` in it.
    #[track_caller]
    fn assert_problem(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.headers.get("content-type").map(String::as_str),
            Some("application/problem+json"),
            "{self:?}"
        );
        assert_eq!(
            self.headers.get("content-length"),
            Some(&self.body.len().to_string()),
            "{self:?}"
        );
        let problem: Value = serde_json::from_str(&self.body).unwrap_or(Value::Null);
        assert_eq!(problem["status"], status, "{self:?}");
        assert!(problem["title"].is_string(), "{self:?}");
        problem
    }
}

/// Writes `request` on a fresh connection and reads the answer until the server
/// closes the connection (requests that parse should say `connection: close`).
async fn raw(base: &str, request: &[u8]) -> Raw {
    let mut stream = TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    // The server may answer and close before it read everything: a write error
    // is not the test's concern, the answer is.
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "no end of answer: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&answer)));
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Raw {
        status,
        headers,
        body: String::from_utf8_lossy(&answer[end + 4..]).into_owned(),
    }
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: x\r\n{extra}connection: close\r\n\r\n").into_bytes()
}

// Item 6: the token first.

async fn admin_request(app: &TestApp, method: &Method, path: &str, token: Option<&str>) -> Raw {
    let auth = token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    raw(&app.admin, request.as_bytes()).await
}

#[tokio::test]
async fn without_the_token_every_admin_path_and_method_is_401_and_with_it_404_or_405() {
    let app = TestApp::spawn().await;
    let brew = Method::from_bytes(b"BREW").unwrap();
    let status_42 = format!("{STATUSES}/42");
    let undecodable = format!("{STATUSES}/%FF");
    // (method, path, the answer with the token)
    let table: [(&Method, &str, u16); 16] = [
        (&Method::DELETE, "/admin/v1/cache/invalidate", 405),
        (&Method::GET, "/admin/v1/cache/invalidate", 405),
        (&Method::GET, STATUSES, 405),
        (&Method::DELETE, STATUSES, 405),
        (&brew, STATUSES, 405),
        (&Method::GET, "/admin/nope", 404),
        (&Method::POST, "/admin/v1/nope/deeper", 404),
        (&Method::GET, "/admin", 404),
        (&Method::GET, "/admin/", 404),
        (&Method::DELETE, &status_42, 405),
        (&Method::GET, &status_42, 200),
        (&Method::GET, &undecodable, 400),
        (&Method::GET, "/admin/v1/reveals?user_id=42", 200),
        (&Method::POST, "/admin/v1/reveals", 405),
        (&Method::GET, "/admin/v1/ads/42/reveals", 200),
        (&Method::GET, "/admin/v1/ads/%FF/reveals", 400),
    ];
    for (method, path, with_token) in table {
        for token in [None, Some("nope"), Some(&TOKEN[..TOKEN.len() - 1])] {
            let got = admin_request(&app, method, path, token).await;
            got.assert_problem(401);
            assert_eq!(
                got.headers.get("www-authenticate").map(String::as_str),
                Some("Bearer"),
                "{method} {path}: {got:?}"
            );
        }
        let got = admin_request(&app, method, path, Some(TOKEN)).await;
        if with_token == 200 {
            assert_eq!(got.status, 200, "{method} {path}: {got:?}");
        } else {
            got.assert_problem(with_token);
        }
    }
    // Operations stay open, and a path that only starts like the admin prefix
    // is an ordinary 404.
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi/admin.json",
        "/openapi/public.json",
    ] {
        let got = raw(&app.admin, &get(path, "")).await;
        assert_eq!(got.status, 200, "{path}: {got:?}");
    }
    raw(&app.admin, &get("/administrator", ""))
        .await
        .assert_problem(404);
}

// Item 7: every rejection a problem document, on both listeners.

#[tokio::test]
async fn an_undecodable_path_parameter_is_a_400_problem_naming_it() {
    let app = TestApp::spawn().await;
    let auth = format!("authorization: Bearer {TOKEN}\r\n");
    let got = raw(&app.admin, &get(&format!("{STATUSES}/%FF"), &auth)).await;
    let problem = got.assert_problem(400);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .starts_with("user_id"),
        "{problem}"
    );
    // The public listener has no path parameters: an undecodable path is a 404.
    raw(&app.public, &get("/v1/public-phone/%FF", ""))
        .await
        .assert_problem(404);
    raw(&app.public, &get("/%FF%FE", ""))
        .await
        .assert_problem(404);
}

#[tokio::test]
async fn heads_over_hyper_s_bound_are_431_problems_on_both_listeners() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    let query = format!("/v1/public-phone?user_id=1&ad_id=1&category_id={PLAIN_CATEGORY}");
    for base in [&app.public, &app.admin] {
        // A 64 KiB query string, and a 200 KiB header: both over twice the
        // default 16 KiB limit, where hyper refuses before the service.
        let long = format!("{query}&pad={}", "a".repeat(64 * 1024));
        let problem = raw(base, &get(&long, "")).await.assert_problem(431);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("16384"),
            "{problem}"
        );
        let huge = format!("x-huge: {}\r\n", "a".repeat(200 * 1024));
        raw(base, &get(&query, &huge)).await.assert_problem(431);
        // Between the limit and hyper's bound: the front's 431, the same document.
        let over = format!("x-big: {}\r\n", "a".repeat(20 * 1024));
        let front = raw(base, &get(&query, &over)).await.assert_problem(431);
        assert_eq!(front["detail"], problem["detail"]);
    }
    // The connection-level rewrite leaves ordinary answers alone.
    let got = raw(&app.public, &get(&query, "")).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&got.body).unwrap()["phone"],
        REAL
    );
}

#[tokio::test]
async fn a_target_over_hyper_s_uri_bound_is_a_414_problem() {
    // With a head limit above hyper's 65,534-byte bound on the target, hyper's
    // refusal is a 414.
    let app = TestApp::spawn_with("[server]\nmax_header_bytes = 200000").await;
    let long = format!("/healthz?pad={}", "a".repeat(70_000));
    raw(&app.admin, &get(&long, "")).await.assert_problem(414);
}

#[tokio::test]
async fn malformed_heads_are_400_problems_on_both_listeners() {
    let app = TestApp::spawn().await;
    let malformed: [&[u8]; 6] = [
        b"GET / HTTP/1.1 junk\r\nhost: x\r\n\r\n",
        b"GET /\x01 HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        b"GE(T / HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET / HTTP/9.9\r\nhost: x\r\n\r\n",
    ];
    for base in [&app.public, &app.admin] {
        for request in malformed {
            let got = raw(base, request).await;
            assert_eq!(
                got.headers.get("connection").map(String::as_str),
                Some("close"),
                "{got:?}"
            );
            got.assert_problem(400);
        }
    }
}

#[tokio::test]
async fn unknown_methods_are_405_problems_naming_the_allowed_ones() {
    let app = TestApp::spawn().await;
    let foo = |path: &str, extra: &str| {
        format!("FOO {path} HTTP/1.1\r\nhost: x\r\n{extra}connection: close\r\n\r\n").into_bytes()
    };
    let got = raw(&app.public, &foo("/v1/public-phone", "")).await;
    got.assert_problem(405);
    assert_eq!(
        got.headers.get("allow").map(String::as_str),
        Some("GET,HEAD")
    );
    raw(&app.public, &foo("/v1/public-phones/batch", ""))
        .await
        .assert_problem(405);
    raw(&app.admin, &foo("/healthz", ""))
        .await
        .assert_problem(405);
    let auth = format!("authorization: Bearer {TOKEN}\r\n");
    let got = raw(&app.admin, &foo(STATUSES, &auth)).await;
    got.assert_problem(405);
    assert!(got.headers.contains_key("allow"), "{got:?}");
    // On no route at all, the unknown method is a 404 like any other.
    raw(&app.public, &foo("/nope", ""))
        .await
        .assert_problem(404);
}

// Issue 21: HEAD tells nothing a GET's body would.

/// The answer to `HEAD path`, its headers without the two that differ on every
/// answer (`date`, `x-request-id`).
async fn head(app: &TestApp, path: &str) -> (u16, HashMap<String, String>) {
    let request = format!("HEAD {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    let mut got = raw(&app.public, request.as_bytes()).await;
    assert!(got.body.is_empty(), "{got:?}");
    got.headers.remove("date");
    got.headers.remove("x-request-id");
    (got.status, got.headers)
}

#[tokio::test]
async fn head_answers_get_s_status_and_no_header_varies_with_the_kind() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.enable_calltracking(71, 1).await;
    // Numbers of one length, kinds of three (the GET bodies are 67, 70 and 62
    // bytes long).
    let mut answers = Vec::new();
    for (user, category, phone, kind) in [
        (70, ANON_CATEGORY, ANON, "anonymous"),
        (71, PLAIN_CATEGORY, VIRTUAL, "calltracking"),
        (72, PLAIN_CATEGORY, REAL, "real"),
    ] {
        let path = format!("/v1/public-phone?user_id={user}&ad_id=1&category_id={category}");
        app.get_public(&path).await.assert_number(phone, kind);
        let (status, headers) = head(&app, &path).await;
        assert_eq!(status, 200, "{kind}: {headers:?}");
        answers.push((kind, headers));
    }
    for (kind, headers) in &answers[1..] {
        assert_eq!(
            headers, &answers[0].1,
            "HEAD of a {kind} number vs. of an {} one",
            answers[0].0
        );
    }
    assert!(!answers[0].1.contains_key("content-length"), "{answers:?}");

    // And the status is GET's on the errors too.
    app.real.reply(Reply::NotFound);
    for path in [
        format!("/v1/public-phone?user_id=73&ad_id=1&category_id={PLAIN_CATEGORY}"),
        "/v1/public-phone?user_id=73&category_id=1".to_owned(),
        "/v1/public-phone?user_id=0&ad_id=1&category_id=1".to_owned(),
    ] {
        let get = app.get_public(&path).await;
        let (status, headers) = head(&app, &path).await;
        assert_eq!(status, get.status, "{path}: {headers:?}");
        assert!(status == 404 || status == 400, "{path}: {status}");
        assert_eq!(
            headers.get("content-type").map(String::as_str),
            Some("application/problem+json"),
            "{path}"
        );
    }
}

// Item 8: JSON routes demand JSON.

/// Each JSON route: listener, method, path and a body it accepts.
fn json_routes(app: &TestApp) -> [(String, Method, &'static str, String); 4] {
    [
        (
            app.public.clone(),
            Method::POST,
            "/v1/public-phones/batch",
            json!({ "items": [{ "user_id": 1, "ad_id": 1, "category_id": PLAIN_CATEGORY }] })
                .to_string(),
        ),
        (
            app.admin.clone(),
            Method::POST,
            STATUSES,
            json!({ "items": [{ "user_id": 42, "enabled": true, "version": 1 }] }).to_string(),
        ),
        (
            app.admin.clone(),
            Method::PUT,
            STATUSES,
            json!({ "version": 2, "enabled_user_ids": [42] }).to_string(),
        ),
        (
            app.admin.clone(),
            Method::POST,
            "/admin/v1/cache/invalidate",
            json!({ "user_ids": [42] }).to_string(),
        ),
    ]
}

async fn send(
    app: &TestApp,
    base: &str,
    method: &Method,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> crate::support::Answer {
    let mut request = app
        .http
        .request(method.clone(), format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .body(body.to_owned());
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    crate::support::read(request.send().await.unwrap()).await
}

#[tokio::test]
async fn json_routes_refuse_other_content_types_with_415() {
    let app =
        TestApp::spawn_with("[server]\nmax_body_bytes = 1000\nmax_snapshot_bytes = 2000").await;
    app.real.reply(Reply::Phone(REAL));
    let refused = [
        None,
        Some("text/plain"),
        Some("text/plain; charset=utf-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("text/json"),
        Some("application/jsonx"),
        Some("application/json-seq"),
        Some("application/+json"),
        Some(""),
    ];
    for (base, method, path, body) in json_routes(&app) {
        for content_type in refused {
            send(&app, &base, &method, path, content_type, &body)
                .await
                .assert_problem(415);
        }
        // Checked before the body is read: an oversized body is still a 415.
        let big = " ".repeat(5000);
        send(&app, &base, &method, path, Some("text/plain"), &big)
            .await
            .assert_problem(415);
    }
    // Nothing of the refused deliveries applied.
    let got = app.get_admin(&format!("{STATUSES}/42")).await;
    assert_eq!(got.body["version"], 0, "{got:?}");
    // And the OpenAPI documents (schemathesis checks the service against them)
    // list the 415.
    let public = app.get_admin("/openapi/public.json").await.body;
    let admin = app.get_admin("/openapi/admin.json").await.body;
    for (document, method, path) in [
        (&public, "post", "/v1/public-phones/batch"),
        (&admin, "post", STATUSES),
        (&admin, "put", STATUSES),
        (&admin, "post", "/admin/v1/cache/invalidate"),
    ] {
        let responses = &document["paths"][path][method]["responses"];
        assert!(responses["415"].is_object(), "{method} {path}: {responses}");
    }
}

#[tokio::test]
async fn json_routes_take_json_with_parameters_and_structured_suffixes() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    let accepted = [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
        "application/merge-patch+json",
        "application/problem+json ; x=y",
    ];
    for (base, method, path, body) in json_routes(&app) {
        for content_type in accepted {
            let got = send(&app, &base, &method, path, Some(content_type), &body).await;
            assert_eq!(
                got.status, 200,
                "{method} {path} as {content_type}: {got:?}"
            );
        }
    }
}
