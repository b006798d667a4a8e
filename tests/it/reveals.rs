//! The reveal log (docs/api.md#the-reveal-log): every number answered is
//! recorded in batches, with per-ad counts, through faults and shutdowns.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::child::Process;
use crate::support::paths::{
    BATCH, METRICS, OPENAPI_ADMIN, REVEALS, STATUSES, ad_reveals_path, phone_path,
};
use crate::support::{Fake, Reply, TestApp, Upstream, eventually, pg};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL};

/// Flush often so tests see their reveals quickly.
const FAST: &str = "[reveals]\nflush_interval_ms = 50\n";

/// All reveals of a seller, newest first, following every page.
async fn reveals_of(app: &TestApp, query: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page_query = match &cursor {
            Some(c) => format!("{query}&cursor={c}"),
            None => query.to_owned(),
        };
        let page = app.get_admin(&format!("{REVEALS}?{page_query}")).await;
        assert_eq!(page.status, 200, "{page:?}");
        items.extend(page.body["items"].as_array().unwrap().iter().cloned());
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return items,
        }
    }
}

async fn ad_counts(app: &TestApp, ad: u64) -> Value {
    let answer = app.get_admin(&ad_reveals_path(ad)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

#[tokio::test]
async fn every_answered_number_is_recorded_and_nothing_else() {
    let app = TestApp::spawn_with(FAST).await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.get_public_as(Some("v-1"), &phone_path(42, 1, PLAIN_CATEGORY))
        .await
        .assert_number(REAL, "real");
    let items = json!({ "items": [
        { "user_id": 42, "ad_id": 2, "category_id": ANON_CATEGORY },
        { "user_id": 42, "ad_id": 3, "category_id": PLAIN_CATEGORY },
        { "user_id": 42, "ad_id": 0, "category_id": PLAIN_CATEGORY },
    ]});
    let batch = app
        .post_public_with(BATCH, &[("x-viewer-id", "v-2")], items.to_string())
        .await;
    assert_eq!(
        batch.body["results"][2]["error"]["status"], 400,
        "{batch:?}"
    );
    // Not reveals: HEAD, a 404, a bad request.
    assert_eq!(
        app.head_public(&phone_path(42, 4, PLAIN_CATEGORY)).await,
        200
    );
    app.real.reply(Reply::NotFound);
    app.anonymous.reply(Reply::NotFound);
    app.get_public_as(None, &phone_path(42, 5, PLAIN_CATEGORY))
        .await
        .assert_problem(404);
    app.get_public_as(None, "/v1/public-phone?user_id=42&ad_id=6")
        .await
        .assert_problem(400);

    eventually("three reveals written", Duration::from_secs(5), || async {
        reveals_of(&app, "user_id=42").await.len() >= 3
    })
    .await;
    // A flush later, still three.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let items = reveals_of(&app, "user_id=42").await;
    assert_eq!(items.len(), 3, "{items:?}");
    // Newest first; the batch's two items are its own reveals, in any order.
    let mut batch_items: Vec<_> = items[..2].to_vec();
    batch_items.sort_by_key(|i| i["ad_id"].as_u64());
    assert_eq!(batch_items[0]["ad_id"], 2);
    assert_eq!(batch_items[0]["kind"], "anonymous");
    assert_eq!(batch_items[0]["category_id"], ANON_CATEGORY);
    assert_eq!(batch_items[1]["ad_id"], 3);
    assert_eq!(batch_items[1]["kind"], "real");
    assert!(batch_items.iter().all(|i| i["viewer"] == "v-2"));
    let first = &items[2];
    assert_eq!(
        first.as_object().unwrap().keys().collect::<Vec<_>>(),
        [
            "ad_id",
            "at",
            "category_id",
            "kind",
            "reason",
            "user_id",
            "viewer"
        ]
    );
    let schema = reason_schema(&app).await;
    for item in &items {
        assert_reason_shape(&schema, &item["reason"]);
    }
    if !batch_items[0]["reason"].is_null() {
        assert_eq!(batch_items[0]["reason"]["sources"], json!({}));
    }
    assert_eq!(first["viewer"], "v-1");
    assert_eq!(first["user_id"], 42);
    assert_eq!(first["ad_id"], 1);
    assert_eq!(first["category_id"], PLAIN_CATEGORY);
    assert_eq!(first["kind"], "real");
    let at = first["at"].as_str().unwrap();
    assert!(at.len() == 24 && at.ends_with('Z'), "{at}");
    assert!(items[0]["at"].as_str().unwrap() >= at);
    assert!(!items.iter().any(|i| i.to_string().contains("7916")));
    let of_viewer = reveals_of(&app, "viewer=v-2").await;
    assert_eq!(of_viewer.len(), 2);
    assert_eq!(
        ad_counts(&app, 2).await,
        json!({ "ad_id": 2, "total": 1, "by_kind": { "anonymous": 1, "calltracking": 0, "real": 0 } })
    );
    assert_eq!(ad_counts(&app, 4).await["total"], 0, "HEAD is not counted");
}

/// The admin document's schema of a reveal's reason (`RevealReason`).
async fn reason_schema(app: &TestApp) -> Value {
    let doc = app.get_admin(OPENAPI_ADMIN).await;
    assert_eq!(doc.status, 200, "{doc:?}");
    let schema = doc.body["components"]["schemas"]["RevealReason"].clone();
    assert!(schema.is_object(), "no RevealReason in the admin document");
    schema
}

/// `reason` is null or the object `schema` describes: its required fields, no
/// other, each word from its field's list, `stood_in_for` only with a stale
/// origin.
fn assert_reason_shape(schema: &Value, reason: &Value) {
    if reason.is_null() {
        return;
    }
    let words = |field: &Value| -> Vec<String> {
        field["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("no enum in {field}"))
            .iter()
            .map(|w| w.as_str().unwrap().to_owned())
            .collect()
    };
    let fields = &schema["properties"];
    let object = reason.as_object().unwrap_or_else(|| panic!("{reason}"));
    for required in schema["required"].as_array().unwrap() {
        assert!(
            object.contains_key(required.as_str().unwrap()),
            "{required} in {reason}"
        );
    }
    for (key, value) in object {
        assert!(fields.get(key).is_some(), "{key} in {reason}");
        if let Some(word) = value.as_str() {
            assert!(
                words(&fields[key]).contains(&word.to_owned()),
                "{key}: {reason}"
            );
        }
    }
    for (source, skip) in reason["sources"].as_object().unwrap() {
        let allowed = words(&fields["sources"]["properties"][source]);
        assert!(
            allowed.contains(&skip.as_str().unwrap().to_owned()),
            "{source}: {reason}"
        );
    }
    assert_eq!(
        object.contains_key("stood_in_for"),
        reason["origin"] == "stale",
        "{reason}"
    );
}

/// A reveal's reason as the flush writes it reads back on the admin pages as
/// docs/api.md gives it, by seller and by viewer (none as null), on `url`.
async fn reasons_read_back_on_the_admin_pages(url: &str) {
    use phones_gateway::domain::reason::{Failure, Origin, Reason, Skip};
    use phones_gateway::domain::{AdId, CategoryId, Reveal, Source, UserId, Viewer};
    let app = TestApp::spawn_on(Some(url), FAST).await;
    let database = phones_gateway::store::Database::connect(url, 2)
        .await
        .unwrap();
    let at_us = phones_gateway::reveals::now_us();
    let reasons = [
        Some(
            Reason::new(Origin::Upstream)
                .skipped(Source::Anonymous, Skip::NotApplicable)
                .skipped(Source::Calltracking, Skip::Failed(Failure::Timeout)),
        ),
        Some(
            Reason::new(Origin::Stale(Failure::Deadline))
                .skipped(Source::Anonymous, Skip::NoNumber),
        ),
        Some(Reason::new(Origin::Cache)),
        None,
    ];
    let reveals: Vec<Reveal> = (0..4u64)
        .map(|n| Reveal {
            at_us: at_us + i64::try_from(n).unwrap(),
            viewer: Some(Viewer::parse(b"v-reasons").unwrap()),
            user: UserId::new(4242).unwrap(),
            ad: AdId::new(10 + n).unwrap(),
            category: CategoryId::new(PLAIN_CATEGORY).unwrap(),
            kind: Source::RealPhone,
            reason: reasons[usize::try_from(n).unwrap()],
        })
        .collect();
    database.reveals().write_reveals(&reveals).await.unwrap();
    database.close().await;
    let expected = [
        json!(null),
        json!({"code": "cache", "sources": {}, "origin": "cache"}),
        json!({"code": "anonymous_no_number", "sources": {"anonymous": "no_number"},
               "origin": "stale", "stood_in_for": "deadline"}),
        json!({"code": "calltracking_timeout",
               "sources": {"anonymous": "not_applicable", "calltracking": "timeout"},
               "origin": "upstream"}),
    ];
    let schema = reason_schema(&app).await;
    for query in ["user_id=4242&limit=3", "viewer=v-reasons&limit=3"] {
        let items = reveals_of(&app, query).await;
        let got: Vec<&Value> = items.iter().map(|i| &i["reason"]).collect();
        assert_eq!(got, expected.iter().collect::<Vec<_>>(), "{query}");
        for reason in got {
            assert_reason_shape(&schema, reason);
        }
    }
}

#[tokio::test]
async fn reasons_read_back_on_the_admin_pages_on_sqlite() {
    let (_dir, url) = crate::support::sqlite_file("reasons.db");
    reasons_read_back_on_the_admin_pages(&url).await;
}

#[tokio::test]
async fn reasons_read_back_on_the_admin_pages_on_postgres() {
    let db = pg::or_skip!(pg::database().await);
    reasons_read_back_on_the_admin_pages(&db.url).await;
}

#[tokio::test]
async fn a_viewer_id_must_be_1_to_128_visible_ascii_characters() {
    let app = TestApp::spawn_with(FAST).await;
    app.real.reply(Reply::Phone(REAL));
    let long = "x".repeat(129);
    for bad in ["", long.as_str(), "two words", "caf\u{e9}"] {
        let viewer = [("x-viewer-id", bad)];
        let answer = app
            .get_public_with(&phone_path(1, 1, PLAIN_CATEGORY), &viewer)
            .await;
        answer.assert_problem(400);
        assert!(answer.detail().contains("X-Viewer-Id"), "{answer:?}");
        let items = json!({ "items": [{ "user_id": 1, "ad_id": 1, "category_id": 1 }] });
        app.post_public_with(BATCH, &viewer, items.to_string())
            .await
            .assert_problem(400);
    }
    app.get_public_as(Some(&"x".repeat(128)), &phone_path(1, 1, PLAIN_CATEGORY))
        .await
        .assert_number(REAL, "real");
}

#[tokio::test]
async fn pages_are_keyset_newest_first_within_the_time_window() {
    let app = TestApp::spawn_with(FAST).await;
    app.real.reply(Reply::Phone(REAL));
    for ad in 1..=5 {
        app.get_public_as(Some("pager"), &phone_path(7, ad, PLAIN_CATEGORY))
            .await
            .assert_number(REAL, "real");
    }
    eventually("five reveals", Duration::from_secs(5), || async {
        reveals_of(&app, "user_id=7").await.len() == 5
    })
    .await;
    let first = app.get_admin(&format!("{REVEALS}?user_id=7&limit=2")).await;
    let page: Vec<u64> = first.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["ad_id"].as_u64().unwrap())
        .collect();
    assert_eq!(page, [5, 4]);
    let cursor = first.body["next_cursor"].as_str().unwrap();
    let second = app
        .get_admin(&format!("{REVEALS}?user_id=7&limit=2&cursor={cursor}"))
        .await;
    assert_eq!(second.body["items"][0]["ad_id"], 3);
    let all: Vec<u64> = reveals_of(&app, "user_id=7&limit=2")
        .await
        .iter()
        .map(|i| i["ad_id"].as_u64().unwrap())
        .collect();
    assert_eq!(all, [5, 4, 3, 2, 1]);
    // The window: since is inclusive, until exclusive.
    let items = reveals_of(&app, "user_id=7").await;
    let third_at = items[2]["at"].as_str().unwrap().to_owned();
    let since: Vec<u64> = reveals_of(&app, &format!("user_id=7&since={third_at}"))
        .await
        .iter()
        .map(|i| i["ad_id"].as_u64().unwrap())
        .collect();
    assert!(
        since.starts_with(&[5, 4]) && since.contains(&3),
        "{since:?}"
    );
    let until = reveals_of(&app, "user_id=7&until=2000-01-01T00:00:00Z").await;
    assert!(until.is_empty());
    for bad in [
        "",
        "user_id=7&viewer=pager",
        "user_id=7&limit=0",
        "user_id=7&limit=1001",
        "user_id=7&since=yesterday",
        "user_id=7&cursor=nonsense",
    ] {
        app.get_admin(&format!("{REVEALS}?{bad}"))
            .await
            .assert_problem(400);
    }
}

#[tokio::test]
async fn reveals_off_records_nothing_and_the_routes_are_404() {
    let app = TestApp::spawn_with("[reveals]\nenabled = false").await;
    app.real.reply(Reply::Phone(REAL));
    app.get_public_as(Some("v"), &phone_path(1, 1, PLAIN_CATEGORY))
        .await
        .assert_number(REAL, "real");
    app.get_admin(&format!("{REVEALS}?user_id=1"))
        .await
        .assert_problem(404);
    app.get_admin(&ad_reveals_path(1)).await.assert_problem(404);
}

#[tokio::test]
async fn a_graceful_shutdown_writes_what_is_buffered() {
    let (_dir, url) = crate::support::sqlite_file("reveals.db");
    // A far flush interval: only the shutdown can write them.
    let mut app = TestApp::spawn_on(Some(&url), "[reveals]\nflush_interval_ms = 60000").await;
    app.real.reply(Reply::Phone(REAL));
    for ad in 1..=3 {
        app.get_public_as(None, &phone_path(9, ad, PLAIN_CATEGORY))
            .await
            .assert_number(REAL, "real");
    }
    app.shutdown().await.unwrap().unwrap();
    let again = TestApp::spawn_on(Some(&url), "").await;
    assert_eq!(reveals_of(&again, "user_id=9").await.len(), 3);
}

/// Counts every write to a counter row, and the transactions they came in.
async fn count_counter_writes(url: &str) -> sqlx::PgPool {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    for statement in [
        "CREATE TABLE counter_writes (tx BIGINT NOT NULL)",
        "CREATE FUNCTION note_counter_write() RETURNS trigger AS $$ \
         BEGIN INSERT INTO counter_writes VALUES (txid_current()); RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER counter_write AFTER INSERT OR UPDATE ON ad_reveal_counts \
         FOR EACH ROW EXECUTE FUNCTION note_counter_write()",
    ] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    pool
}

#[tokio::test]
async fn a_hot_ad_counts_exactly_with_one_counter_write_per_flush() {
    let db = pg::or_skip!(pg::database().await);
    let app = TestApp::spawn_on(Some(&db.url), "[reveals]\nflush_interval_ms = 100").await;
    app.real.reply(Reply::Phone(REAL));
    let pool = count_counter_writes(&db.url).await;
    const TASKS: u64 = 20;
    const EACH: u64 = 50;
    let hammer = (0..TASKS).map(|task| {
        let (http, url) = (
            app.http.clone(),
            format!("{}{}", app.public, phone_path(task + 1, 77, PLAIN_CATEGORY)),
        );
        tokio::spawn(async move {
            for _ in 0..EACH {
                let answer = http.get(&url).send().await.unwrap();
                assert_eq!(answer.status(), 200);
            }
        })
    });
    for task in hammer.collect::<Vec<_>>() {
        task.await.unwrap();
    }
    eventually("every reveal counted", Duration::from_secs(10), || async {
        ad_counts(&app, 77).await["total"] == TASKS * EACH
    })
    .await;
    assert_eq!(ad_counts(&app, 77).await["by_kind"]["real"], TASKS * EACH);
    let (writes, flushes): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT tx) FROM counter_writes")
            .fetch_one(&pool)
            .await
            .unwrap();
    // One counter row (ad 77, real), written once per flush that carried it.
    assert_eq!(writes, flushes, "one write per flush");
    assert!(
        writes < (TASKS * EACH / 10) as i64,
        "{writes} counter writes for {} reveals",
        TASKS * EACH
    );
}

#[tokio::test]
async fn counts_are_summed_over_replicas_on_postgres() {
    let db = pg::or_skip!(pg::database().await);
    let (a, b) = TestApp::pair(&db.url, FAST).await;
    for app in [&a, &b] {
        app.real.reply(Reply::Phone(REAL));
        for user in 1..=3 {
            app.get_public_as(None, &phone_path(user, 55, PLAIN_CATEGORY))
                .await
                .assert_number(REAL, "real");
        }
    }
    for app in [&a, &b] {
        eventually("both replicas' reveals", Duration::from_secs(5), || async {
            ad_counts(app, 55).await["total"] == 6
        })
        .await;
    }
}

#[tokio::test]
async fn reveals_wait_in_memory_through_a_database_outage() {
    let db = pg::or_skip!(pg::cluster());
    let cluster = db.cluster.as_ref().unwrap();
    let app = TestApp::spawn_on(Some(&db.url), FAST).await;
    app.real.reply(Reply::Phone(REAL));
    cluster.stop_server().unwrap();
    for ad in 1..=4 {
        app.get_public_as(None, &phone_path(3, ad, PLAIN_CATEGORY))
            .await
            .assert_number(REAL, "real");
    }
    // The age of the oldest unwritten reveal grows while writes fail.
    let oldest = || async {
        let text = app.get_admin(METRICS).await.text;
        crate::support::series_value(&text, "phones_gateway_reveals_oldest_unwritten_seconds")
    };
    eventually(
        "the oldest unwritten reveal ages",
        Duration::from_secs(15),
        || async { oldest().await.is_some_and(|age| age >= 0.3) },
    )
    .await;
    cluster.start_server().unwrap();
    eventually(
        "written once the database is back",
        Duration::from_secs(15),
        || async { has_items(&app.get_admin(&format!("{REVEALS}?user_id=3")).await, 4) },
    )
    .await;
    eventually(
        "nothing unwritten once written",
        Duration::from_secs(15),
        || async { oldest().await == Some(0.0) },
    )
    .await;
}

/// Whether `page` is a 200 listing `n` items.
fn has_items(page: &crate::support::Answer, n: usize) -> bool {
    page.status == 200 && page.body["items"].as_array().unwrap().len() == n
}

/// The unlabelled series `name` on a process's own /metrics (0 when absent).
async fn metric_of(process: &Process, name: &str) -> f64 {
    let text = process.get_admin(METRICS).await.text;
    crate::support::series_value(&text, name).unwrap_or(0.0)
}

/// While the database is down, `max_buffered` reveals wait; past them a gateway
/// that drops shows the numbers and counts each drop, one that refuses answers
/// 503. Once the database is back the buffered ones are written.
#[tokio::test]
async fn past_max_buffered_reveals_are_dropped_and_counted_or_the_number_refused() {
    const DROPPED: &str = "phones_gateway_reveals_dropped_total";
    let db = pg::or_skip!(pg::cluster());
    let cluster = db.cluster.as_ref().unwrap();
    let real = Fake::start(Upstream::RealPhone).await;
    real.reply(Reply::Phone(REAL));
    let drop = Process::start_with(
        &db.url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
            ("REVEALS__FLUSH_INTERVAL_MS", "50"),
            ("REVEALS__MAX_BUFFERED", "2"),
        ],
    )
    .await;
    let refuse = TestApp::spawn_on(
        Some(&db.url),
        "[reveals]\nflush_interval_ms = 50\nmax_buffered = 2\non_overflow = \"refuse\"",
    )
    .await;
    refuse.real.reply(Reply::Phone(REAL));
    assert_eq!(metric_of(&drop, DROPPED).await, 0.0);
    cluster.stop_server().unwrap();
    for ad in 1..=2 {
        drop.get_public_with(&phone_path(10, ad, PLAIN_CATEGORY), &[])
            .await
            .assert_number(REAL, "real");
        refuse
            .get_public_as(None, &phone_path(11, ad, PLAIN_CATEGORY))
            .await
            .assert_number(REAL, "real");
    }
    assert_eq!(metric_of(&drop, DROPPED).await, 0.0, "two fit");
    // The third and the fourth: shown and dropped, or refused.
    for ad in 3..=4 {
        drop.get_public_with(&phone_path(10, ad, PLAIN_CATEGORY), &[])
            .await
            .assert_number(REAL, "real");
    }
    assert_eq!(metric_of(&drop, DROPPED).await, 2.0, "each dropped counted");
    let refused = refuse
        .get_public_as(None, &phone_path(11, 3, PLAIN_CATEGORY))
        .await;
    refused.assert_problem(503);
    assert_eq!(refused.retry_after.as_deref(), Some("1"));
    cluster.start_server().unwrap();
    eventually(
        "the buffered two written",
        Duration::from_secs(15),
        || async { has_items(&drop.get_admin(&format!("{REVEALS}?user_id=10")).await, 2) },
    )
    .await;
    eventually(
        "the buffered two written",
        Duration::from_secs(15),
        || async { has_items(&refuse.get_admin(&format!("{REVEALS}?user_id=11")).await, 2) },
    )
    .await;
    assert_eq!(metric_of(&drop, DROPPED).await, 2.0, "nothing else dropped");
    // With room again, refuse shows numbers again.
    refuse
        .get_public_as(None, &phone_path(11, 4, PLAIN_CATEGORY))
        .await
        .assert_number(REAL, "real");
}

