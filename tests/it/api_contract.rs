//! docs/api.md and docs/errors.md: the contract clients and operators see,
//! every refusal a problem document (socketless cases via `oneshot`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use axum::body::Body;
use axum::http::Request;

use crate::support::front::{oneshot, public_front};
use crate::support::paths::{
    BATCH, HEALTHZ, INVALIDATE, METRICS, OPENAPI_ADMIN, OPENAPI_PUBLIC, PUBLIC_PHONE, READYZ,
    REVEALS, STATUSES, ad_reveals_path, phone_path, status_path,
};
use crate::support::{Reply, TOKEN, TestApp, raw_get, raw_head, raw_request};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

#[tokio::test]
async fn without_the_token_every_admin_path_and_method_is_401_and_with_it_404_or_405() {
    let app = TestApp::spawn().await;
    let brew = Method::from_bytes(b"BREW").unwrap();
    let status_42 = status_path(42);
    let undecodable = status_path("%FF");
    // (method, path, the answer with the token)
    let table: [(&Method, &str, u16); 20] = [
        (&Method::DELETE, INVALIDATE, 405),
        (&Method::GET, INVALIDATE, 405),
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
        (&Method::GET, &format!("{REVEALS}?user_id=42"), 200),
        (&Method::POST, REVEALS, 405),
        (&Method::GET, &ad_reveals_path(42), 200),
        (&Method::GET, &ad_reveals_path("%FF"), 400),
        // The API descriptions are admin routes.
        (&Method::GET, OPENAPI_ADMIN, 200),
        (&Method::GET, OPENAPI_PUBLIC, 404),
        (&Method::GET, "/administrator", 404),
        (&Method::GET, "/", 404),
    ];
    for (method, path, with_token) in table {
        for token in [None, Some("nope"), Some(&TOKEN[..TOKEN.len() - 1])] {
            let got = app.raw_admin_request(method, path, token).await;
            got.assert_problem(401);
            assert_eq!(
                got.headers.get("www-authenticate").map(String::as_str),
                Some("Bearer"),
                "{method} {path}: {got:?}"
            );
        }
        let got = app.raw_admin_request(method, path, Some(TOKEN)).await;
        if with_token == 200 {
            assert_eq!(got.status, 200, "{method} {path}: {got:?}");
        } else {
            got.assert_problem(with_token);
        }
    }
    for path in [HEALTHZ, READYZ, METRICS] {
        let got = raw_request(&app.admin, &raw_get(path, "")).await;
        assert_eq!(got.status, 200, "{path}: {got:?}");
    }
    let got = raw_request(&app.public, &raw_get(OPENAPI_PUBLIC, "")).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert!(got.body.contains(PUBLIC_PHONE), "{got:?}");
}

#[tokio::test]
async fn an_undecodable_path_parameter_is_a_400_problem_naming_it() {
    let app = TestApp::spawn().await;
    let auth = format!("authorization: Bearer {TOKEN}\r\n");
    let got = raw_request(&app.admin, &raw_get(&status_path("%FF"), &auth)).await;
    let problem = got.assert_problem(400);
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .starts_with("user_id"),
        "{problem}"
    );
    // The public listener has no path parameters: an undecodable path is a 404.
    raw_request(&app.public, &raw_get("/v1/public-phone/%FF", ""))
        .await
        .assert_problem(404);
    raw_request(&app.public, &raw_get("/%FF%FE", ""))
        .await
        .assert_problem(404);
}

