//! The reveal store's tests through its interface, on a scratch SQLite
//! database, and the helpers the tests of every file of the store share.

mod reasons;

use super::{RevealStore, counts_of};
use crate::domain::{
    AdId, CategoryId, Reveal, RevealQuery, RevealsOf, Source, StoredReveal, UserId, Viewer,
};
use crate::store::pool::{Backend, Bounds, Sqlite};

/// A reveal of seller 42's ad `ad` in category 9, at one fixed instant.
pub(super) fn reveal(ad: u64, kind: Source, viewer: Option<&str>) -> Reveal {
    Reveal {
        ad: AdId::new(ad).unwrap(),
        category: CategoryId::new(9).unwrap(),
        kind,
        ..reveal_at(1_700_000_000_000_000, 42, viewer)
    }
}

/// A reveal of `user`'s ad 1 in category 1 at `at_us`.
pub(super) fn reveal_at(at_us: i64, user: u64, viewer: Option<&str>) -> Reveal {
    Reveal {
        at_us,
        viewer: viewer.map(|v| Viewer::parse(v.as_bytes()).unwrap()),
        user: UserId::new(user).unwrap(),
        ad: AdId::new(1).unwrap(),
        category: CategoryId::new(1).unwrap(),
        kind: Source::RealPhone,
        reason: None,
    }
}

pub(super) struct Draws(u64);

impl Draws {
    pub(super) fn new(seed: u64) -> Self {
        Draws(seed)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// A SQLite file with the migrations before `version` applied.
pub(super) async fn migrated_before(version: i64) -> (tempfile::TempDir, sqlx::SqlitePool) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/old.db?mode=rwc", dir.path().display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    migrate(&pool, |v| v < version).await;
    (dir, pool)
}

/// The migrations whose version `which` takes, in order.
async fn migrate(pool: &sqlx::SqlitePool, which: impl Fn(i64) -> bool) {
    let migrations = sqlx::migrate!("migrations/sqlite");
    for migration in migrations.iter().filter(|m| which(m.version)) {
        exec(pool, &migration.sql).await;
    }
}

pub(super) async fn exec(pool: &sqlx::SqlitePool, sql: &str) {
    sqlx::raw_sql(sql).execute(pool).await.unwrap();
}

pub(super) fn migration(version: i64) -> String {
    let migrations = sqlx::migrate!("migrations/sqlite");
    let found = migrations.iter().find(|m| m.version == version);
    found.expect("that migration").sql.to_string()
}

/// Migration `version` and every later one.
pub(super) async fn migrate_from(pool: &sqlx::SqlitePool, version: i64) {
    migrate(pool, |v| v >= version).await;
}

/// A reveal store on a migrated SQLite file in a fresh directory.
pub(super) async fn scratch() -> (tempfile::TempDir, RevealStore) {
    let (dir, pool) = migrated_before(i64::MAX).await;
    (dir, store_on(pool))
}

pub(super) fn store_on(pool: sqlx::SqlitePool) -> RevealStore {
    let bounds = Bounds::default();
    RevealStore::of(Backend::Sqlite(Sqlite { pool, bounds }), None)
}

pub(super) fn seller(user: u64) -> RevealsOf {
    RevealsOf::Seller(UserId::new(user).unwrap())
}

pub(super) fn viewer(viewer: &str) -> RevealsOf {
    RevealsOf::Viewer(Viewer::parse(viewer.as_bytes()).unwrap())
}

/// Retention of the `n` lowest ids; how many it deleted.
async fn retain(store: &RevealStore, n: i64) -> u64 {
    let zero = std::time::Duration::ZERO;
    store.delete_reveals_older_than(zero, n).await.unwrap()
}

pub(super) fn sqlite(store: &RevealStore) -> &sqlx::SqlitePool {
    match &store.backend {
        Backend::Sqlite(sqlite) => &sqlite.pool,
        Backend::Postgres(_) => unreachable!("a SQLite store"),
    }
}

pub(super) async fn rows(store: &RevealStore, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table}");
    let (n,): (i64,) = sqlx::query_as(&sql).fetch_one(sqlite(store)).await.unwrap();
    n
}

pub(super) async fn delete_every_reveal(store: &RevealStore) {
    while retain(store, 4).await > 0 {}
}

