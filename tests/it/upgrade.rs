//! Upgrades (docs/operations.md, "Migrations at start", "Upgrading"): a replica
//! on an earlier schema migrates, names the running migration in `/readyz`, and
//! reads every reveal back; one finding the migrations' lock held waits.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::{Duration, Instant};

use phones_gateway::domain::Source;
use phones_gateway::domain::reason::{Failure, Origin, Reason, Skip};
use serde_json::Value;
use sqlx::migrate::Migrator;

use crate::support::Reply;
use crate::support::app::TestApp;
use crate::support::paths::{READYZ, REVEALS, phone_path};
use crate::support::pg;
use crate::{PLAIN_CATEGORY, REAL};

/// Reveals in the upgraded database: `UPGRADE_REVEALS`, else 1,000,000
/// (`benches/load/upgrade.sh` runs these tests at 20,000,000 too).
fn reveals_n() -> i64 {
    std::env::var("UPGRADE_REVEALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000)
}

/// Sellers whose reveals are read back on the admin pages of a database of
/// `n` reveals, of `of` (every row is checked in SQL besides).
fn paged(n: i64, of: i64) -> i64 {
    (of * 10_000 / n).clamp(1, of)
}
/// Sellers the reveals are spread over.
const SELLERS: i64 = 100;
const VIEWERS: i64 = 50;

/// The reasons stored, by `ad_id % 5` (4: none).
fn reasons() -> [Option<Reason>; 5] {
    [
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
        Some(Reason::new(Origin::Upstream).skipped(Source::Anonymous, Skip::NotApplicable)),
        None,
    ]
}

fn code(reason: Option<Reason>) -> Option<i64> {
    reason.map(|r| i64::from(r.encode()))
}

/// The embedded migrations of `dir` up to and including `last`.
fn migrator_until(migrator: &Migrator, last: i64) -> Migrator {
    Migrator {
        migrations: Cow::Owned(
            migrator
                .iter()
                .filter(|m| m.version <= last)
                .cloned()
                .collect(),
        ),
        ..Migrator::DEFAULT
    }
}

/// An SQLite file at migration 0010 holding `n` reveals, with a posting per
/// seller and a run per viewer for each (what 0007 and 0009 backfill).
async fn sqlite_at_0010(url: &str, n: i64, at_us: i64) {
    use sqlx::ConnectOptions as _;
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
    let mut conn = options
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .connect()
        .await
        .unwrap();
    migrator_until(&sqlx::migrate!("migrations/sqlite"), 10)
        .run(&mut conn)
        .await
        .unwrap();
    let [r0, r1, r2, r3, _] = reasons().map(code);
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
         INSERT INTO reveals (id, at_us, viewer, user_id, ad_id, category_id, kind, reason) \
         SELECT i, ?2 + i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'v-' || (i % ?3) END, \
                1 + i % ?4, i, 5, 'real', \
                CASE i % 5 WHEN 0 THEN ?5 WHEN 1 THEN ?6 WHEN 2 THEN ?7 WHEN 3 THEN ?8 END \
         FROM n",
    )
    .bind(n)
    .bind(at_us)
    .bind(VIEWERS)
    .bind(SELLERS)
    .bind(r0)
    .bind(r1)
    .bind(r2)
    .bind(r3)
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO reveal_seller_postings (user_id, max_at_us, min_at_us, first_id, last_id, entries) \
         SELECT user_id, at_us, at_us, id, id, NULL FROM reveals ORDER BY id",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO reveal_viewer_runs (viewer, max_at_us, min_at_us, first_id, last_id) \
         SELECT viewer, at_us, at_us, id, id FROM reveals WHERE viewer IS NOT NULL ORDER BY id",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::Connection::close(conn).await.unwrap();
}