#[tokio::test]
async fn heads_over_hyper_s_bound_are_431_problems_on_both_listeners() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    let query = phone_path(1, 1, PLAIN_CATEGORY);
    // On the admin listener an open route, as the token comes first.
    for (base, target) in [(&app.public, query.as_str()), (&app.admin, "/healthz?x=1")] {
        // Hyper refuses these before the service.
        let long = format!("{target}&pad={}", "a".repeat(64 * 1024));
        let problem = raw_request(base, &raw_get(&long, ""))
            .await
            .assert_problem(431);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("16384"),
            "{problem}"
        );
        let huge = format!("x-huge: {}\r\n", "a".repeat(200 * 1024));
        raw_request(base, &raw_get(target, &huge))
            .await
            .assert_problem(431);
        // Between the limit and hyper's bound: the front's 431.
        let over = format!("x-big: {}\r\n", "a".repeat(20 * 1024));
        let front = raw_request(base, &raw_get(target, &over))
            .await
            .assert_problem(431);
        assert_eq!(front["detail"], problem["detail"]);
    }
    // The connection-level rewrite leaves ordinary answers alone.
    let got = raw_request(&app.public, &raw_get(&query, "")).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&got.body).unwrap()["phone"],
        REAL
    );
}

#[tokio::test]
async fn a_target_over_hyper_s_uri_bound_is_a_414_problem() {
    // A head limit above hyper's target bound.
    let app = TestApp::spawn_with("[server]\nmax_header_bytes = 200000").await;
    let long = format!("/healthz?pad={}", "a".repeat(70_000));
    raw_request(&app.admin, &raw_get(&long, ""))
        .await
        .assert_problem(414);
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
            let got = raw_request(base, request).await;
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
    let foo = |path: &str, extra: &str| raw_head("FOO", path, extra);
    let got = raw_request(&app.public, &foo(PUBLIC_PHONE, "")).await;
    got.assert_problem(405);
    assert_eq!(
        got.headers.get("allow").map(String::as_str),
        Some("GET,HEAD")
    );
    raw_request(&app.public, &foo(BATCH, ""))
        .await
        .assert_problem(405);
    raw_request(&app.admin, &foo(HEALTHZ, ""))
        .await
        .assert_problem(405);
    let auth = format!("authorization: Bearer {TOKEN}\r\n");
    let got = raw_request(&app.admin, &foo(STATUSES, &auth)).await;
    got.assert_problem(405);
    assert!(got.headers.contains_key("allow"), "{got:?}");
    raw_request(&app.public, &foo("/nope", ""))
        .await
        .assert_problem(404);
}