/// `of`'s reveals in the window, newest first, by a scan of every row.
pub(super) async fn scan(store: &RevealStore, of: &RevealsOf, since: i64, until: i64) -> Vec<i64> {
    let column = match of {
        RevealsOf::Seller(_) => "user_id",
        RevealsOf::Viewer(_) => "viewer",
    };
    let sql = format!(
        "SELECT id FROM reveals NOT INDEXED WHERE {column} = ?1 AND at_us >= ?2 AND at_us < ?3 \
         ORDER BY at_us DESC, id DESC"
    );
    let query = sqlx::query_as::<_, (i64,)>(&sql);
    let query = match of {
        RevealsOf::Seller(user) => query.bind(i64::try_from(user.get()).unwrap()),
        RevealsOf::Viewer(viewer) => query.bind(viewer.as_str()),
    };
    query
        .bind(since)
        .bind(until)
        .fetch_all(sqlite(store))
        .await
        .unwrap()
        .into_iter()
        .map(|(id,)| id)
        .collect()
}

/// Forty flushes of twelve reveals at drawn times and viewers, overlapping in
/// time. With `buckets`, eight flushes a bucket, every other bucket older in
/// time than the one before it, the first flush of each crossing its edge.
pub(super) async fn write_overlapping_flushes(
    store: &RevealStore,
    seed: u64,
    buckets: bool,
    mut make: impl FnMut(i64, Option<&str>, &mut Draws) -> Reveal,
) {
    let mut draws = Draws::new(seed);
    let viewers = [Some("a"), Some("b"), Some("c"), None];
    for flush in 0..40i64 {
        let bucket = if buckets { flush / 8 } else { 0 };
        if flush % 8 == 0 && bucket > 0 {
            // Six ids before the edge: this flush's twelve cross it.
            next_id_at(store, (bucket << super::buckets::SHIFT) - 6).await;
        }
        let back = if bucket % 2 == 1 { 400 } else { 0 };
        let batch: Vec<Reveal> = (0..12)
            .map(|_| {
                let at = flush * 20 + i64::try_from(draws.below(20)).unwrap() * 10 - 100 - back;
                let viewer = viewers[usize::try_from(draws.below(4)).unwrap()];
                make(1_000_000 + at, viewer, &mut draws)
            })
            .collect();
        store.write_reveals(&batch).await.unwrap();
    }
}

/// Page walks of sellers 1 to 3 (each with more than 50 reveals) and 99 (none)
/// match [`scan`].
async fn sellers_match_scan(store: &RevealStore) {
    for user in [1u64, 2, 3, 99] {
        let all = walks_match_scan(store, &seller(user)).await;
        if user != 99 {
            assert!(all > 50, "seller {user}: too few to page through");
        }
    }
}

/// Page walks of viewers a, b, c and one with none match [`scan`].
async fn viewers_match_scan(store: &RevealStore) {
    for name in ["a", "b", "c", "nobody"] {
        walks_match_scan(store, &viewer(name)).await;
    }
}

/// Checks page walks of `of` in three windows and five page sizes against
/// [`scan`]; returns how many reveals it found.
pub(super) async fn walks_match_scan(store: &RevealStore, of: &RevealsOf) -> usize {
    let windows = [
        (i64::MIN, i64::MAX),
        (1_000_100, 1_000_400),
        (1_000_250, 1_000_260),
    ];
    let mut all = 0;
    for (since, until) in windows {
        let expected = scan(store, of, since, until).await;
        if since == i64::MIN {
            all = expected.len();
        }
        for limit in [1, 3, 7, 50, 1000] {
            let got = walk(store, of, since, until, limit).await;
            assert_eq!(got, expected, "{of:?} {since}..{until} by {limit}");
        }
    }
    all
}

/// `of`'s reveals in the window, page after page; a short page is the last.
pub(super) async fn walk(
    store: &RevealStore,
    of: &RevealsOf,
    since: i64,
    until: i64,
    limit: u32,
) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut after = None;
    let mut short = false;
    loop {
        let query = RevealQuery {
            of: of.clone(),
            since_us: since,
            until_us: until,
            after,
            limit,
        };
        let page = store.read_reveals(&query).await.unwrap();
        assert!(page.len() <= limit as usize);
        assert!(!short || page.is_empty(), "a short page was not the last");
        short = page.len() < limit as usize;
        let Some(last) = page.last() else {
            return ids;
        };
        after = Some((last.reveal.at_us, last.id));
        ids.extend(page.iter().map(|r| r.id));
    }
}

