//! The viewers' budgets (docs/budgets.md): fleet-wide, kept over restarts and
//! database outages.

use std::time::{Duration, Instant};

use phones_gateway::budget::window::Moment;
use serde_json::json;

use crate::support::paths::{BATCH, phone_path};
use crate::support::proxy::Proxy;
use crate::support::{Answer, Reply, TestApp, eventually, pg};
use crate::{PLAIN_CATEGORY, REAL};

async fn as_viewer(app: &TestApp, viewer: Option<&str>, user: u64) -> crate::support::Answer {
    app.get_public_as(viewer, &phone_path(user, 1, PLAIN_CATEGORY))
        .await
}

#[tokio::test]
async fn a_viewer_past_the_budget_gets_429_and_no_upstream_is_called() {
    let app = TestApp::spawn_with("[rate_limit]\nper_viewer_per_minute = 3").await;
    app.real.reply(Reply::Phone(REAL));
    for user in 1..=3 {
        as_viewer(&app, Some("buyer-1"), user)
            .await
            .assert_number(REAL, "real");
    }
    let calls = app.real.calls();
    let refused = as_viewer(&app, Some("buyer-1"), 4).await;
    refused.assert_problem(429);
    let retry: u64 = refused.retry_after.as_deref().unwrap().parse().unwrap();
    // Spent at once, it fits again a third into the next minute.
    assert!((1..=120).contains(&retry), "{retry}");
    assert_eq!(
        app.real.calls(),
        calls,
        "no upstream call for a refused request"
    );
    // Cached answers count too: the fourth is refused all the same.
    for _ in 0..3 {
        as_viewer(&app, Some("buyer-5"), 1)
            .await
            .assert_number(REAL, "real");
    }
    let calls = app.real.calls();
    as_viewer(&app, Some("buyer-5"), 1)
        .await
        .assert_problem(429);
    assert_eq!(app.real.calls(), calls, "the cached answers made no call");
    as_viewer(&app, Some("buyer-2"), 1)
        .await
        .assert_number(REAL, "real");
    for _ in 0..5 {
        as_viewer(&app, None, 1).await.assert_number(REAL, "real");
    }
    let batch = |n: usize| {
        json!({ "items": vec![json!({ "user_id": 9, "ad_id": 1, "category_id": 1 }); n] })
            .to_string()
    };
    let post = |viewer: &'static str, body: String| {
        let app = &app;
        async move {
            app.post_public_with(BATCH, &[("x-viewer-id", viewer)], body)
                .await
        }
    };
    let got = post("buyer-3", batch(2)).await;
    assert_eq!(got.status, 200, "{got:?}");
    let results = got.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{got:?}");
    for result in results {
        assert_eq!(result["phone"], REAL, "{result}");
    }
    post("buyer-3", batch(2)).await.assert_problem(429);
    // A batch no wait would let through is refused at once, saying why.
    let never = post("buyer-4", batch(4)).await;
    never.assert_problem(400);
    assert!(never.retry_after.is_none(), "{never:?}");
    let detail = never.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("rate_limit.per_viewer_per_minute = 3"),
        "{detail}"
    );
    // Items refused for a bad parameter cost nothing.
    let bad = json!({ "user_id": 0, "ad_id": 1, "category_id": 1 });
    let good = json!({ "user_id": 9, "ad_id": 1, "category_id": 1 });
    let mixed = json!({ "items": [bad, good, bad, good, bad, good] }).to_string();
    let got = post("buyer-6", mixed).await;
    assert_eq!(got.status, 200, "{got:?}");
    let results = got.body["results"].as_array().unwrap();
    for (i, result) in results.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(result["error"]["status"], 400, "{result}");
        } else {
            assert_eq!(result["phone"], REAL, "{result}");
        }
    }
    as_viewer(&app, Some("buyer-6"), 1)
        .await
        .assert_problem(429);
}

async fn reveal(app: &TestApp, viewer: &str) -> Answer {
    as_viewer(app, Some(viewer), 1).await
}

