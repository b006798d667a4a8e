//! Promises of docs/ that no other module covered: batch problems equal to the
//! single route's, normalised anonymous and call-tracking numbers, snapshots at
//! exactly an entry's version, refused connections, invalidation of every cache,
//! eviction at capacity, and the status feed resumed from its stored cursor.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{Reply, TestApp, eventually};
use crate::{ANON, ANON_CATEGORY, NEW_ANON, OTHER_VIRTUAL, PLAIN_CATEGORY, REAL, VIRTUAL};

const STATUSES: &str = "/admin/v1/calltracking/statuses";

/// docs/api.md: a batch item's problem is the document the single route answers,
/// a 404 included.
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
    let batch = app
        .post_public("/v1/public-phones/batch", body.to_string())
        .await;
    assert_eq!(batch.status, 200, "{batch:?}");
    let results = batch.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (result, &(user, ad, category, phone)) in results.iter().zip(&items) {
        let mut query =
            format!("/v1/public-phone?user_id={user}&ad_id={ad}&category_id={category}");
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

/// docs/api.md: output is E.164 also when the anonymous or call-tracking upstream
/// answered with separators.
#[tokio::test]
async fn anonymous_and_calltracking_numbers_are_normalised() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone("+7 (800) 111-22-33"));
    app.calltracking.reply(Reply::Phone("+7 495 123-45-67"));
    app.enable_calltracking(2, 1).await;
    app.phone(1, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
    app.phone(2, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
}

/// docs/api.md: only an entry whose stored version is greater than the snapshot's
/// keeps its state; one at exactly V takes the snapshot's.
#[tokio::test]
async fn a_snapshot_overrides_an_entry_at_exactly_its_version() {
    let app = TestApp::spawn().await;
    let items = json!({ "items": [
        { "user_id": 1, "enabled": true, "version": 7 },
        { "user_id": 2, "enabled": false, "version": 7 },
        { "user_id": 3, "enabled": true, "version": 8 },
    ]});
    assert_eq!(
        app.send_admin(Method::POST, STATUSES, &items).await.status,
        200
    );
    let snapshot = json!({ "version": 7, "enabled_user_ids": [2] });
    let got = app.send_admin(Method::PUT, STATUSES, &snapshot).await;
    assert_eq!(got.status, 200, "{got:?}");
    for (user, enabled, version) in [(1, false, 7), (2, true, 7), (3, true, 8)] {
        let got = app.get_admin(&format!("{STATUSES}/{user}")).await;
        assert_eq!(
            got.body,
            json!({ "user_id": user, "enabled": enabled, "version": version })
        );
    }
}

/// A base URL where nothing listens: a port bound and given back.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

/// docs/rules.md: a refused connection is an upstream failure: real answers 503,
/// call tracking falls through to the real number.
#[tokio::test]
async fn refused_connections_are_upstream_failures() {
    let app = TestApp::spawn_with(&format!(
        "[upstreams.real_phone]\nbase_url = \"{}\"",
        closed_port_url()
    ))
    .await;
    let got = app.phone(1, 1, PLAIN_CATEGORY).await;
    got.assert_problem(503);
    assert!(got.retry_after.is_some(), "{got:?}");

    let app = TestApp::spawn_with(&format!(
        "[upstreams.calltracking]\nbase_url = \"{}\"",
        closed_port_url()
    ))
    .await;
    app.real.reply(Reply::Phone(REAL));
    app.enable_calltracking(1, 1).await;
    app.phone(1, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
}

/// docs/caching.md: invalidation drops the seller's anonymous and call-tracking numbers
/// too, not only the real one.
#[tokio::test]
async fn invalidation_drops_anonymous_and_calltracking_numbers() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.enable_calltracking(2, 1).await;
    app.phone(1, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
    app.phone(2, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    app.anonymous.reply(Reply::Phone(NEW_ANON));
    app.calltracking.reply(Reply::Phone(OTHER_VIRTUAL));
    // Still cached.
    app.phone(1, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
    app.phone(2, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    app.invalidate(&[1, 2]).await;
    app.phone(1, 1, ANON_CATEGORY)
        .await
        .assert_number(NEW_ANON, "anonymous");
    app.phone(2, 1, PLAIN_CATEGORY)
        .await
        .assert_number(OTHER_VIRTUAL, "calltracking");
    assert_eq!((app.anonymous.calls(), app.calltracking.calls()), (2, 2));
}

/// docs/caching.md: the caches are bounded: past capacity, entries are evicted and asked
/// for again.
#[tokio::test]
async fn a_cache_at_capacity_evicts() {
    let app = TestApp::spawn_with("[cache.real_phone]\ncapacity = 10").await;
    app.real.reply(Reply::Phone(REAL));
    for user in 1..=100 {
        app.phone(user, 1, PLAIN_CATEGORY)
            .await
            .assert_number(REAL, "real");
    }
    assert_eq!(app.real.calls(), 100);
    for user in 1..=100 {
        app.phone(user, 1, PLAIN_CATEGORY)
            .await
            .assert_number(REAL, "real");
    }
    // At most a handful of the 100 can still be held.
    let again = app.real.calls() - 100;
    assert!(again >= 50, "only {again} of 100 asked again: not bounded");
}

fn feed_overlay() -> &'static str {
    r#"
    [upstreams.calltracking.status_feed]
    enabled = true
    interval_ms = 50
    limit = 7
    "#
}

fn feed_items(users: std::ops::RangeInclusive<u64>) -> Vec<(u64, bool, u64)> {
    users.map(|user| (user, true, 1)).collect()
}

async fn status_of(app: &TestApp, user: u64) -> Value {
    app.get_admin(&format!("{STATUSES}/{user}")).await.body
}

/// docs/rules.md and docs/status-sync.md: the very first poll has no `after`; a restarted replica
/// resumes from the cursor it stored.
#[tokio::test]
async fn a_restarted_replica_resumes_the_feed_from_its_stored_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let first = TestApp::spawn_on(Some(&url), feed_overlay()).await;
    first.calltracking.feed(&feed_items(1..=30));
    eventually("the whole feed", Duration::from_secs(10), || async {
        status_of(&first, 30).await["enabled"] == true
    })
    .await;
    let polls = first.calltracking.feed_uris();
    assert_eq!(polls[0], "/v1/statuses?limit=7", "{polls:?}");
    assert!(polls.iter().any(|p| p.contains("after=28")), "{polls:?}");
    drop(first);

    let second = TestApp::spawn_on(Some(&url), feed_overlay()).await;
    second.calltracking.feed(&feed_items(1..=33));
    eventually("the feed's new items", Duration::from_secs(10), || async {
        status_of(&second, 33).await["enabled"] == true
    })
    .await;
    let polls = second.calltracking.feed_uris();
    assert!(
        polls[0].contains("after=30"),
        "resumed from the start, not the stored cursor: {polls:?}"
    );
    assert!(polls.iter().all(|p| p.contains("after=")), "{polls:?}");
}