/// The answer to `HEAD path`, its headers but `date` and `x-request-id`.
async fn head(app: &TestApp, path: &str) -> (u16, HashMap<String, String>) {
    let mut got = raw_request(&app.public, &raw_head("HEAD", path, "")).await;
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
    // Numbers of one length whose GET bodies differ in length by kind.
    let mut answers = Vec::new();
    for (user, category, phone, kind) in [
        (70, ANON_CATEGORY, ANON, "anonymous"),
        (71, PLAIN_CATEGORY, VIRTUAL, "calltracking"),
        (72, PLAIN_CATEGORY, REAL, "real"),
    ] {
        let path = phone_path(user, 1, category);
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

    app.real.reply(Reply::NotFound);
    for path in [
        phone_path(73, 1, PLAIN_CATEGORY),
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

/// Each JSON route: listener, method, path and a body it accepts.
fn json_routes(app: &TestApp) -> [(String, Method, &'static str, String); 4] {
    [
        (
            app.public.clone(),
            Method::POST,
            BATCH,
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
            INVALIDATE,
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
    let got = app.get_admin(&status_path(42)).await;
    assert_eq!(got.body["version"], 0, "{got:?}");
    let public = app.get_public(OPENAPI_PUBLIC).await.body;
    let admin = app.get_admin(OPENAPI_ADMIN).await.body;
    for (document, method, path) in [
        (&public, "post", BATCH),
        (&admin, "post", STATUSES),
        (&admin, "put", STATUSES),
        (&admin, "post", INVALIDATE),
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

#[tokio::test]
async fn admin_routes_need_the_bearer_token() {
    let app = TestApp::spawn().await;
    let routes = [
        (Method::POST, STATUSES.to_string()),
        (Method::PUT, STATUSES.to_string()),
        (Method::GET, status_path(42)),
        (Method::POST, INVALIDATE.to_string()),
    ];
    for (method, path) in routes {
        let prefix = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
        let basic = format!("Basic {TOKEN}");
        for auth in [None, Some("Bearer nope"), Some(&*prefix), Some(&*basic)] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("authorization", a)).into_iter().collect();
            app.admin_request(method.clone(), &path, &headers, "")
                .await
                .assert_problem(401);
        }
    }
    assert_eq!(app.get_admin(&status_path(42)).await.status, 200);
}

#[tokio::test]
async fn no_token_configured_means_every_admin_route_refuses() {
    let app = TestApp::spawn_with("[admin]\ntoken = \"\"").await;
    let path = status_path(42);
    for auth in ["Bearer ", "Bearer", ""] {
        app.admin_request(Method::GET, &path, &[("authorization", auth)], "")
            .await
            .assert_problem(401);
    }
    for path in [HEALTHZ, READYZ] {
        let got = app.admin_request(Method::GET, path, &[], "").await;
        assert_eq!(got.status, 200, "{path}: {got:?}");
    }
}

#[tokio::test]
async fn operations_routes_answer_without_a_token() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.assert_phone(1, 1, PLAIN_CATEGORY, REAL, "real").await;
    let health = app.get_admin_without_token(HEALTHZ).await;
    assert_eq!(health.status, 200);
    let ready = app.get_admin_without_token(READYZ).await;
    assert_eq!(ready.status, 200);
    let metrics = app.get_admin_without_token(METRICS).await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .text
            .contains("phones_gateway_http_request_duration_seconds"),
        "{}",
        metrics.text
    );
    assert!(
        metrics.text.contains("phones_gateway_cache_entries"),
        "{}",
        metrics.text
    );
}

#[tokio::test]
async fn the_openapi_documents_describe_both_listeners() {
    let app = TestApp::spawn().await;
    let public = app.get_public(OPENAPI_PUBLIC).await;
    assert_eq!(public.status, 200);
    assert!(
        public.body["paths"][PUBLIC_PHONE]["get"].is_object(),
        "{}",
        public.text
    );
    assert!(public.body["paths"][BATCH]["post"].is_object());
    let admin = app.get_admin(OPENAPI_ADMIN).await;
    assert_eq!(admin.status, 200);
    let refused = app.get_admin_without_token(OPENAPI_ADMIN).await;
    assert_eq!(refused.status, 401, "{}", refused.text);
    assert!(!refused.text.contains(STATUSES), "{}", refused.text);
    for path in [STATUSES, INVALIDATE, HEALTHZ, READYZ, METRICS] {
        assert!(admin.body["paths"][path].is_object(), "{path} missing");
    }
    assert_eq!(
        admin.body["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

#[tokio::test]
async fn every_bad_query_parameter_is_a_400_naming_it() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    let max = i64::MAX as u64;
    let cases = [
        ("", "user_id"),
        ("ad_id=1&category_id=1", "user_id"),
        ("user_id=1&category_id=1", "ad_id"),
        ("user_id=1&ad_id=1", "category_id"),
        ("user_id=0&ad_id=1&category_id=1", "user_id"),
        ("user_id=-1&ad_id=1&category_id=1", "user_id"),
        ("user_id=abc&ad_id=1&category_id=1", "user_id"),
        ("user_id=1.5&ad_id=1&category_id=1", "user_id"),
        (
            &format!("user_id={}&ad_id=1&category_id=1", max + 1),
            "user_id",
        ),
        ("user_id=1&ad_id=0&category_id=1", "ad_id"),
        (
            "user_id=1&ad_id=99999999999999999999999&category_id=1",
            "ad_id",
        ),
        ("user_id=1&ad_id=1&category_id=0", "category_id"),
        ("user_id=1&ad_id=1&category_id=2147483648", "category_id"),
        ("user_id=1&ad_id=1&category_id=1&phone=", "phone"),
        ("user_id=1&ad_id=1&category_id=1&phone=79161234567", "phone"),
        (
            "user_id=1&ad_id=1&category_id=1&phone=%2B7916abc4567",
            "phone",
        ),
        ("user_id=1&ad_id=1&category_id=1&phone=%2B1234567", "phone"),
        (
            "user_id=1&ad_id=1&category_id=1&phone=%2B0123456789",
            "phone",
        ),
        ("user_id=1&user_id=2&ad_id=1&category_id=1", "user_id"),
        ("user_id=%FF&ad_id=1&category_id=1", "user_id"),
    ];
    for (query, field) in cases {
        let got = app.get_public(&format!("/v1/public-phone?{query}")).await;
        got.assert_problem(400);
        let detail = got.body["detail"].as_str().unwrap_or_default();
        assert!(detail.starts_with(field), "{query}: {detail}");
    }
    // Edges that are valid, and unknown parameters ignored.
    let got = app
        .get_public(&format!(
            "/v1/public-phone?user_id={max}&ad_id={max}&category_id=2147483647&utm=x"
        ))
        .await;
    got.assert_number(REAL, "real");
    assert_eq!(got.body["user_id"], max);
}

/// A header read once, given twice, is a 400 naming it, as a repeated query
/// parameter is; two `traceparent` headers are a new trace, never an error.
#[tokio::test]
async fn every_header_read_singly_is_a_400_naming_it_when_repeated() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    let lookup = phone_path(1, 1, PLAIN_CATEGORY);
    let twice = |name: &'static str, a: &'static str, b: &'static str| [(name, a), (name, b)];
    for (headers, named) in [
        (twice("x-viewer-id", "buyer-1", "buyer-2"), "X-Viewer-Id"),
        (twice("x-viewer-id", "buyer-1", "buyer-1"), "X-Viewer-Id"),
        (twice("x-request-id", "req-1", "req-2"), "x-request-id"),
    ] {
        let got = app.get_public_with(&lookup, &headers).await;
        got.assert_problem(400);
        let detail = got.body["detail"].as_str().unwrap_or_default();
        assert!(detail.starts_with(named), "{headers:?}: {detail}");
        assert!(detail.contains("more than once"), "{headers:?}: {detail}");
        let batch =
            json!({ "items": [{ "user_id": 1, "ad_id": 1, "category_id": PLAIN_CATEGORY }] });
        let got = app
            .post_public_with(BATCH, &headers, batch.to_string())
            .await;
        got.assert_problem(400);
        let detail = got.body["detail"].as_str().unwrap_or_default();
        assert!(detail.starts_with(named), "batch {headers:?}: {detail}");
    }
    app.assert_calls(0, 0, 0);
    // The admin token twice (both right): refused before it is compared.
    let bearer = crate::support::bearer();
    let tokens = [
        ("authorization", bearer.as_str()),
        ("authorization", bearer.as_str()),
    ];
    let got = app
        .admin_request(Method::GET, &status_path(42), &tokens, "")
        .await;
    got.assert_problem(400);
    let detail = got.body["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("Authorization"), "{detail}");
    let once = [("x-viewer-id", "buyer-1"), ("x-request-id", "req-1")];
    app.get_public_with(&lookup, &once)
        .await
        .assert_number(REAL, "real");
    let got = app
        .admin_request(Method::GET, &status_path(42), &tokens[..1], "")
        .await;
    assert_ne!(got.status, 400, "{got:?}");
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let got = app
        .get_public_with(&lookup, &twice("traceparent", parent, parent))
        .await;
    got.assert_number(REAL, "real");
}

#[tokio::test]
async fn bad_batch_bodies_are_400_and_oversized_ones_413() {
    let app = TestApp::spawn_with("[server]\nmax_body_bytes = 20000").await;
    app.real.reply(Reply::Phone(REAL));
    let item = json!({ "user_id": 1, "ad_id": 1, "category_id": 1 });
    let bodies = [
        "".to_string(),
        "{".to_string(),
        "[]".to_string(),
        "null".to_string(),
        json!({}).to_string(),
        json!({ "items": [] }).to_string(),
        json!({ "items": "x" }).to_string(),
        json!({ "items": vec![item.clone(); 101] }).to_string(),
    ];
    for body in bodies {
        let got = app.post_public(BATCH, body.clone()).await;
        got.assert_problem(400);
        assert!(
            !got.body["detail"].as_str().unwrap_or_default().is_empty(),
            "{body}"
        );
    }
    let ok = app
        .post_public(
            BATCH,
            json!({ "items": vec![item.clone(); 100] }).to_string(),
        )
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let results = ok.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 100);
    for result in results {
        assert_eq!(result["phone"], REAL, "{result}");
        assert_eq!(result["kind"], "real", "{result}");
    }
    let huge = format!("{{\"items\": [{}]}}", " ".repeat(30_000));
    app.post_public(BATCH, huge).await.assert_problem(413);
    // Bad items are per-item answers, whatever their shape.
    let odd = json!({ "items": [1, "x", null, [], { "user_id": "1", "ad_id": 1, "category_id": 1 },
        { "user_id": 1.5, "ad_id": 1, "category_id": 1 }, { "user_id": 1, "ad_id": 1, "category_id": 1, "phone": 7 }] });
    let got = app.post_public(BATCH, odd.to_string()).await;
    assert_eq!(got.status, 200, "{got:?}");
    let results = got.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 7, "one result per item: {got:?}");
    for result in results {
        assert_eq!(result["error"]["status"], 400, "{result}");
        assert!(result.get("phone").is_none(), "{result}");
    }
}

#[tokio::test]
async fn bad_admin_bodies_are_400_and_change_nothing() {
    let app = TestApp::spawn_with("[server]\nmax_body_bytes = 20000").await;
    let good = json!({ "user_id": 42, "enabled": true, "version": 1 });
    let webhooks = [
        json!({}),
        json!({ "items": [] }),
        json!({ "items": [good, { "user_id": 0, "enabled": true, "version": 1 }] }),
        json!({ "items": [good, { "user_id": 42, "enabled": true, "version": 0 }] }),
        json!({ "items": [good, { "user_id": 42, "enabled": "yes", "version": 2 }] }),
        json!({ "items": [good, { "user_id": 42, "enabled": true }] }),
        json!({ "items": [good, { "user_id": 42, "enabled": true, "version": -2 }] }),
        json!({ "items": [good, { "user_id": 42, "enabled": true, "version": 9223372036854775808u64 }] }),
    ];
    for body in webhooks {
        app.send_admin(Method::POST, STATUSES, &body)
            .await
            .assert_problem(400);
    }
    let too_many = json!({ "items": vec![good.clone(); 10_001] });
    let got = app.send_admin(Method::POST, STATUSES, &too_many).await;
    got.assert_problem(413); // over max_body_bytes here; 400 when the limit allows it
    let got = app.get_admin(&status_path(42)).await;
    assert_eq!(got.body["version"], 0, "nothing was applied: {got:?}");

    for body in [
        json!({}),
        json!({ "version": 0, "enabled_user_ids": [] }),
        json!({ "version": 1, "enabled_user_ids": [0] }),
        json!({ "version": 1 }),
    ] {
        app.send_admin(Method::PUT, STATUSES, &body)
            .await
            .assert_problem(400);
    }
    for path in [status_path(0), status_path("abc"), status_path("-4")] {
        app.get_admin(&path).await.assert_problem(400);
    }
    for body in [
        json!({}),
        json!({ "user_ids": [] }),
        json!({ "user_ids": [0] }),
        json!({ "user_ids": "1" }),
    ] {
        app.send_admin(Method::POST, INVALIDATE, &body)
            .await
            .assert_problem(400);
    }
}

/// A body limit large enough that only the item count can refuse.
#[tokio::test]
async fn ten_thousand_items_pass_and_one_more_is_a_400() {
    let app = TestApp::spawn_with("[server]\nmax_body_bytes = 2097152").await;
    let items = |n: u64| json!({ "items": (1..=n).map(|user| json!({ "user_id": user, "enabled": true, "version": 1 })).collect::<Vec<_>>() });
    let got = app.send_admin(Method::POST, STATUSES, &items(10_001)).await;
    got.assert_problem(400);
    assert!(got.detail().contains("items"), "{got:?}");
    assert_eq!(
        app.get_admin(&status_path(1)).await.body["version"],
        0,
        "nothing was applied"
    );
    let got = app.send_admin(Method::POST, STATUSES, &items(10_000)).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.body["applied"], 10_000);

    let ids = |n: u64| json!({ "user_ids": (1..=n).collect::<Vec<_>>() });
    let got = app.send_admin(Method::POST, INVALIDATE, &ids(10_001)).await;
    got.assert_problem(400);
    assert!(got.detail().contains("user_ids"), "{got:?}");
    let got = app.send_admin(Method::POST, INVALIDATE, &ids(10_000)).await;
    assert_eq!(got.status, 200, "{got:?}");
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problem_documents() {
    let app = TestApp::spawn().await;
    app.get_public("/nope").await.assert_problem(404);
    app.post_public(PUBLIC_PHONE, "").await.assert_problem(405);
    let got = app.get_public(BATCH).await;
    got.assert_problem(405);
    app.get_admin("/admin/nope").await.assert_problem(404);
    app.send_admin(Method::DELETE, STATUSES, &json!({}))
        .await
        .assert_problem(405);
}

/// A largest body of tiny items is refused quickly: items past the hundredth
/// are counted while parsing, never built (src/http/extract.rs).
#[tokio::test]
async fn a_megabyte_of_zero_items_is_a_quick_400_with_the_count() {
    let app = TestApp::spawn().await;
    let mut body = String::from("{\"items\":[0");
    // Up to exactly server.max_body_bytes (1 MiB), `]}` included.
    while body.len() + ",0]}".len() <= 1 << 20 {
        body.push_str(",0");
    }
    body.push_str("]}");
    let count = body.matches('0').count();
    let start = std::time::Instant::now();
    let got = app.post_public(BATCH, body).await;
    let took = start.elapsed();
    got.assert_problem(400);
    assert_eq!(
        got.body["detail"],
        format!("items: must hold 1 to 100 items, got {count}"),
        "{got:?}"
    );
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
    let item = json!({ "user_id": 1, "ad_id": 1, "category_id": 1 });
    let got = app
        .post_public(BATCH, json!({ "items": vec![item; 101] }).to_string())
        .await;
    assert_eq!(
        got.body["detail"], "items: must hold 1 to 100 items, got 101",
        "{got:?}"
    );
}

const LIMITS: &str =
    "[server]\nmax_header_bytes = 4096\nheader_read_timeout_ms = 300\nbody_read_timeout_ms = 300";

#[tokio::test]
async fn oversized_headers_are_refused_with_431() {
    let app = TestApp::spawn_with(LIMITS).await;
    app.real.reply(Reply::Phone(REAL));
    let path = phone_path(1, 1, PLAIN_CATEGORY);
    let big = "a".repeat(5000);
    app.get_public_with(&path, &[("x-big", &big)])
        .await
        .assert_problem(431);
    // Far over the limit, hyper refuses before the router sees it.
    let huge = "a".repeat(100_000);
    let got = app.get_public_with(&path, &[("x-huge", &huge)]).await;
    assert_eq!(got.status, 431, "{got:?}");
    app.get_public(&path).await.assert_number(REAL, "real");
}

fn host_port(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// Writes `bytes` and reads to the close, at most 3 s: closed, text, time taken.
async fn slow_client(base: &str, bytes: &[u8]) -> (bool, String, Duration) {
    let mut stream = TcpStream::connect(host_port(base)).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let start = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    (read.is_ok(), text, start.elapsed())
}

#[tokio::test]
async fn a_body_sent_too_slowly_gets_408() {
    let app = TestApp::spawn_with(LIMITS).await;
    let head = b"POST /v1/public-phones/batch HTTP/1.1\r\nhost: x\r\n\
                 content-type: application/json\r\ncontent-length: 60\r\n\r\n{\"items\": [";
    let (_, text, took) = slow_client(&app.public, head).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert!(took < Duration::from_secs(2));
}

#[tokio::test]
async fn a_request_head_sent_too_slowly_closes_the_connection() {
    let app = TestApp::spawn_with(LIMITS).await;
    let head = b"GET /v1/public-phone?user_id=1 HTTP/1.1\r\nhost: x\r\n";
    let (closed, _, took) = slow_client(&app.public, head).await;
    assert!(closed, "the server kept a slow client's connection open");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let (closed, _, _) = slow_client(&app.admin, b"GET /healthz HTTP/1.1\r\n").await;
    assert!(closed);
}

#[tokio::test]
async fn a_connection_in_service_is_kept_and_an_idle_one_is_closed() {
    // The answer takes longer than the head deadline.
    let app = TestApp::spawn_with(
        "[server]\nheader_read_timeout_ms = 200\nrequest_deadline_ms = 3000\n\
         [upstreams.real_phone]\ntimeout_ms = 2000",
    )
    .await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(700));
    let mut stream = TcpStream::connect(host_port(&app.public)).await.unwrap();
    let head = format!(
        "GET /v1/public-phone?user_id=1&ad_id=1&category_id={PLAIN_CATEGORY} HTTP/1.1\r\nhost: x\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.ends_with(b"}") {
        let n = tokio::time::timeout(Duration::from_secs(3), stream.read(&mut chunk))
            .await
            .expect("no answer")
            .unwrap();
        assert!(n > 0, "closed while the request was in service: {answer:?}");
        answer.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // Idle after its answer: closed within one to two periods, not held 10 s.
    let idle = Instant::now();
    let read =
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut Vec::new())).await;
    assert!(read.is_ok(), "an idle keep-alive connection was kept");
    assert!(
        idle.elapsed() < Duration::from_secs(4),
        "{:?}",
        idle.elapsed()
    );
    assert!(
        idle.elapsed() >= Duration::from_millis(190),
        "{:?}",
        idle.elapsed()
    );
}

/// docs/api.md: a batch item's problem is the single route's, 404 included.
#[tokio::test]
async fn a_batch_items_problem_is_the_single_routes_a_404_included() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::NotFound);
    app.anonymous.reply(Reply::Status(500));
    let items = [
        (1, 11, PLAIN_CATEGORY, None),      // no phone: 404
        (2, 12, ANON_CATEGORY, None),       // anonymous fails closed: 503
        (3, 13, PLAIN_CATEGORY, Some("7")), // bad phone: 400
    ];
    let body = json!({ "items": items.iter().map(|&(user, ad, category, phone)| {
        let mut item = json!({ "user_id": user, "ad_id": ad, "category_id": category });
        if let Some(phone) = phone {
            item["phone"] = json!(phone);
        }
        item
    }).collect::<Vec<_>>() });
    let batch = app.post_public(BATCH, body.to_string()).await;
    assert_eq!(batch.status, 200, "{batch:?}");
    let results = batch.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (result, &(user, ad, category, phone)) in results.iter().zip(&items) {
        let mut query = phone_path(user, ad, category);
        if let Some(phone) = phone {
            query.push_str(&format!("&phone={phone}"));
        }
        let single = app.get_public(&query).await;
        assert_eq!(result["ad_id"], ad, "{result}");
        assert_eq!(
            result["error"], single.body,
            "{query}: batch {result} vs single {single:?}"
        );
    }
    assert_eq!(results[0]["error"]["status"], 404);
    assert_eq!(results[1]["error"]["status"], 503);
    assert_eq!(results[2]["error"]["status"], 400);
}

