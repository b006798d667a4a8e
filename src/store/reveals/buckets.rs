//! SQLite's runs and postings in buckets of reveal ids (migrations/sqlite/0011):
//! their indexes are keyed by `bucket` (`first_id >> SHIFT`, a virtual
//! column) before the viewer or the seller, and a page walks the buckets
//! newest first.
//!
//! Why: keyed by viewer or seller first, each flush's runs and postings
//! landed on the leaves of every viewer's and seller's range, one page of the
//! index dirtied per distinct seller over indexes that outgrow the writer's
//! cache, so the writer's cost a reveal grew with the log's age (tripled, and
//! its bytes five-fold, over four million reveals). Keyed by bucket first, a
//! flush's entries land in the newest bucket's part of each index, whose
//! pages stay in the cache: the writer's cost is that of a young file at any
//! age. The figures, with their commands: BENCHMARKS.md, "The reveal log's
//! SQLite layout as the file ages" and "Bucketed runs and postings".
//!
//! The price is on reads: a seller's or viewer's entries are a range per
//! bucket. A page first asks, in one statement, which buckets hold an entry
//! of its seller or viewer that can hold a row of the page, and the newest
//! such entry in each (a look into the index a bucket of the log: 16 at four
//! million reveals); then it walks those buckets newest first, each as the
//! whole index was walked before. It is settled once it is full and newer
//! than the newest entry of every bucket left, so it stays exact and newest
//! first whichever way the clock went across buckets.
//!
//! `reveal_buckets` keeps each bucket's span in time (no older and no newer
//! than any reveal of its runs and postings: each flush widens the span of
//! the buckets its ids fall in), so the buckets that cannot hold a row of a
//! page's window or of the rows after its cursor are not looked into.
//! Retention deletes a bucket's row with the last run and posting of it.

use sqlx::SqliteConnection;

use crate::domain::RevealQuery;

/// A bucket is `2^SHIFT` ids (262,144 reveals): about four seconds of the hit
/// path's maximum on one core, a flush of 30,000 reveals being at most in
/// two. The same shift as migrations/sqlite/0011's virtual columns.
pub(super) const SHIFT: u32 = 18;

/// The bucket of a reveal id.
pub(super) const fn of(id: i64) -> i64 {
    id >> SHIFT
}

/// Widens the span of the buckets of ids `first_id..=last_id` (a flush's) to
/// take in `min_at_us..=max_at_us` (its reveals' times), in the flush's
/// transaction.
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

/// Deletes the rows of buckets below every run and posting left, in
/// retention's transaction after its prunes. Both minimums are a look into
/// the indexes, whose first key is the bucket.
pub(super) async fn prune(conn: &mut SqliteConnection) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM reveal_buckets WHERE bucket < min(\
         coalesce((SELECT min(bucket) FROM reveal_seller_postings), 9223372036854775807), \
         coalesce((SELECT min(bucket) FROM reveal_viewer_runs), 9223372036854775807))",
    )
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// A bucket a page walks: its number, and the newest `max_at_us` of an entry
/// for the page in it or in any bucket after it in the walk (older ids).
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

/// Whose entries a page walks: a seller's postings or a viewer's runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Key<'a> {
    Seller(i64),
    Viewer(&'a str),
}

/// The buckets that hold an entry of `key` (a posting of the seller, a run of
/// the viewer) able to hold a row of the page:
/// reaching into the window, holding something no newer than the cursor, not
/// gone (`last_id >= low`). Newest bucket first, each with the newest
/// `max_at_us` of such an entry in it and after it (see [`ToWalk`]).
pub(super) async fn to_walk(
    conn: &mut SqliteConnection,
    key: Key<'_>,
    query: &RevealQuery,
    low: i64,
) -> Result<Vec<ToWalk>, sqlx::Error> {
    let (table, column) = match key {
        Key::Seller(_) => ("reveal_seller_postings", "user_id"),
        Key::Viewer(_) => ("reveal_viewer_runs", "viewer"),
    };
    let after_at = query.after.map_or(i64::MAX, |(at, _)| at);
    let sql = format!(
        "SELECT bucket, newest FROM (SELECT b.bucket AS bucket, \
         (SELECT e.max_at_us FROM {table} e WHERE e.bucket = b.bucket AND e.{column} = $1 \
         AND e.max_at_us >= $2 AND e.min_at_us < $3 AND e.min_at_us <= $4 AND e.last_id >= $5 \
         ORDER BY e.max_at_us DESC LIMIT 1) AS newest \
         FROM reveal_buckets b WHERE b.max_at_us >= $2 AND b.min_at_us < $3 AND b.min_at_us <= $4) \
         WHERE newest IS NOT NULL ORDER BY bucket DESC"
    );
    let found = sqlx::query_as::<_, (i64, i64)>(&sql);
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
        .await?;
    Ok(newest_left(&found))
}

/// `(bucket, newest)` newest bucket first, each with the newest of it and
/// every bucket after it.
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

    /// The bound a bucket carries is the newest of it and every older one, so
    /// a clock that stepped back across buckets keeps the walk going.
    #[test]
    fn a_bucket_carries_the_newest_entry_left() {
        let walk = newest_left(&[(9, 50), (8, 70), (7, 10)]);
        let left: Vec<(i64, i64)> = walk.iter().map(|w| (w.bucket, w.newest_left)).collect();
        assert_eq!(left, [(9, 70), (8, 70), (7, 10)]);
        assert!(!walk[0].settles(Some(60), true), "bucket 8 holds one at 70");
        assert!(walk[0].settles(Some(71), true));
        assert!(!walk[0].settles(Some(71), false), "a page not yet full");
        assert!(
            !walk[2].settles(Some(10), true),
            "a tie can still come before"
        );
        assert!(newest_left(&[]).is_empty());
    }

    #[test]
    fn a_bucket_is_2_to_the_18_ids() {
        assert_eq!(of(0), 0);
        assert_eq!(of((1 << 18) - 1), 0);
        assert_eq!(of(1 << 18), 1);
        assert_eq!(of(5 << 18 | 7), 5);
    }
}
