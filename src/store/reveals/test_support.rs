//! What the SQLite store's tests share: the pool behind a store, a table's row
//! count, retention until the log is empty, a page walk as the admin route's
//! cursor makes it, the same reveals by a plain scan, and a database migrated
//! up to a version.

use super::{Backend, RevealStore};
use crate::domain::{RevealQuery, RevealsOf};

pub(super) fn sqlite(store: &RevealStore) -> &sqlx::SqlitePool {
    match &store.backend {
        Backend::Sqlite(pool) => pool,
        Backend::Postgres(_) => unreachable!("a SQLite store"),
    }
}

/// How many rows `table` holds.
pub(super) async fn rows(store: &RevealStore, table: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table}");
    let (n,): (i64,) = sqlx::query_as(&sql).fetch_one(sqlite(store)).await.unwrap();
    n
}

/// Retention with no age limit, in batches of 4, until the log is empty.
pub(super) async fn delete_every_reveal(store: &RevealStore) {
    while store
        .delete_reveals_older_than(std::time::Duration::ZERO, 4)
        .await
        .unwrap()
        > 0
    {}
}

/// Ids of `of`'s reveals in the window, newest first, by a scan of every row.
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

/// Ids of `of`'s reveals in the window, page after page. A page short of
/// `limit` must be the last: the API ends the walk there.
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
        let page = store
            .read_reveals(&RevealQuery {
                of: of.clone(),
                since_us: since,
                until_us: until,
                after,
                limit,
            })
            .await
            .unwrap();
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

/// A SQLite file with the migrations before `version` applied, as a replica
/// of that time left it, for a test of migration `version` itself.
pub(super) async fn migrated_before(version: i64) -> (tempfile::TempDir, sqlx::SqlitePool) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/old.db?mode=rwc", dir.path().display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    for migration in sqlx::migrate!("migrations/sqlite")
        .iter()
        .filter(|m| m.version < version)
    {
        sqlx::raw_sql(&migration.sql).execute(&pool).await.unwrap();
    }
    (dir, pool)
}

/// Migration `version`'s SQL, to run on a file from [`migrated_before`].
pub(super) fn migration(version: i64) -> String {
    let migrations = sqlx::migrate!("migrations/sqlite");
    let found = migrations.iter().find(|m| m.version == version);
    found.expect("that migration").sql.to_string()
}