#[tokio::test]
async fn batch_answers_each_item_in_order_with_mixed_results() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Status(500));
    let body = serde_json::json!({ "items": [
        { "user_id": 1, "ad_id": 11, "category_id": 1 },
        { "user_id": 0, "ad_id": 12, "category_id": 1 },
        { "user_id": 2, "ad_id": 13, "category_id": 9 },
        { "user_id": 3, "ad_id": 14, "category_id": 1, "phone": "+44 20 7946 0958" },
        { "user_id": 4, "ad_id": 15, "category_id": 1, "phone": "12345" },
        { "user_id": 5, "category_id": 1 },
    ]});
    let got = app.post_public(BATCH, body.to_string()).await;
    assert_eq!(got.status, 200, "{got:?}");
    let results = got.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    assert_eq!(results[0]["phone"], REAL);
    assert_eq!(results[0]["kind"], "real");
    assert_eq!(results[0]["ad_id"], 11);
    assert_eq!(results[1]["ad_id"], 12);
    assert_eq!(results[1]["error"]["status"], 400);
    assert!(
        results[1]["error"]["detail"]
            .as_str()
            .unwrap()
            .contains("user_id")
    );
    assert_eq!(results[2]["ad_id"], 13);
    assert_eq!(results[2]["error"]["status"], 503);
    assert_eq!(results[3]["phone"], crate::FOREIGN);
    assert_eq!(results[4]["error"]["status"], 400);
    assert!(
        results[4]["error"]["detail"]
            .as_str()
            .unwrap()
            .contains("phone")
    );
    assert_eq!(results[5]["ad_id"], serde_json::Value::Null);
    assert_eq!(results[5]["error"]["status"], 400);
}

