//! docs/api.md: the admin API, its token, status sync semantics, operations routes.

use reqwest::Method;
use serde_json::json;

use crate::support::{Reply, TOKEN, TestApp, read};
use crate::{PLAIN_CATEGORY, REAL, VIRTUAL};

const STATUSES: &str = "/admin/v1/calltracking/statuses";

#[tokio::test]
async fn admin_routes_need_the_bearer_token() {
    let app = TestApp::spawn().await;
    let routes = [
        (Method::POST, STATUSES.to_string()),
        (Method::PUT, STATUSES.to_string()),
        (Method::GET, format!("{STATUSES}/42")),
        (Method::POST, "/admin/v1/cache/invalidate".to_string()),
    ];
    for (method, path) in routes {
        let url = format!("{}{path}", app.admin);
        let none = read(app.http.request(method.clone(), &url).send().await.unwrap()).await;
        none.assert_problem(401);
        let wrong = read(
            app.http
                .request(method.clone(), &url)
                .bearer_auth("nope")
                .send()
                .await
                .unwrap(),
        )
        .await;
        wrong.assert_problem(401);
        let prefix = read(
            app.http
                .request(method.clone(), &url)
                .bearer_auth(&TOKEN[..TOKEN.len() - 1])
                .send()
                .await
                .unwrap(),
        )
        .await;
        prefix.assert_problem(401);
        let basic = read(
            app.http
                .request(method.clone(), &url)
                .header("authorization", format!("Basic {TOKEN}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        basic.assert_problem(401);
    }
    assert_eq!(app.get_admin(&format!("{STATUSES}/42")).await.status, 200);
}

#[tokio::test]
async fn no_token_configured_means_every_admin_route_refuses() {
    let app = TestApp::spawn_with("[admin]\ntoken = \"\"").await;
    let url = format!("{}{STATUSES}/42", app.admin);
    for auth in ["Bearer ", "Bearer", ""] {
        let got = read(
            app.http
                .get(&url)
                .header("authorization", auth)
                .send()
                .await
                .unwrap(),
        )
        .await;
        got.assert_problem(401);
    }
    // Operations stay open.
    assert_eq!(
        read(
            app.http
                .get(format!("{}/healthz", app.admin))
                .send()
                .await
                .unwrap()
        )
        .await
        .status,
        200
    );
    assert_eq!(
        read(
            app.http
                .get(format!("{}/readyz", app.admin))
                .send()
                .await
                .unwrap()
        )
        .await
        .status,
        200
    );
}

#[tokio::test]
async fn webhook_applies_newer_versions_in_order_and_ignores_the_rest() {
    let app = TestApp::spawn().await;
    let body = json!({ "items": [
        { "user_id": 42, "enabled": true, "version": 17 },
        { "user_id": 42, "enabled": false, "version": 17 },
        { "user_id": 42, "enabled": false, "version": 3 },
        { "user_id": 43, "enabled": true, "version": 1 },
    ]});
    let got = app.send_admin(Method::POST, STATUSES, &body).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.body, json!({ "applied": 2, "ignored": 2 }));
    let got = app.get_admin(&format!("{STATUSES}/42")).await;
    assert_eq!(
        got.body,
        json!({ "user_id": 42, "enabled": true, "version": 17 })
    );
    // A duplicate delivery changes nothing.
    let got = app.send_admin(Method::POST, STATUSES, &body).await;
    assert_eq!(got.body, json!({ "applied": 0, "ignored": 4 }));
    // A newer one does.
    let got = app
        .send_admin(
            Method::POST,
            STATUSES,
            &json!({ "items": [{ "user_id": 42, "enabled": false, "version": 18 }] }),
        )
        .await;
    assert_eq!(got.body, json!({ "applied": 1, "ignored": 0 }));
    let got = app.get_admin(&format!("{STATUSES}/42")).await;
    assert_eq!(
        got.body,
        json!({ "user_id": 42, "enabled": false, "version": 18 })
    );
    let got = app.get_admin(&format!("{STATUSES}/44")).await;
    assert_eq!(
        got.body,
        json!({ "user_id": 44, "enabled": false, "version": 0 })
    );
}

#[tokio::test]
async fn the_status_set_decides_calltracking() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.phone(42, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.enable_calltracking(42, 1).await;
    app.phone(42, 2, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    let off = json!({ "items": [{ "user_id": 42, "enabled": false, "version": 2 }] });
    assert_eq!(
        app.send_admin(Method::POST, STATUSES, &off).await.status,
        200
    );
    app.phone(42, 3, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
}

#[tokio::test]
async fn snapshot_enables_exactly_the_listed_users_except_newer_entries() {
    let app = TestApp::spawn().await;
    let deltas = json!({ "items": [
        { "user_id": 1, "enabled": true, "version": 5 },
        { "user_id": 2, "enabled": true, "version": 50 },
        { "user_id": 3, "enabled": false, "version": 50 },
    ]});
    app.send_admin(Method::POST, STATUSES, &deltas).await;
    let got = app
        .send_admin(
            Method::PUT,
            STATUSES,
            &json!({ "version": 10, "enabled_user_ids": [3, 4, 4] }),
        )
        .await;
    assert_eq!(got.status, 200, "{got:?}");
    let status = |user| {
        let app = &app;
        async move { app.get_admin(&format!("{STATUSES}/{user}")).await.body }
    };
    assert_eq!(
        status(1).await,
        json!({ "user_id": 1, "enabled": false, "version": 10 })
    );
    assert_eq!(
        status(2).await,
        json!({ "user_id": 2, "enabled": true, "version": 50 })
    );
    assert_eq!(
        status(3).await,
        json!({ "user_id": 3, "enabled": false, "version": 50 })
    );
    assert_eq!(
        status(4).await,
        json!({ "user_id": 4, "enabled": true, "version": 10 })
    );
    // Deltas older than the snapshot's version no longer apply to its entries.
    let late = json!({ "items": [{ "user_id": 1, "enabled": true, "version": 9 }] });
    assert_eq!(
        app.send_admin(Method::POST, STATUSES, &late).await.body,
        json!({ "applied": 0, "ignored": 1 })
    );
}

#[tokio::test]
async fn operations_routes_answer_without_a_token() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    let health = read(
        app.http
            .get(format!("{}/healthz", app.admin))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(health.status, 200);
    let ready = read(
        app.http
            .get(format!("{}/readyz", app.admin))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(ready.status, 200);
    let metrics = read(
        app.http
            .get(format!("{}/metrics", app.admin))
            .send()
            .await
            .unwrap(),
    )
    .await;
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
async fn snapshot_bodies_stream_in_any_key_order_and_bad_ones_change_nothing() {
    let app =
        TestApp::spawn_with("[server]\nmax_body_bytes = 1000\nmax_snapshot_bytes = 200000").await;
    let put = |body: String| {
        let app = &app;
        async move {
            read(
                app.http
                    .put(format!("{}{STATUSES}", app.admin))
                    .bearer_auth(TOKEN)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    // Version after the ids, unknown keys skipped, larger than the ordinary body limit.
    let ids: Vec<u64> = (1..=20_000).collect();
    let body = format!(
        r#"{{"enabled_user_ids": {}, "note": {{"x": [1, "y"]}}, "version": 4}}"#,
        json!(ids)
    );
    assert!(body.len() > 1000);
    let got = put(body).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(
        app.get_admin(&format!("{STATUSES}/20000")).await.body["enabled"],
        true
    );

    // A bad id deep in the body, trailing garbage, a body over the snapshot limit:
    // nothing of them applies.
    let mut bad = ids.clone();
    bad[15_000] = 0;
    let got = put(format!(
        r#"{{"version": 5, "enabled_user_ids": {}}}"#,
        json!(bad)
    ))
    .await;
    got.assert_problem(400);
    assert!(
        got.body["detail"]
            .as_str()
            .unwrap()
            .contains("enabled_user_ids[15000]"),
        "{got:?}"
    );
    put(r#"{"version": 5, "enabled_user_ids": [1]} x"#.to_string())
        .await
        .assert_problem(400);
    put(r#"{"version": 5, "enabled_user_ids": [1], "enabled_user_ids": [2]}"#.to_string())
        .await
        .assert_problem(400);
    put(r#"{"version": 5, "enabled_user_ids": [1.5]}"#.to_string())
        .await
        .assert_problem(400);
    let huge: Vec<u64> = (1..=40_000).collect();
    put(format!(
        r#"{{"version": 5, "enabled_user_ids": {}}}"#,
        json!(huge)
    ))
    .await
    .assert_problem(413);
    let got = app.get_admin(&format!("{STATUSES}/1")).await;
    assert_eq!(
        got.body,
        json!({ "user_id": 1, "enabled": true, "version": 4 })
    );
}

#[tokio::test]
async fn a_webhook_of_ten_thousand_items_applies_in_one_delivery() {
    let app = TestApp::spawn().await;
    let items: Vec<_> = (1..=10_000u64)
        .map(|u| json!({ "user_id": u, "enabled": u % 2 == 0, "version": 1 }))
        .collect();
    let got = app
        .send_admin(Method::POST, STATUSES, &json!({ "items": items }))
        .await;
    assert_eq!(
        got.body,
        json!({ "applied": 10_000, "ignored": 0 }),
        "{got:?}"
    );
    let got = app.get_admin(&format!("{STATUSES}/10000")).await;
    assert_eq!(
        got.body,
        json!({ "user_id": 10_000, "enabled": true, "version": 1 })
    );
}

#[tokio::test]
async fn the_openapi_documents_describe_both_listeners() {
    let app = TestApp::spawn().await;
    let public = read(
        app.http
            .get(format!("{}/openapi/public.json", app.admin))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(public.status, 200);
    assert!(
        public.body["paths"]["/v1/public-phone"]["get"].is_object(),
        "{}",
        public.text
    );
    assert!(public.body["paths"]["/v1/public-phones/batch"]["post"].is_object());
    let admin = read(
        app.http
            .get(format!("{}/openapi/admin.json", app.admin))
            .send()
            .await
            .unwrap(),
    )
    .await;
    for path in [
        STATUSES,
        "/admin/v1/cache/invalidate",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(admin.body["paths"][path].is_object(), "{path} missing");
    }
    assert_eq!(
        admin.body["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}