/// Spends `n`, retrying within `limit` a refusal for the replica's share.
async fn spend(app: &TestApp, viewer: &str, n: usize, limit: Duration) {
    let start = Instant::now();
    let mut spent = 0;
    while spent < n {
        let got = reveal(app, viewer).await;
        match got.status {
            200 => spent += 1,
            429 if got.retry_after.as_deref() == Some("1") && start.elapsed() < limit => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => panic!("spending {n} as {viewer}: after {spent}, {got:?}"),
        }
    }
}

/// Waits until at least `left` of the current UTC minute remains.
async fn with_minute_left(left: Duration) {
    let remaining = Duration::from_millis(60_000 - Moment::now().into_minute());
    if remaining < left {
        tokio::time::sleep(remaining + Duration::from_millis(50)).await;
    }
}

/// Counts what `app` answers `viewer` until it refuses (within `limit`).
async fn answered_until_refused(app: &TestApp, viewer: &str, limit: Duration) -> usize {
    let start = Instant::now();
    let mut answered = 0;
    loop {
        let got = reveal(app, viewer).await;
        match got.status {
            429 if got.retry_after.as_deref() != Some("1") => return answered,
            200 => answered += 1,
            429 => {}
            _ => panic!("{got:?}"),
        }
        assert!(
            start.elapsed() < limit,
            "{viewer} still answered after {limit:?} ({answered} answers)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn replica_overlay(budgets: &str) -> String {
    format!("[rate_limit]\n{budgets}\nexchange_interval_ms = 100")
}

/// How a proxy sees each of the exchange's reads of refusals begin.
const REFUSALS_READ_SQL: &str = "FROM viewer_refusals WHERE at >";

/// docs/budgets.md: every replica refuses a viewer past a budget within this.
const REFUSED_EVERYWHERE: Duration = Duration::from_secs(1);

/// A budget spent over two replicas: within a second every replica has read
/// the refusal and refuses the viewer, the third too, which never saw them.
#[tokio::test]
async fn a_viewer_who_spent_the_budget_on_two_replicas_is_refused_everywhere_within_a_second() {
    let db = pg::or_skip!(pg::database().await);
    let _timing = crate::support::one_timing_test_at_a_time().await;
    let overlay = replica_overlay("per_viewer_per_minute = 6");
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let (proxy, through) = Proxy::in_front_of(&db.url).await;
        let app = TestApp::spawn_on(Some(&through), &overlay).await;
        app.real.reply(Reply::Phone(REAL));
        let reads = proxy.watch(REFUSALS_READ_SQL);
        replicas.push((app, proxy, reads));
    }
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    with_minute_left(Duration::from_secs(20)).await;
    // Three on each of two replicas is the whole budget.
    spend(&replicas[0].0, "scraper", 3, Duration::from_secs(3)).await;
    spend(&replicas[1].0, "scraper", 3, Duration::from_secs(3)).await;
    let spent = Instant::now();
    eventually("the refusal stored", Duration::from_secs(10), || async {
        stored(&pool, "SELECT count(*) FROM viewer_refusals").await == 1
    })
    .await;
    let refusal_seen = Instant::now();
    assert_eq!(
        stored(
            &pool,
            "SELECT COALESCE(sum(spent), 0)::int8 FROM viewer_budgets WHERE kind = 0"
        )
        .await,
        6,
        "the fleet's total when the refusal was written"
    );
    let mut known = Vec::new();
    for (i, (_, _, reads)) in replicas.iter().enumerate() {
        let second_read = || {
            reads
                .times()
                .into_iter()
                .filter(|&t| t > refusal_seen)
                .nth(1)
        };
        eventually(
            &format!("replica {i} to read the refusals twice"),
            Duration::from_secs(10),
            || async { second_read().is_some() },
        )
        .await;
        known.push(second_read().unwrap() - spent);
    }
    eprintln!(
        "refusal stored {:?} after the last spend; known on each replica by {known:?}",
        refusal_seen - spent
    );
    for (i, took) in known.iter().enumerate() {
        assert!(
            *took < REFUSED_EVERYWHERE,
            "replica {i} had read the refusal only {took:?} after the last spend \
             (docs/budgets.md: every replica refuses within {REFUSED_EVERYWHERE:?})"
        );
    }
    for (app, _, _) in &replicas {
        let refused = reveal(app, "scraper").await;
        refused.assert_problem(429);
        let retry: u64 = refused.retry_after.as_deref().unwrap().parse().unwrap();
        assert!((2..=120).contains(&retry), "{retry}");
    }
    for (app, _, _) in &replicas {
        reveal(app, "buyer").await.assert_number(REAL, "real");
    }
}

async fn stored(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_day_budget_holds_across_a_restart() {
    let db = pg::or_skip!(pg::database().await);
    let overlay = replica_overlay("per_viewer_per_day = 4");
    let mut a = TestApp::spawn_on(Some(&db.url), &overlay).await;
    a.real.reply(Reply::Phone(REAL));
    spend(&a, "scraper", 4, Duration::from_secs(3)).await;
    let refused = reveal(&a, "scraper").await;
    refused.assert_problem(429);
    let retry: u64 = refused.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry), "{retry}");
    spend(&a, "buyer", 1, Duration::from_secs(3)).await;
    // Stopped at once: the last spends and refusals are written at shutdown.
    a.shutdown().await.unwrap().unwrap();

    let a = TestApp::spawn_on(Some(&db.url), &overlay).await;
    a.real.reply(Reply::Phone(REAL));
    let refused = reveal(&a, "scraper").await;
    refused.assert_problem(429);
    let again: u64 = refused.retry_after.as_deref().unwrap().parse().unwrap();
    assert!(again <= retry && again + 5 >= retry, "{again} vs {retry}");
    // What the buyer spent before the restart counts: 3 more, then refused.
    spend(&a, "buyer", 3, Duration::from_secs(3)).await;
    assert_eq!(
        answered_until_refused(&a, "buyer", Duration::from_secs(2)).await,
        0
    );
}