async fn every_page(store: &RevealStore, of: RevealsOf, limit: u32) -> Vec<StoredReveal> {
    let mut all: Vec<StoredReveal> = Vec::new();
    loop {
        let query = RevealQuery {
            after: all.last().map(|r| (r.reveal.at_us, r.id)),
            ..RevealQuery::newest(of.clone(), limit)
        };
        let page = store.read_reveals(&query).await.unwrap();
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// A flush written in viewer order, not in time order, still pages newest
/// first, by seller and by viewer, without a gap or a repeat.
#[tokio::test]
async fn a_flush_in_viewer_order_still_pages_newest_first() {
    let (_dir, store) = scratch().await;
    let viewers = [Some("c"), Some("b"), Some("a"), None];
    let batch: Vec<Reveal> = (0..12u64)
        .map(|n| Reveal {
            at_us: 1_700_000_000_000_000 + i64::try_from(n).unwrap(),
            ..reveal(100 + n, Source::RealPhone, viewers[(n % 4) as usize])
        })
        .collect();
    store.write_reveals(&batch).await.unwrap();
    let ads = |reveals: Vec<StoredReveal>| -> Vec<u64> {
        reveals.iter().map(|r| r.reveal.ad.get()).collect()
    };
    let by_seller = ads(every_page(&store, seller(42), 2).await);
    assert_eq!(by_seller, (100..112).rev().collect::<Vec<u64>>());
    let by_viewer = ads(every_page(&store, viewer("b"), 2).await);
    assert_eq!(by_viewer, [109, 105, 101]);
}

/// A flush of 10,000 reveals (six statements) writes and counts every row.
#[tokio::test]
async fn a_flush_of_many_chunks_writes_and_counts_every_reveal() {
    let (_dir, store) = scratch().await;
    let batch: Vec<Reveal> = (0..10_000u64)
        .map(|n| reveal(1 + n % 3, Source::RealPhone, Some("v")))
        .collect();
    store.write_reveals(&batch).await.unwrap();
    let mut total = 0;
    for ad in 1..=3 {
        let ad = AdId::new(ad).unwrap();
        total += store.ad_reveal_counts(ad).await.unwrap().total();
    }
    assert_eq!(total, 10_000);
    assert_eq!(every_page(&store, viewer("v"), 1000).await.len(), 10_000);
}

/// Pages through runs are a scan of every row, for every viewer, window and
/// page size, runs overlapping in time.
#[tokio::test]
async fn pages_through_runs_are_those_of_a_scan_of_every_row() {
    let (_dir, store) = scratch().await;
    write_overlapping_flushes(&store, 7, false, |at_us, v, _| reveal_at(at_us, 1, v)).await;
    assert_eq!(retain(&store, 150).await, 150);
    viewers_match_scan(&store).await;
}

/// Retention takes the runs whose reveals are all gone, and only those.
#[tokio::test]
async fn retention_deletes_the_runs_of_deleted_reveals() {
    let (_dir, store) = scratch().await;
    for _ in 0..3 {
        let batch = ["a", "a", "b", "c", "c", "c"].map(|v| reveal_at(1_000_000, 1, Some(v)));
        store.write_reveals(&batch).await.unwrap();
    }
    assert_eq!(rows(&store, "reveal_viewer_runs").await, 9);
    // Ids 1..=7: the first flush's runs (a, b, c) and the second's "a"
    // (ids 7 and 8) is cut, not gone.
    retain(&store, 7).await;
    assert_eq!(rows(&store, "reveal_viewer_runs").await, 6);
    delete_every_reveal(&store).await;
    assert_eq!(rows(&store, "reveal_viewer_runs").await, 0);
}

/// Pages through postings are a scan of every row, for every seller, window
/// and page size, postings overlapping in time.
#[tokio::test]
async fn pages_through_postings_are_those_of_a_scan_of_every_row() {
    let (_dir, store) = scratch().await;
    write_overlapping_flushes(&store, 11, false, three_sellers).await;
    assert_eq!(retain(&store, 150).await, 150);
    // Rows gone above the lowest id left, as after a clock stepped back.
    let gone = "DELETE FROM reveals WHERE id % 7 = 0 AND id > 300";
    exec(sqlite(&store), gone).await;
    sellers_match_scan(&store).await;
}

fn three_sellers(at_us: i64, viewer: Option<&str>, draws: &mut Draws) -> Reveal {
    reveal_at(at_us, 1 + draws.below(3), viewer)
}

/// Retention takes the postings whose reveals are all gone, and only those.
#[tokio::test]
async fn retention_deletes_the_postings_of_deleted_reveals() {
    let (_dir, store) = scratch().await;
    for _ in 0..3 {
        // Viewer order puts seller 1's reveals first and last: ids 1 and
        // 6 of the first flush, a posting that ends with it.
        let batch = [
            reveal_at(1_000_000, 1, Some("a")),
            reveal_at(1_000_000, 2, Some("b")),
            reveal_at(1_000_000, 3, Some("b")),
            reveal_at(1_000_000, 2, Some("c")),
            reveal_at(1_000_000, 3, Some("c")),
            reveal_at(1_000_000, 1, Some("d")),
        ];
        store.write_reveals(&batch).await.unwrap();
    }
    assert_eq!(rows(&store, "reveal_seller_postings").await, 9);
    // Ids 1..=5: seller 2's posting (2, 4) and 3's (3, 5) are gone, 1's
    // (1, 6) is cut, not gone.
    retain(&store, 5).await;
    assert_eq!(rows(&store, "reveal_seller_postings").await, 7);
    let query = RevealQuery::newest(seller(1), 100);
    let page = store.read_reveals(&query).await.unwrap();
    let ids: Vec<i64> = page.iter().map(|r| r.id).collect();
    assert_eq!(ids, [18, 13, 12, 7, 6]);
    delete_every_reveal(&store).await;
    assert_eq!(rows(&store, "reveal_seller_postings").await, 0);
}

/// After a log emptied faster than its postings were pruned, a posting naming
/// a row it does not hold (written by hand here) shows nothing of it.
#[tokio::test]
async fn a_posting_never_shows_a_row_it_does_not_hold() {
    let (_dir, store) = scratch().await;
    let batch: Vec<Reveal> = (0..3).map(|i| reveal_at(100 + i, 1, Some("a"))).collect();
    store.write_reveals(&batch).await.unwrap();
    let pool = sqlite(&store);
    exec(pool, "DELETE FROM reveals").await;
    let batch: Vec<Reveal> = (0..2).map(|i| reveal_at(50 + i, 1, Some("a"))).collect();
    store.write_reveals(&batch).await.unwrap();
    let page = |since_us, limit| {
        let query = RevealQuery {
            since_us,
            ..RevealQuery::newest(seller(1), limit)
        };
        let store = &store;
        async move { store.read_reveals(&query).await }
    };
    let ids = |page: Vec<crate::domain::StoredReveal>| {
        page.iter()
            .map(|r| (r.reveal.at_us, r.id))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(page(i64::MIN, 10).await.unwrap()), [(51, 5), (50, 4)]);
    // Stale postings: one naming row 4 (at 50) as at 70, one naming a row that
    // is not there. Neither shows, and a page is still full.
    let stale = "INSERT INTO reveal_seller_postings \
         (user_id, max_at_us, min_at_us, first_id, last_id, entries) \
         VALUES (1, 70, 70, 4, 4, NULL), (1, 998, 998, 9, 9, NULL)";
    exec(pool, stale).await;
    assert_eq!(ids(page(51, 10).await.unwrap()), [(51, 5)]);
    assert_eq!(ids(page(i64::MIN, 1).await.unwrap()), [(51, 5)]);
    assert_eq!(ids(page(i64::MIN, 10).await.unwrap()), [(51, 5), (50, 4)]);
}

#[test]
fn counts_are_one_row_per_ad_and_kind() {
    let batch = [
        reveal(1, Source::RealPhone, None),
        reveal(1, Source::RealPhone, None),
        reveal(2, Source::Anonymous, None),
        reveal(1, Source::Calltracking, None),
        reveal(1, Source::RealPhone, None),
    ];
    let counts = counts_of(&batch);
    assert_eq!(counts.len(), 3);
    assert!(counts.contains(&(AdId::new(1).unwrap(), Source::RealPhone, 3)));
    assert!(counts.contains(&(AdId::new(1).unwrap(), Source::Calltracking, 1)));
    assert!(counts.contains(&(AdId::new(2).unwrap(), Source::Anonymous, 1)));
}

/// Migration 0008 rebuilds the per-ad counts `WITHOUT ROWID`, every count kept.
#[tokio::test]
async fn the_counts_survive_their_rebuild_without_rowid() {
    let (_dir, pool) = migrated_before(8).await;
    let counts = "INSERT INTO ad_reveal_counts (ad_id, kind, n) \
         VALUES (7, 'real', 3), (7, 'anonymous', 1), (9, 'calltracking', 12)";
    exec(&pool, counts).await;
    exec(&pool, &migration(8)).await;
    let counts: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT ad_id, kind, n FROM ad_reveal_counts ORDER BY ad_id, kind")
            .fetch_all(&pool)
            .await
            .unwrap();
    let counts: Vec<_> = counts
        .iter()
        .map(|(a, k, n)| (*a, k.as_str(), *n))
        .collect();
    assert_eq!(
        counts,
        [(7, "anonymous", 1), (7, "real", 3), (9, "calltracking", 12)]
    );
    let rowid = sqlx::query("SELECT rowid FROM ad_reveal_counts")
        .fetch_all(&pool)
        .await;
    assert!(rowid.is_err(), "the table still has a rowid");
}

/// Puts the next flush's first id at `id`: a row in 1970 no page here asks for.
async fn next_id_at(store: &RevealStore, id: i64) {
    sqlx::query(
        "INSERT INTO reveals (id, at_us, viewer, user_id, ad_id, category_id, kind) \
         VALUES (?1, 1, NULL, 999, 1, 1, 'real')",
    )
    .bind(id - 1)
    .execute(sqlite(store))
    .await
    .unwrap();
}

/// Pages across five buckets are a scan of every row: every other bucket is
/// older in time than the one before it, so a page full in one bucket is not
/// settled before it has looked into the next.
#[tokio::test]
async fn pages_across_buckets_are_those_of_a_scan_of_every_row() {
    let (_dir, store) = scratch().await;
    write_overlapping_flushes(&store, 23, true, three_sellers).await;
    let pool = sqlite(&store);
    let buckets = |table: &'static str| async move {
        let sql = format!(
            "SELECT DISTINCT {} AS b FROM {table} ORDER BY b",
            super::buckets::OF_FIRST_ID
        );
        sqlx::query_as::<_, (i64,)>(&sql)
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .map(|(b,)| b)
            .collect::<Vec<_>>()
    };
    assert_eq!(buckets("reveal_seller_postings").await, [0, 1, 2, 3, 4]);
    assert_eq!(buckets("reveal_viewer_runs").await, [0, 1, 2, 3, 4]);
    assert_eq!(rows(&store, "reveal_buckets").await, 5);
    assert_eq!(retain(&store, 150).await, 150);
    sellers_match_scan(&store).await;
    viewers_match_scan(&store).await;
}

/// Retention takes a bucket's span with its last run and posting, not before.
#[tokio::test]
async fn retention_deletes_the_buckets_of_deleted_runs_and_postings() {
    let (_dir, store) = scratch().await;
    for bucket in 0..3 {
        if bucket > 0 {
            next_id_at(&store, bucket << super::buckets::SHIFT).await;
        }
        let batch = ["a", "b"].map(|v| reveal_at(1_000_000, 1, Some(v)));
        store.write_reveals(&batch).await.unwrap();
    }
    assert_eq!(rows(&store, "reveal_buckets").await, 3);
    // Ids 1 and 2 (bucket 0's two) and the row before bucket 1: bucket 0
    // is empty, bucket 1 is whole.
    retain(&store, 3).await;
    let left: Vec<(i64,)> = sqlx::query_as("SELECT bucket FROM reveal_buckets ORDER BY bucket")
        .fetch_all(sqlite(&store))
        .await
        .unwrap();
    assert_eq!(left, [(1,), (2,)]);
    delete_every_reveal(&store).await;
    assert_eq!(rows(&store, "reveal_buckets").await, 0);
}

/// 0011 on a log written before it: buckets and spans filled, pages as before.
#[tokio::test]
async fn the_runs_and_postings_before_buckets_get_theirs() {
    let (_dir, pool) = migrated_before(11).await;
    let edge = 1i64 << 18;
    let log = format!(
        "INSERT INTO reveals (id, at_us, viewer, user_id, ad_id, category_id, kind) VALUES \
         (1, 100, 'a', 7, 1, 1, 'real'), (2, 90, 'a', 7, 1, 1, 'real'), \
         ({edge}, 300, 'a', 7, 1, 1, 'real'); \
         INSERT INTO reveal_viewer_runs (viewer, max_at_us, min_at_us, first_id, last_id) \
         VALUES ('a', 100, 90, 1, 2), ('a', 300, 300, {edge}, {edge}); \
         INSERT INTO reveal_seller_postings \
         (user_id, max_at_us, min_at_us, first_id, last_id, entries) \
         VALUES (7, 100, 100, 1, 1, NULL), (7, 90, 90, 2, 2, NULL), \
         (7, 300, 300, {edge}, {edge}, NULL)"
    );
    exec(&pool, &log).await;
    migrate_from(&pool, 11).await;
    let spans: Vec<(i64, i64, i64)> =
        sqlx::query_as("SELECT bucket, min_at_us, max_at_us FROM reveal_buckets ORDER BY bucket")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(spans, [(0, 90, 100), (1, 300, 300)]);
    let store = store_on(pool);
    for of in [seller(7), viewer("a")] {
        assert_eq!(walk(&store, &of, i64::MIN, i64::MAX, 2).await, [edge, 1, 2]);
    }
}
