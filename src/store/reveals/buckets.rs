//! SQLite's runs and postings in buckets of reveal ids (migrations/sqlite/0011),
//! so a flush's entries land in the newest part of each index (docs/reveal-log.md,
//! "How it is written"). A page walks the buckets newest first ([`ToWalk::settles`]).

use sqlx::SqliteConnection;

use crate::domain::RevealQuery;

/// A bucket is `2^SHIFT` ids (262,144 reveals), as in [`OF_FIRST_ID`].
pub(super) const SHIFT: u32 = 18;

/// A run's or posting's bucket in SQL, as migrations/sqlite/0011 indexes it:
/// a query must name it so for SQLite to use that index (on an expression).
pub(super) const OF_FIRST_ID: &str = "(first_id >> 18)";

pub(super) const fn of(id: i64) -> i64 {
    id >> SHIFT
}

/// Widens the span in time of a flush's buckets, in its transaction.
pub(super) async fn widen(
    conn: &mut SqliteConnection,
    (first_id, last_id): (i64, i64),
    (min_at_us, max_at_us): (i64, i64),
) -> Result<(), sqlx::Error> {
    for bucket in of(first_id)..=of(last_id) {
        sqlx::query(
            "INSERT INTO reveal_buckets (bucket, min_at_us, max_at_us) VALUES ($1, $2, $3) \
             ON CONFLICT (bucket) DO UPDATE SET \
             min_at_us = min(min_at_us, excluded.min_at_us), \
             max_at_us = max(max_at_us, excluded.max_at_us)",
        )
        .bind(bucket)
        .bind(min_at_us)
        .bind(max_at_us)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Deletes the buckets below every run and posting left (in retention).
pub(super) async fn prune(conn: &mut SqliteConnection) -> Result<u64, sqlx::Error> {
    let sql = prune_sql();
    Ok(sqlx::query(&sql).execute(&mut *conn).await?.rows_affected())
}

fn prune_sql() -> String {
    format!(
        "DELETE FROM reveal_buckets WHERE bucket < min(\
         coalesce((SELECT min({OF_FIRST_ID}) FROM reveal_seller_postings), 9223372036854775807), \
         coalesce((SELECT min({OF_FIRST_ID}) FROM reveal_viewer_runs), 9223372036854775807))"
    )
}

/// A bucket a page walks, and the newest `max_at_us` of an entry for the page
/// in it or any bucket after it (older ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ToWalk {
    pub bucket: i64,
    pub newest_left: i64,
}

impl ToWalk {
    /// Whether a page (newest first, of `limit` rows at most) is settled before
    /// this bucket: full, and its oldest row newer than every entry left.
    pub(super) fn settles(&self, page_oldest: Option<i64>, full: bool) -> bool {
        full && page_oldest.is_some_and(|at| at > self.newest_left)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Key<'a> {
    Seller(i64),
    Viewer(&'a str),
}

/// The buckets holding an entry of `key` for the page, newest first.
pub(super) async fn to_walk(
    conn: &mut SqliteConnection,
    key: Key<'_>,
    query: &RevealQuery,
    low: i64,
) -> Result<Vec<ToWalk>, sqlx::Error> {
    let after_at = query.after.map_or(i64::MAX, |(at, _)| at);
    let sql = to_walk_sql(key);
    let found = sqlx::query_as::<_, (i64, Option<i64>)>(&sql);
    let found = match key {
        Key::Seller(user_id) => found.bind(user_id),
        Key::Viewer(viewer) => found.bind(viewer),
    };
    let found: Vec<(i64, i64)> = found
        .bind(query.since_us)
        .bind(query.until_us)
        .bind(after_at)
        .bind(low)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .filter_map(|(bucket, newest)| Some((bucket, newest?)))
        .collect();
    Ok(newest_left(&found))
}

/// [`to_walk`]'s statement; a bucket with no entry for the page is dropped by
/// the caller (an outer query would look into the index twice). The bucket is
/// compared as `b.bucket + 0`: an index on an expression has no affinity, and
/// a comparison with an INTEGER column takes that column's, so SQLite would
/// scan the whole table for every bucket.
fn to_walk_sql(key: Key<'_>) -> String {
    let (table, column) = match key {
        Key::Seller(_) => ("reveal_seller_postings", "user_id"),
        Key::Viewer(_) => ("reveal_viewer_runs", "viewer"),
    };
    format!(
        "SELECT b.bucket, (SELECT max_at_us FROM {table} \
         WHERE {OF_FIRST_ID} = b.bucket + 0 AND {column} = $1 \
         AND max_at_us >= $2 AND min_at_us < $3 AND min_at_us <= $4 AND last_id >= $5 \
         ORDER BY max_at_us DESC LIMIT 1) \
         FROM reveal_buckets b WHERE b.max_at_us >= $2 AND b.min_at_us < $3 AND b.min_at_us <= $4 \
         ORDER BY b.bucket DESC"
    )
}

fn newest_left(found: &[(i64, i64)]) -> Vec<ToWalk> {
    let mut walk: Vec<ToWalk> = Vec::with_capacity(found.len());
    let mut newest = i64::MIN;
    for &(bucket, at) in found.iter().rev() {
        newest = newest.max(at);
        walk.push(ToWalk {
            bucket,
            newest_left: newest,
        });
    }
    walk.reverse();
    walk
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bucket carries the newest of it and every older one, so a clock that
    /// stepped back across buckets keeps the walk going.
    #[test]
    fn a_bucket_carries_the_newest_entry_left() {
        let walk = newest_left(&[(9, 50), (8, 70), (7, 10)]);
        let left: Vec<(i64, i64)> = walk.iter().map(|w| (w.bucket, w.newest_left)).collect();
        assert_eq!(left, [(9, 70), (8, 70), (7, 10)]);
        assert!(!walk[0].settles(Some(60), true), "bucket 8 holds one at 70");
        assert!(walk[0].settles(Some(71), true));
        assert!(!walk[0].settles(Some(71), false), "a page not yet full");
        let tie = "a tie can still come before";
        assert!(!walk[2].settles(Some(10), true), "{tie}");
        assert!(newest_left(&[]).is_empty());
    }

    async fn plan(pool: &sqlx::SqlitePool, sql: &str) -> Vec<String> {
        let explain = format!("EXPLAIN QUERY PLAN {sql}");
        let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
        if explain.contains("$1") {
            query = query.bind("a").bind(1).bind(2).bind(3).bind(4);
        }
        let steps = query.fetch_all(pool).await.unwrap();
        steps.into_iter().map(|(.., detail)| detail).collect()
    }

    /// A page's look into each bucket and retention's minimums read only the
    /// bucketed indexes: no scan (the affinity trap, see [`to_walk_sql`]).
    #[tokio::test]
    async fn the_bucket_statements_read_only_the_bucketed_indexes() {
        let (_dir, store) = super::super::tests::scratch().await;
        let pool = super::super::tests::sqlite(&store);
        let [seller, viewer] = [Key::Seller(1), Key::Viewer("a")].map(to_walk_sql);
        for sql in [seller, viewer, prune_sql()] {
            let steps = plan(pool, &sql).await;
            let entries: Vec<&String> = steps
                .iter()
                .filter(|s| {
                    s.contains("reveal_viewer_runs") || s.contains("reveal_seller_postings")
                })
                .collect();
            assert!(!entries.is_empty(), "{sql}: {steps:?}");
            assert!(
                entries.iter().all(|s| s.starts_with("SEARCH ")
                    && (s.contains("COVERING INDEX reveal_viewer_runs_bucket_viewer")
                        || s.contains("COVERING INDEX reveal_seller_postings_bucket_user"))),
                "{sql}: {steps:?}"
            );
            let sorts = steps.iter().any(|s| s.contains("TEMP B-TREE"));
            assert!(!sorts, "{sql}: {steps:?}");
        }
    }

    #[test]
    fn a_bucket_is_2_to_the_18_ids() {
        assert_eq!(of(0), 0);
        assert_eq!(of((1 << 18) - 1), 0);
        assert_eq!(of(1 << 18), 1);
        assert_eq!(of(5 << 18 | 7), 5);
    }
}