#[tokio::test]
async fn retention_deletes_old_reveals_and_keeps_the_counts() {
    let (_dir, url) = crate::support::sqlite_file("retention.db");
    let mut app = TestApp::spawn_on(Some(&url), FAST).await;
    app.real.reply(Reply::Phone(REAL));
    app.get_public_as(None, &phone_path(5, 1, PLAIN_CATEGORY))
        .await
        .assert_number(REAL, "real");
    eventually("the recent reveal", Duration::from_secs(5), || async {
        reveals_of(&app, "user_id=5").await.len() == 1
    })
    .await;
    app.shutdown().await.unwrap().unwrap();
    // Reveals from 40 days ago, as an older replica would have written them.
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let old = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        - Duration::from_secs(40 * 86_400))
    .as_micros() as i64;
    for i in 0..12_000 {
        sqlx::query("INSERT INTO reveals (at_us, viewer, user_id, ad_id, category_id, kind) VALUES (?, NULL, 5, 1, 1, 'real')")
            .bind(old + i)
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query("UPDATE ad_reveal_counts SET n = n + 12000 WHERE ad_id = 1 AND kind = 'real'")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    // Retention runs at start: more than one batch goes.
    let app = TestApp::spawn_on(Some(&url), "").await;
    eventually("old reveals deleted", Duration::from_secs(10), || async {
        reveals_of(&app, "user_id=5&until=2100-01-01T00:00:00Z&limit=1000")
            .await
            .len()
            == 1
    })
    .await;
    assert_eq!(ad_counts(&app, 1).await["total"], 12_001, "counts are kept");
}