/// Past the pool's acquire timeout, so that reports fail.
const REPORTS_FAIL: Duration = Duration::from_secs(5);

#[tokio::test]
async fn with_the_database_down_a_replica_holds_a_viewer_to_its_share_and_reports_it_after() {
    let db = pg::or_skip!(pg::cluster());
    let cluster = db.cluster.as_ref().unwrap();
    let overlay = replica_overlay("per_viewer_per_day = 10");
    let (a, b) = TestApp::pair(&db.url, &overlay).await;
    for app in [&a, &b] {
        app.real.reply(Reply::Phone(REAL));
    }
    // Two on A in two reports: A's share becomes all that remains. Each
    // report is applied on A once A marked itself alive after it.
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let day_total = "SELECT COALESCE(sum(spent), 0)::int8 FROM viewer_budgets WHERE kind = 1";
    for total in 1..=2 {
        spend(&a, "scraper", 1, Duration::from_secs(3)).await;
        eventually(
            &format!("A's report of spend {total}"),
            Duration::from_secs(10),
            || async { stored(&pool, day_total).await == total },
        )
        .await;
    }
    exchanged_since_now(&pool, "A's exchange after its second report").await;
    pool.close().await;

    cluster.stop_server().unwrap();
    // Down: A answers at once from its ledger, up to its share, then refuses.
    let mut answered = 0;
    loop {
        let asked = Instant::now();
        let got = reveal(&a, "scraper").await;
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "waited on the database"
        );
        match got.status {
            200 => answered += 1,
            429 => break,
            _ => panic!("{got:?}"),
        }
        assert!(answered <= 8, "past the budget with the database down");
    }
    assert!(answered >= 1, "nothing of its share");
    let spent = 2 + answered;

    assert_eq!(
        spent, 10,
        "A's share was all that remained: it alone had spent"
    );
    // Down until reports have failed; what A spent stays pending.
    tokio::time::sleep(REPORTS_FAIL).await;

    cluster.start_server().unwrap();
    // Back: A reports, its total now the budget, and refuses the viewer for
    // the fleet; B, which never saw them, refuses without answering once.
    let start = Instant::now();
    while a.set_status(1, true, 1).await != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "A never recovered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.converged(1, 1, Duration::from_secs(15)).await;
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let reported = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    crate::support::eventually("A reported its spends", Duration::from_secs(5), || async {
        reported("SELECT COALESCE(sum(spent), 0)::int8 FROM viewer_budgets WHERE kind = 1").await
            == 10
    })
    .await;
    crate::support::eventually("A wrote the refusal", Duration::from_secs(5), || async {
        reported("SELECT count(*) FROM viewer_refusals").await == 1
    })
    .await;
    // Two marks: B ran a full exchange after the refusal.
    exchanged_since_now(&pool, "B's first exchange after the refusal").await;
    exchanged_since_now(&pool, "B's second exchange after the refusal").await;
    let refused = reveal(&b, "scraper").await;
    refused.assert_problem(429);
}