/// A PostgreSQL database at migration `last` holding `n` reveals.
async fn postgres_at(url: &str, last: i64, n: i64, at_us: i64) {
    let mut conn = crate::support::pg_connection(url).await;
    migrator_until(&sqlx::migrate!("migrations/postgres"), last)
        .run(&mut conn)
        .await
        .unwrap();
    let [r0, r1, r2, r3, _] = reasons().map(code);
    sqlx::query(
        "INSERT INTO reveals (at_us, viewer, user_id, ad_id, category_id, kind, reason) \
         SELECT $2 + i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'v-' || (i % $3) END, \
                1 + i % $4, i, 5, 'real', \
                (CASE i % 5 WHEN 0 THEN $5 WHEN 1 THEN $6 WHEN 2 THEN $7 WHEN 3 THEN $8 END)::integer \
         FROM generate_series(1, $1::bigint) AS i",
    )
    .bind(n)
    .bind(at_us)
    .bind(VIEWERS)
    .bind(SELLERS)
    .bind(r0)
    .bind(r1)
    .bind(r2)
    .bind(r3)
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::Connection::close(conn).await.unwrap();
}

/// Polls `/readyz` until 200 (at most `limit`); returns how long it took and
/// every distinct 503 detail seen meanwhile.
async fn until_ready(app: &TestApp, limit: Duration) -> (Duration, Vec<String>) {
    let started = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    loop {
        let answer = app.get_admin(READYZ).await;
        if answer.status == 200 {
            return (started.elapsed(), seen);
        }
        assert_eq!(answer.status, 503, "{answer:?}");
        let detail = answer.body["detail"].as_str().unwrap_or_default();
        let shape = |d: &str| -> String { d.chars().filter(|c| !c.is_ascii_digit()).collect() };
        match seen.iter_mut().find(|s| shape(s) == shape(detail)) {
            Some(same) => detail.clone_into(same),
            None => seen.push(detail.to_owned()),
        }
        assert!(
            started.elapsed() < limit,
            "not ready within {limit:?}; /readyz said {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `/readyz` (200 throughout) until it names no migration, at most
/// `limit`; returns how long it took and the last body that named one.
async fn until_migrated(app: &TestApp, limit: Duration) -> (Duration, String) {
    let started = Instant::now();
    let mut said = String::new();
    loop {
        let answer = app.get_admin(READYZ).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        if answer.text == "ready" {
            return (started.elapsed(), said);
        }
        said = answer.text;
        assert!(
            started.elapsed() < limit,
            "still migrating after {limit:?}: {said}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every page of `query`, in order.
async fn pages(app: &TestApp, query: &str) -> Vec<Value> {
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

/// Every reveal of `n` (ad `i` is reveal `i`) with its seller, viewer and
/// reason, on the admin pages of the first `paged` sellers and of a viewer.
async fn reveals_read_back(app: &TestApp, n: i64, paged: i64) {
    let reasons = reasons().map(|r| serde_json::to_value(r).unwrap());
    let check = |item: &Value| {
        let ad = item["ad_id"].as_i64().unwrap();
        assert_eq!(item["user_id"].as_i64(), Some(1 + ad % SELLERS), "{item}");
        let viewer = (ad % 3 != 0).then(|| format!("v-{}", ad % VIEWERS));
        assert_eq!(item["viewer"].as_str(), viewer.as_deref(), "{item}");
        assert_eq!(item["reason"], reasons[(ad % 5) as usize], "{item}");
        ad
    };
    let mut ads = HashSet::new();
    for seller in 1..=paged {
        let items = pages(app, &format!("user_id={seller}&limit=1000")).await;
        let expected = (1..=n).filter(|i| 1 + i % SELLERS == seller).count();
        assert_eq!(items.len(), expected, "seller {seller}'s reveals");
        for item in items {
            assert!(ads.insert(check(&item)), "read twice: {item}");
        }
    }
    if paged == SELLERS {
        assert_eq!(ads.len() as i64, n, "every reveal, once");
    }
    let viewer = pages(app, "viewer=v-7&limit=1000").await;
    let expected = (1..=n).filter(|i| i % 3 != 0 && i % VIEWERS == 7).count();
    assert_eq!(viewer.len(), expected, "v-7's reveals");
    for item in &viewer {
        check(item);
    }
}

fn versions_applied(names: &[i64]) -> String {
    names
        .iter()
        .map(|v| format!("{v:04}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// SQLite at 0010 holding reveals: 0011 touches the log alone, so the replica
/// is ready and answers while it runs, `/readyz` naming it; the reveals held
/// meanwhile are written after, and every reveal and its reason read back.
#[tokio::test]
async fn an_upgrade_over_reveals_becomes_ready_on_sqlite() {
    let (_dir, url) = crate::support::sqlite_file("upgrade.db");
    let at_us = phones_gateway::reveals::now_us() - 3_600_000_000;
    let filled = Instant::now();
    let n = reveals_n();
    sqlite_at_0010(&url, n, at_us).await;
    eprintln!("{n} reveals at 0010 in {:?}", filled.elapsed());
    let app = TestApp::start_on(Some(&url), "").await;
    app.real.reply(Reply::Phone(REAL));
    let (took, said) = until_ready(&app, Duration::from_secs(60)).await;
    eprintln!("ready {took:?} after the start; /readyz said {said:?}");
    let running = "applying migration 0011 (reveal buckets), 1 of 1 pending";
    // Answered while 0011 runs: the migration is named before and after.
    let mut before = app.get_admin(READYZ).await;
    let started = Instant::now();
    while !before.text.contains(running) && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        before = app.get_admin(READYZ).await;
    }
    let (seller, ad) = (
        u64::try_from(SELLERS + 1).unwrap(),
        u64::try_from(n + 1).unwrap(),
    );
    let answer = app
        .get_public(&phone_path(seller, ad, PLAIN_CATEGORY))
        .await;
    let after = app.get_admin(READYZ).await;
    for readyz in [&before, &after] {
        assert_eq!(readyz.status, 200, "{readyz:?}");
        assert!(readyz.text.contains(running), "{readyz:?}");
    }
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["phone"], REAL, "{answer:?}");
    // The log is read once migrated: a problem document to retry.
    let reading = app.get_admin(&format!("{REVEALS}?user_id=1")).await;
    reading.assert_problem(503);
    assert!(reading.retry_after.is_some(), "{reading:?}");
    let detail = reading.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("being migrated"), "{reading:?}");
    let (took, said) = until_migrated(&app, Duration::from_secs(1200)).await;
    eprintln!("migrated {took:?} after ready; /readyz said {said:?}");
    let mut written = Vec::new();
    for _ in 0..100 {
        written = pages(&app, &format!("user_id={}", SELLERS + 1)).await;
        if !written.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0]["ad_id"].as_i64(), Some(n + 1), "{written:?}");
    let mut conn = crate::support::sqlite_connection(&url).await;
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY 1")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(versions_applied(&applied[9..]), "0010,0011");
    let [r0, r1, r2, r3, _] = reasons().map(code);
    let wrong: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reveals WHERE ad_id <= ?1 AND (\
         at_us IS NOT ?2 + ad_id OR user_id IS NOT 1 + ad_id % ?4 \
         OR viewer IS NOT (CASE WHEN ad_id % 3 = 0 THEN NULL ELSE 'v-' || (ad_id % ?3) END) \
         OR reason IS NOT (CASE ad_id % 5 WHEN 0 THEN ?5 WHEN 1 THEN ?6 WHEN 2 THEN ?7 WHEN 3 THEN ?8 END))",
    )
    .bind(n)
    .bind(at_us)
    .bind(VIEWERS)
    .bind(SELLERS)
    .bind(r0)
    .bind(r1)
    .bind(r2)
    .bind(r3)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let (rows, ads): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT ad_id) FROM reveals")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!((rows, ads, wrong), (n + 1, n + 1, 0));
    let read = Instant::now();
    reveals_read_back(&app, n, paged(n, SELLERS)).await;
    eprintln!("read back on the admin pages in {:?}", read.elapsed());
}

/// PostgreSQL at 0007, one migration short of the previous release, holding
/// reveals: ready once migrated, every reveal and its reason read back.
#[tokio::test]
async fn an_upgrade_over_reveals_becomes_ready_on_postgres() {
    let db = pg::or_skip!(pg::database().await);
    let at_us = phones_gateway::reveals::now_us() - 3_600_000_000;
    let filled = Instant::now();
    let n = reveals_n();
    postgres_at(&db.url, 7, n, at_us).await;
    eprintln!("{n} reveals at 0007 in {:?}", filled.elapsed());
    let app = TestApp::start_on(Some(&db.url), "").await;
    let (took, said) = until_ready(&app, Duration::from_secs(300)).await;
    eprintln!("ready {took:?} after the start; /readyz said {said:?}");
    let mut conn = crate::support::pg_connection(&db.url).await;
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY 1")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(versions_applied(&applied[6..]), "0007,0008");
    reveals_read_back(&app, n, paged(n, SELLERS * 10)).await;
}

/// Two replicas starting together run each migration once: one finding the
/// migrator's advisory lock held waits, says so on `/readyz` and applies
/// nothing, past `MIGRATION_BOUND` (not cut off); released, it migrates.
#[tokio::test]
async fn a_replica_waits_for_the_migrations_lock_another_holds() {
    let db = pg::or_skip!(pg::database().await);
    postgres_at(&db.url, 7, 10, 0).await;
    let mut holder = crate::support::pg_connection(&db.url).await;
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut holder)
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(phones_gateway::store::migration_lock_key(&name))
        .execute(&mut holder)
        .await
        .unwrap();
    let app = TestApp::start_on(Some(&db.url), "").await;
    let held_for = phones_gateway::store::MIGRATION_BOUND + Duration::from_secs(3);
    let until = Instant::now() + held_for;
    let mut waiting = false;
    while Instant::now() < until {
        let answer = app.get_admin(READYZ).await;
        assert_eq!(
            answer.status, 503,
            "ready while the lock is held: {answer:?}"
        );
        let detail = answer.body["detail"].as_str().unwrap_or_default();
        waiting |= detail.contains("waiting for the migrations' lock");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(waiting, "/readyz said it waits for the lock");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&mut holder)
        .await
        .unwrap();
    assert_eq!(applied, 7, "nothing applied while the lock was held");
    sqlx::Connection::close(holder).await.unwrap();
    let (took, _) = until_ready(&app, Duration::from_secs(10)).await;
    eprintln!("ready {took:?} after the lock was released");
}

/// Each migration that reads or rewrites the reveal log, timed alone over
/// `UPGRADE_REVEALS` reveals (`benches/load/upgrade.sh` runs it).
#[tokio::test]
#[ignore = "a bench: benches/load/upgrade.sh"]
async fn each_migration_over_reveals_timed() {
    let n = reveals_n();
    let million = n as f64 / 1e6;
    let (_dir, url) = crate::support::sqlite_file("timed.db");
    {
        use sqlx::ConnectOptions as _;
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
        let mut conn = options
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .connect()
            .await
            .unwrap();
        let all = sqlx::migrate!("migrations/sqlite");
        migrator_until(&all, 5).run(&mut conn).await.unwrap();
        let series = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)";
        for sql in fill_sql(series) {
            sqlx::query(&sql).bind(n).execute(&mut conn).await.unwrap();
        }
        for version in 6..=all.iter().map(|m| m.version).max().unwrap() {
            let started = Instant::now();
            migrator_until(&all, version).run(&mut conn).await.unwrap();
            let took = started.elapsed().as_secs_f64();
            eprintln!(
                "sqlite {version:04}: {took:.1} s over {n} reveals, {:.1} s a million",
                took / million
            );
        }
    }
    let db = pg::or_skip!(pg::database().await);
    let mut conn = crate::support::pg_connection(&db.url).await;
    let all = sqlx::migrate!("migrations/postgres");
    migrator_until(&all, 6).run(&mut conn).await.unwrap();
    for sql in fill_sql("WITH n(i) AS (SELECT generate_series(1, $1::bigint))") {
        sqlx::query(&sql).bind(n).execute(&mut conn).await.unwrap();
    }
    for version in 7..=all.iter().map(|m| m.version).max().unwrap() {
        let started = Instant::now();
        migrator_until(&all, version).run(&mut conn).await.unwrap();
        let took = started.elapsed().as_secs_f64();
        eprintln!(
            "postgres {version:04}: {took:.1} s over {n} reveals, {:.1} s a million",
            took / million
        );
    }
}

/// The reveals (ad `i` reveal `i`) and their per-ad counts, at the first
/// release's columns, over the ids `n(i)` of `series`.
fn fill_sql(series: &str) -> [String; 2] {
    [
        format!(
            "{series} INSERT INTO reveals (at_us, viewer, user_id, ad_id, category_id, kind) \
             SELECT 1700000000000000 + i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'v-' || (i % 50) END, \
                    1 + i % 100, i, 5, 'real' FROM n"
        ),
        format!(
            "{series} INSERT INTO ad_reveal_counts (ad_id, kind, n) SELECT i, 'real', 1 FROM n"
        ),
    ]
}