/// One way in: the front answers the lookup (every method) before the public
/// router, so nothing on the router alone reaches code production skips.
#[tokio::test]
async fn the_public_router_alone_does_not_answer_the_lookup() {
    use tower::ServiceExt;
    let config = phones_gateway::config::Config::from_toml("").unwrap();
    let parts = phones_gateway::app::Parts::build(&config);
    let state = phones_gateway::http::api::state::PublicState {
        resolver: parts.resolver,
        budgets: None,
        reveals: None,
        server: config.server,
    };
    let router = phones_gateway::http::api::public_router(state);
    let request = Request::get(PUBLIC_PHONE).body(Body::empty()).unwrap();
    let response = router.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn on_the_front_an_unknown_route_is_a_404_problem() {
    let front = public_front();
    for path in ["/nope", "/v1/public-phone/42", INVALIDATE] {
        let request = Request::get(path).body(Body::empty()).unwrap();
        oneshot(&front, request).await.assert_problem(404);
    }
}

#[tokio::test]
async fn on_the_front_a_wrong_method_is_a_405_problem_naming_the_allowed_ones() {
    let front = public_front();
    let request = Request::delete("/v1/public-phone?user_id=1&ad_id=1&category_id=1")
        .body(Body::empty())
        .unwrap();
    let got = oneshot(&front, request).await;
    got.assert_problem(405);
    assert_eq!(got.allow.as_deref(), Some("GET,HEAD"), "{got:?}");
    let request = Request::get(BATCH).body(Body::empty()).unwrap();
    oneshot(&front, request).await.assert_problem(405);
}

#[tokio::test]
async fn on_the_front_a_batch_that_is_not_json_is_a_415_problem() {
    let front = public_front();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut request = Request::post(BATCH);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let request = request.body(Body::from(r#"{"items":[]}"#)).unwrap();
        oneshot(&front, request).await.assert_problem(415);
    }
}

#[tokio::test]
async fn on_the_front_a_bad_parameter_is_a_400_problem_naming_it() {
    let front = public_front();
    for (query, field) in [
        ("ad_id=1&category_id=1", "user_id"),
        ("user_id=abc&ad_id=1&category_id=1", "user_id"),
        ("user_id=1&ad_id=0&category_id=1", "ad_id"),
        ("user_id=1&ad_id=1&category_id=2147483648", "category_id"),
        ("user_id=1&ad_id=1&category_id=1&phone=79161234567", "phone"),
    ] {
        let request = Request::get(format!("/v1/public-phone?{query}"))
            .body(Body::empty())
            .unwrap();
        let got = oneshot(&front, request).await;
        got.assert_problem(400);
        let detail = got.body["detail"].as_str().unwrap_or_default();
        assert!(detail.starts_with(field), "{query}: {detail}");
    }
}