/// Waits until both replicas marked themselves alive after now, which they do
/// after a working exchange: what was stored before now was applied by then.
async fn exchanged_since_now(pool: &sqlx::PgPool, what: &str) {
    let mark: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(pool)
        .await
        .unwrap();
    eventually(what, Duration::from_secs(10), || {
        let (pool, mark) = (pool.clone(), mark.clone());
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM budget_replicas WHERE seen_at > $1::timestamptz",
            )
            .bind(mark)
            .fetch_one(&pool)
            .await
            .unwrap()
                == 2
        }
    })
    .await;
}

/// Retention: past windows and ended refusals go, current ones stay.
async fn prunes_past_windows(url: &str) {
    use phones_gateway::store::{Database, Spend};
    let database = Database::connect(url, 2).await.unwrap();
    database.migrate().await.unwrap();
    let store = database.budgets();
    let spend = |viewer, kind, window| Spend {
        viewer,
        kind,
        window,
        n: 1,
    };
    let (minute, day) = (29_000_000, 20_000);
    let totals = store
        .report(&[
            spend(u64::MAX, 0, minute - 3),
            spend(1, 0, minute - 1),
            spend(1, 0, minute),
            spend(2, 1, day - 2),
            spend(2, 1, day),
        ])
        .await
        .unwrap();
    assert_eq!(totals.len(), 5);
    // A viewer key with the top bit set comes back as it went.
    assert!(totals.iter().any(|t| t.viewer == u64::MAX && t.spent == 1));
    store.refuse(&[(1, 1_000), (2, 5_000)]).await.unwrap();
    let pruned = store.prune(minute - 1, day - 1, 2_000, 100).await.unwrap();
    assert_eq!(
        pruned.rows, 3,
        "the minute before last, the day before yesterday, an ended refusal"
    );
    assert!(!pruned.more);
    assert_eq!(store.refusals(true, 2_000).await.unwrap(), vec![(2, 5_000)]);
    let again = store.report(&[spend(1, 0, minute)]).await.unwrap();
    assert_eq!(again[0].spent, 2, "{again:?}");

    // Batch after batch until none is full, nothing current touched.
    let expired: Vec<Spend> = (0..2_500u64)
        .flat_map(|v| {
            [
                spend(v << 20, 0, minute - 2 - u32::try_from(v % 5).unwrap()),
                spend(v << 20, 1, day - 1 - u32::try_from(v % 3).unwrap()),
            ]
        })
        .collect();
    store.report(&expired).await.unwrap();
    let mut batches = 0;
    let mut rows = 0;
    loop {
        let pruned = store.prune(minute - 1, day, 2_000, 1_000).await.unwrap();
        assert!(pruned.rows <= 3 * 1_000, "{pruned:?}");
        rows += pruned.rows;
        batches += 1;
        if !pruned.more {
            break;
        }
        assert!(batches < 5, "{batches} batches of 1,000 rows each kind");
    }
    assert_eq!(rows, 5_000);
    assert_eq!(store.rows().await.unwrap(), (2, 1, 1));
    database.close().await;
}

#[tokio::test]
async fn past_windows_and_ended_refusals_are_pruned_on_sqlite() {
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    prunes_past_windows(&url).await;
}

#[tokio::test]
async fn past_windows_and_ended_refusals_are_pruned_on_postgres() {
    let db = pg::or_skip!(pg::database().await);
    prunes_past_windows(&db.url).await;
}