/// docs/status-sync.md: on SQLite the gateway's own writers never refuse each
/// other: frequent flushes beside status deliveries and snapshots, none a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_beside_a_reveal_log_flushing_every_10_ms_are_never_refused() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let app = TestApp::spawn_with("[reveals]\nflush_interval_ms = 10\n").await;
    app.real.reply(Reply::Phone(REAL));
    let done = AtomicBool::new(false);
    let shown = AtomicUsize::new(0);
    let traffic = |viewer: &'static str| {
        let (app, done, shown) = (&app, &done, &shown);
        async move {
            let mut n = 0;
            while !done.load(Ordering::Relaxed) {
                n += 1;
                // 50 cached keys: every answer a reveal, no upstream call.
                let key = n % 50 + 1;
                let got = app
                    .get_public_as(Some(viewer), &phone_path(key, key, PLAIN_CATEGORY))
                    .await;
                if got.status == 200 {
                    shown.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    };
    let deliveries = async {
        let mut statuses = Vec::new();
        for i in 0..40u64 {
            let items: Vec<Value> = (0..5_000u64)
                .map(|n| json!({ "user_id": 1_000 + i * 5_000 + n, "enabled": n % 2 == 0, "version": 10 + i }))
                .collect();
            let got = app
                .send_admin(reqwest::Method::POST, STATUSES, &json!({ "items": items }))
                .await;
            statuses.push(got.status);
        }
        statuses
    };
    let snapshots = async {
        let mut statuses = Vec::new();
        for i in 0..4u64 {
            let ids: Vec<u64> = (0..50_000u64).map(|n| 500_000 + i * 50_000 + n).collect();
            let got = app
                .send_admin(
                    reqwest::Method::PUT,
                    STATUSES,
                    &json!({ "version": 1 + i, "enabled_user_ids": ids }),
                )
                .await;
            statuses.push(got.status);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        statuses
    };
    let writes = async {
        let both = tokio::join!(deliveries, snapshots);
        done.store(true, Ordering::Relaxed);
        both
    };
    let ((deliveries, snapshots), (), (), ()) =
        tokio::join!(writes, traffic("v-1"), traffic("v-2"), traffic("v-3"));
    assert!(
        shown.load(Ordering::Relaxed) > 100,
        "too little traffic to flush"
    );
    let refused = deliveries
        .iter()
        .chain(&snapshots)
        .filter(|&&s| s != 200)
        .count();
    assert_eq!(
        refused, 0,
        "deliveries {deliveries:?}, snapshots {snapshots:?}"
    );
}

/// Retention cuts by the database's clock on PostgreSQL too (`now()`): of
/// reveals 1, 29, 31 and 400 days old, 30 days keeps the first two.
#[tokio::test]
async fn retention_on_postgres_cuts_by_the_database_clock() {
    use phones_gateway::domain::{AdId, CategoryId, Reveal, Source, UserId};
    use phones_gateway::store::Database;
    let db = pg::or_skip!(pg::database().await);
    let database = Database::connect(&db.url, 2).await.unwrap();
    database.migrate().await.unwrap();
    let store = database.reveals();
    let day_us = 86_400_000_000i64;
    let now = phones_gateway::reveals::now_us();
    let reveals: Vec<Reveal> = [1u64, 29, 31, 400]
        .into_iter()
        .map(|days| Reveal {
            at_us: now - days as i64 * day_us,
            viewer: None,
            user: UserId::new(42).unwrap(),
            ad: AdId::new(days).unwrap(),
            category: CategoryId::new(1).unwrap(),
            kind: Source::RealPhone,
            reason: None,
        })
        .collect();
    store.write_reveals(&reveals).await.unwrap();
    let deleted = phones_gateway::reveals::retention::delete_older_than(
        &store,
        Duration::from_secs(30 * 86_400),
    )
    .await
    .unwrap();
    assert_eq!(deleted, 2);
    let left: Vec<(i64,)> = {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        sqlx::query_as("SELECT ad_id FROM reveals ORDER BY ad_id")
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    assert_eq!(left, [(1,), (29,)]);
}

/// The nice value of `pid`'s threads whose names start with one of `names`.
#[cfg(target_os = "linux")]
fn nice_of_threads(pid: u32, names: &[&str]) -> Vec<(String, i32)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(name) = std::fs::read_to_string(task.path().join("comm")) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let name = name.trim().to_owned();
        if names.iter().any(|n| name.starts_with(n)) {
            // After the name's `)`: state is stat's 3rd field, nice the 19th.
            let after = stat.rsplit_once(')').unwrap().1;
            let nice: i32 = after.split_whitespace().nth(16).unwrap().parse().unwrap();
            found.push((name, nice));
        }
    }
    found
}

/// The flush and the log's SQLite writer run at the background nice value
/// (the writer also when retention opened its connection).
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_flush_and_its_sqlite_writer_run_at_background_priority() {
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let process = Process::start_with(&url, &[("REVEALS__FLUSH_INTERVAL_MS", "50")]).await;
    let pid = process.child.id();
    let want = phones_gateway::runtime::BACKGROUND_NICE;
    // The writer's thread is lowered a moment after it is named.
    eventually(
        &format!("the flush and writer threads at nice {want}"),
        Duration::from_secs(10),
        || {
            let seen = nice_of_threads(pid, &["reveal-flush", "reveal-writer"]);
            let found = seen.iter().any(|(n, _)| n == "reveal-flush")
                && seen.iter().any(|(n, _)| n.starts_with("reveal-writer"))
                && seen.iter().all(|(_, nice)| *nice == want);
            async move { found }
        },
    )
    .await;
    // The request workers keep the default.
    let workers = nice_of_threads(pid, &["tokio-rt-worker"]);
    assert!(
        !workers.is_empty() && workers.iter().all(|(_, nice)| *nice == 0),
        "{workers:?}"
    );
}

/// A reveal the crash test asked for: its viewer, when sent, and when its
/// 200 came back (none: killed first).
struct Asked {
    n: usize,
    answered: Option<Instant>,
}

/// The longest flush so far by the process's histogram (the smallest bucket
/// holding them all), with their count and mean.
async fn longest_flush(process: &Process) -> (Duration, u64, Duration) {
    const NAME: &str = "phones_gateway_reveals_flush_duration_seconds";
    let text = process.get_admin(METRICS).await.text;
    let value = |line: &str| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
    let count = text
        .lines()
        .find(|l| l.starts_with(&format!("{NAME}_count")))
        .map_or(0.0, value);
    let sum = text
        .lines()
        .find(|l| l.starts_with(&format!("{NAME}_sum")))
        .map_or(0.0, value);
    let longest = text
        .lines()
        .filter_map(|l| {
            let le = l.strip_prefix(&format!("{NAME}_bucket{{le=\""))?;
            let (bound, _) = le.split_once('"')?;
            Some((bound.parse::<f64>().unwrap_or(f64::INFINITY), value(l)))
        })
        .find(|&(_, n)| n >= count)
        .map_or(f64::INFINITY, |(bound, _)| bound);
    let mean = if count > 0.0 { sum / count } else { 0.0 };
    let longest = Duration::try_from_secs_f64(longest)
        .unwrap_or_else(|_| panic!("a flush took longer than the last bucket: {text}"));
    (longest, count as u64, Duration::from_secs_f64(mean))
}

/// docs/reveal-log.md: a crash (SIGKILL) loses at most the reveals of the last
/// `reveals.flush_interval_ms` plus the flush under way: killed mid-stream, every
/// reveal answered before that window is there, and nothing was dropped.
#[tokio::test]
async fn a_crash_loses_at_most_the_last_flush_interval_of_reveals() {
    use std::sync::{Arc, Mutex};
    const FLUSH_MS: u64 = 500;
    const SELLER: u64 = 31;
    let (_dir, url) = crate::support::sqlite_file("crash.db");
    let real = Fake::start(Upstream::RealPhone).await;
    real.reply(Reply::Phone(REAL));
    let flush_ms = FLUSH_MS.to_string();
    let env = [
        ("UPSTREAMS__REAL_PHONE__BASE_URL", real.url.as_str()),
        ("REVEALS__FLUSH_INTERVAL_MS", flush_ms.as_str()),
    ];
    let mut process = Process::start_with(&url, &env).await;
    let path = phone_path(SELLER, 1, PLAIN_CATEGORY);
    // Cached from now on: every answer a reveal, no upstream call.
    process
        .get_public_with(&path, &[("x-viewer-id", "crash-warm")])
        .await
        .assert_number(REAL, "real");

    let asked: Arc<Mutex<Vec<Asked>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stream = tokio::spawn({
        let (asked, stop) = (asked.clone(), stop.clone());
        let (http, url) = (process.http.clone(), format!("{}{path}", process.public));
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for n in 0.. {
                tick.tick().await;
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let got = http
                    .get(&url)
                    .header("x-viewer-id", format!("crash-{n}"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await;
                let answered = got.is_ok_and(|r| r.status() == 200).then(Instant::now);
                asked.lock().unwrap().push(Asked { n, answered });
            }
        }
    });
    // A few flushes for their length; then the kill, half an interval past
    // the next flush's end. A flush coming less often than every interval
    // would lose older reveals than the bound.
    let started = Instant::now();
    eventually(
        "four flushes of the stream",
        Duration::from_secs(30),
        || async { longest_flush(&process).await.1 >= 4 },
    )
    .await;
    let seen = longest_flush(&process).await.1;
    eventually("the next flush", Duration::from_secs(30), || async {
        longest_flush(&process).await.1 > seen
    })
    .await;
    let flushed = Instant::now();
    let (longest, flushes, mean) = longest_flush(&process).await;
    assert_eq!(
        metric_of(&process, "phones_gateway_reveals_dropped_total").await,
        0.0,
        "nothing dropped: what is missing is the crash's"
    );
    let interval = Duration::from_millis(FLUSH_MS);
    tokio::time::sleep_until((flushed + interval * 3 / 2 + 2 * longest).into()).await;
    let killed = Instant::now();
    process.child.kill();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    stream.await.unwrap();
    let asked = std::mem::take(&mut *asked.lock().unwrap());
    eprintln!(
        "{} reveals asked over {:?}; {flushes} flushes, the longest under {longest:?}, \
         mean {mean:?}; killed {:?} after a flush was seen done",
        asked.len(),
        killed - started,
        killed - flushed
    );

    let again = Process::start_with(&url, &env).await;
    let mut written = std::collections::HashSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = again
            .get_admin(&format!(
                "{REVEALS}?user_id={SELLER}&limit=1000{}",
                cursor
                    .as_deref()
                    .map_or(String::new(), |c| format!("&cursor={c}"))
            ))
            .await;
        assert_eq!(page.status, 200, "{page:?}");
        for item in page.body["items"].as_array().unwrap() {
            let viewer = item["viewer"].as_str().unwrap().to_owned();
            assert!(written.insert(viewer.clone()), "{viewer} written twice");
        }
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    // The interval, the last drain's flush and the flush under way.
    let window = interval + 2 * longest;
    let answered: Vec<(usize, Instant)> = asked
        .iter()
        .filter_map(|a| Some((a.n, a.answered?)))
        .collect();
    let lost: Vec<(usize, Duration)> = answered
        .iter()
        .filter(|(n, _)| !written.contains(&format!("crash-{n}")))
        .map(|&(n, at)| (n, killed.saturating_duration_since(at)))
        .collect();
    let oldest_lost = lost.iter().map(|&(_, before)| before).max();
    let youngest_lost = lost.iter().map(|&(_, before)| before).min();
    eprintln!(
        "{} answered, {} written, {} lost; the oldest lost answered {oldest_lost:?} before the kill",
        answered.len(),
        written.len(),
        lost.len()
    );
    assert!(answered.len() >= 100, "too few reveals: {}", answered.len());
    assert!(
        oldest_lost.is_none_or(|before| before <= window),
        "a reveal answered {oldest_lost:?} before the kill was lost; the bound is \
         flush_interval_ms ({FLUSH_MS} ms) plus two flushes of at most {longest:?} each \
         (the longest of {flushes} on the process's own histogram, mean {mean:?}): {window:?}. \
         {} lost, answered {oldest_lost:?} to {youngest_lost:?} before the kill",
        lost.len()
    );
    assert!(
        written.contains("crash-warm"),
        "the first reveal, long before the kill"
    );
}
