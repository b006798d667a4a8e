//! SQLite's way to a seller's reveals (migrations/sqlite/0009): one posting per
//! seller a flush, listing its reveals, which are not consecutive ids.
//!
//! A posting is one row of `reveal_seller_postings`: the seller, the newest
//! and oldest `at_us`, the id range, and its entries in a blob: for each,
//! newest first, the step down in `at_us` from the one before (from
//! `max_at_us` for the first) and the id less `first_id`, both LEB128. NULL is
//! a posting of one reveal, `(max_at_us, first_id)`.

use sqlx::SqliteConnection;

use super::buckets;
use super::inserts::{sqlite_chunks, sqlite_insert};
use super::{REVEAL_COLUMNS, RevealRow};
use crate::domain::{Reveal, RevealQuery};
use crate::store::pool::signed;

/// Postings a page looks up first, doubled while it is not settled (to [`MOST_POSTINGS`]).
const FIRST_POSTINGS: usize = 16;
const MOST_POSTINGS: usize = 1_024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Posting {
    pub user_id: i64,
    pub max_at_us: i64,
    pub min_at_us: i64,
    pub first_id: i64,
    pub last_id: i64,
    /// `None`: one reveal, `(max_at_us, first_id)`.
    pub entries: Option<Vec<u8>>,
}

/// The postings of a flush, in order of their last id (as retention prunes).
pub(super) fn postings_of(rows: &[(i64, &Reveal)]) -> Vec<Posting> {
    // One sort, then each seller's slice: no map and no list per seller.
    let mut keyed: Vec<(i64, i64, i64)> = rows
        .iter()
        .map(|&(id, r)| (signed(r.user.get()), r.at_us, id))
        .collect();
    keyed.sort_unstable();
    let mut postings: Vec<Posting> = keyed.chunk_by(|a, b| a.0 == b.0).map(posting).collect();
    postings.sort_unstable_by_key(|p| p.last_id);
    postings
}

/// One seller's posting: `entries` are `(user_id, at_us, id)`, oldest first, not empty.
fn posting(entries: &[(i64, i64, i64)]) -> Posting {
    let (user_id, min_at_us, _) = entries.first().copied().unwrap_or_default();
    let max_at_us = entries.last().map_or(0, |e| e.1);
    let first_id = entries.iter().map(|e| e.2).min().unwrap_or(0);
    let last_id = entries.iter().map(|e| e.2).max().unwrap_or(0);
    let packed = (entries.len() > 1).then(|| {
        let mut out = Vec::with_capacity(entries.len() * 4);
        let mut prev_at = max_at_us;
        for &(_, at, id) in entries.iter().rev() {
            // Both are >= 0: entries go newest first, ids are >= first_id.
            put_varint(&mut out, prev_at.abs_diff(at));
            put_varint(&mut out, id.abs_diff(first_id));
            prev_at = at;
        }
        out
    });
    Posting {
        user_id,
        max_at_us,
        min_at_us,
        first_id,
        last_id,
        entries: packed,
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        // Truncation wanted: the low seven bits, with the "more" bit set.
        #[allow(clippy::cast_possible_truncation)]
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)]
    out.push(v as u8);
}

fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        v |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The entries of a posting, newest first; a blob that does not decode ends the list.
fn entries(
    max_at_us: i64,
    first_id: i64,
    blob: Option<&[u8]>,
) -> impl Iterator<Item = (i64, i64)> + '_ {
    let mut single = blob.is_none().then_some((max_at_us, first_id));
    let mut bytes = blob.unwrap_or_default();
    let mut at = max_at_us;
    std::iter::from_fn(move || {
        if let Some(one) = single.take() {
            return Some(one);
        }
        if bytes.is_empty() {
            return None;
        }
        let step = i64::try_from(take_varint(&mut bytes)?).ok()?;
        let offset = i64::try_from(take_varint(&mut bytes)?).ok()?;
        at = at.checked_sub(step)?;
        Some((at, first_id.checked_add(offset)?))
    })
}

pub(super) async fn write(
    conn: &mut SqliteConnection,
    postings: &[Posting],
) -> Result<(), sqlx::Error> {
    for chunk in sqlite_chunks(postings, 6) {
        let sql = sqlite_insert(
            "INSERT OR FAIL INTO reveal_seller_postings \
             (user_id, max_at_us, min_at_us, first_id, last_id, entries)",
            6,
            chunk.len(),
            "",
        );
        let mut query = sqlx::query(&sql);
        for p in chunk {
            query = query
                .bind(p.user_id)
                .bind(p.max_at_us)
                .bind(p.min_at_us)
                .bind(p.first_id)
                .bind(p.last_id)
                .bind(p.entries.as_deref());
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// One page of `user_id`'s reveals, newest first, bucket by bucket until
/// settled. `conn` should hold a transaction: postings and rows of one commit.
pub(super) async fn read_page(
    conn: &mut SqliteConnection,
    user_id: i64,
    query: &RevealQuery,
) -> Result<Vec<RevealRow>, sqlx::Error> {
    let limit = usize::try_from(query.limit).unwrap_or(usize::MAX);
    if limit == 0 {
        return Ok(Vec::new());
    }
    let after = query.after.unwrap_or((i64::MAX, i64::MAX));
    // Retention deletes the lowest ids first: below the lowest left, nothing.
    let (low,): (i64,) = sqlx::query_as("SELECT coalesce(min(id), 0) FROM reveals")
        .fetch_one(&mut *conn)
        .await?;
    let keep = |&(at, id): &(i64, i64)| {
        id >= low && at >= query.since_us && at < query.until_us && (at, id) < after
    };
    let mut page: Vec<RevealRow> = Vec::new();
    let to_walk = buckets::to_walk(conn, buckets::Key::Seller(user_id), query, low).await?;
    for bucket in to_walk {
        if bucket.settles(page.last().map(|r| r.1), page.len() == limit) {
            break;
        }
        let window = Window {
            user_id,
            bucket: bucket.bucket,
            query,
            after_at: after.0,
            low,
        };
        walk_bucket(conn, &window, &keep, limit, &mut page).await?;
    }
    Ok(page)
}

/// Adds to `page` the rows of one bucket's postings that belong on it,
/// postings walked by their newest reveal, descending, until settled.
async fn walk_bucket(
    conn: &mut SqliteConnection,
    window: &Window<'_>,
    keep: &impl Fn(&(i64, i64)) -> bool,
    limit: usize,
    page: &mut Vec<RevealRow>,
) -> Result<(), sqlx::Error> {
    // The postings still to walk are those before `from` (newest, last id).
    let mut from = (i64::MAX, i64::MAX);
    let mut take = FIRST_POSTINGS;
    loop {
        let postings = postings_before(conn, window, from, take + 1).await?;
        for (i, posting) in postings.iter().enumerate().take(take) {
            let rows = rows_listed(conn, window.user_id, posting, keep, limit).await?;
            page.extend(rows);
            page.sort_unstable_by_key(|r: &RevealRow| std::cmp::Reverse((r.1, r.0)));
            // A reveal in two postings (never written so) shows once.
            page.dedup_by_key(|r| r.0);
            page.truncate(limit);
            // Settled once full and newer than the next posting, so than all left.
            match postings.get(i + 1) {
                None => return Ok(()),
                Some(next) if page.len() == limit && page[limit - 1].1 > next.max_at_us => {
                    return Ok(());
                }
                Some(_) => {}
            }
        }
        // `take` postings walked and one more to come.
        let Some(seen) = postings.get(take - 1) else {
            return Ok(());
        };
        from = (seen.max_at_us, seen.last_id);
        take = (take * 2).min(MOST_POSTINGS);
    }
}

/// What a page asks of the postings of one bucket.
struct Window<'a> {
    user_id: i64,
    bucket: i64,
    query: &'a RevealQuery,
    /// The cursor's `at_us` (`i64::MAX` without one).
    after_at: i64,
    low: i64,
}

#[derive(sqlx::FromRow)]
struct Listed {
    max_at_us: i64,
    last_id: i64,
    first_id: i64,
    id: i64,
}

/// Up to `n` postings before `from` (newest, last id) that can hold a row of
/// the page, newest first; from the index alone.
async fn postings_before(
    conn: &mut SqliteConnection,
    window: &Window<'_>,
    from: (i64, i64),
    n: usize,
) -> Result<Vec<Listed>, sqlx::Error> {
    let sql = format!(
        "SELECT max_at_us, last_id, first_id, id FROM reveal_seller_postings \
         WHERE {} = $9 AND user_id = $1 AND (max_at_us, last_id) < ($2, $3) \
         AND max_at_us >= $4 AND min_at_us < $5 AND min_at_us <= $6 AND last_id >= $7 \
         ORDER BY max_at_us DESC, last_id DESC LIMIT $8",
        buckets::OF_FIRST_ID
    );
    sqlx::query_as(&sql)
        .bind(window.user_id)
        .bind(from.0)
        .bind(from.1)
        .bind(window.query.since_us)
        .bind(window.query.until_us)
        .bind(window.after_at)
        .bind(window.low)
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .bind(window.bucket)
        .fetch_all(&mut *conn)
        .await
}

/// Up to `limit` rows of one posting that `keep` lets on the page, newest
/// first. Entries whose row is gone (taken behind a younger one after a clock
/// stepped back) are passed over, each entry looked at once.
async fn rows_listed(
    conn: &mut SqliteConnection,
    user_id: i64,
    posting: &Listed,
    keep: &impl Fn(&(i64, i64)) -> bool,
    limit: usize,
) -> Result<Vec<RevealRow>, sqlx::Error> {
    // One reveal (first_id == last_id) is the posting's key itself.
    let blob: Option<Vec<u8>> = if posting.first_id == posting.last_id {
        None
    } else {
        sqlx::query_as::<_, (Option<Vec<u8>>,)>(
            "SELECT entries FROM reveal_seller_postings WHERE id = $1",
        )
        .bind(posting.id)
        .fetch_one(&mut *conn)
        .await?
        .0
    };
    let mut listed = entries(posting.max_at_us, posting.first_id, blob.as_deref()).filter(keep);
    let mut found = Vec::new();
    while found.len() < limit {
        let want: Vec<(i64, i64)> = listed.by_ref().take(limit - found.len()).collect();
        if want.is_empty() {
            break;
        }
        found.extend(rows_of(&mut *conn, user_id, &want).await?);
    }
    Ok(found)
}

/// The rows of `listed` that are there as listed (not gone, no reused id).
async fn rows_of(
    conn: &mut SqliteConnection,
    user_id: i64,
    listed: &[(i64, i64)],
) -> Result<Vec<RevealRow>, sqlx::Error> {
    let mut rows: Vec<RevealRow> = Vec::with_capacity(listed.len());
    for chunk in sqlite_chunks(listed, 1) {
        let sql = format!(
            "SELECT {REVEAL_COLUMNS} FROM reveals WHERE user_id = ? AND id IN ({})",
            vec!["?"; chunk.len()].join(",")
        );
        let mut q = sqlx::query_as(&sql).persistent(false).bind(user_id);
        for &(_, id) in chunk {
            q = q.bind(id);
        }
        let found: Vec<RevealRow> = q.fetch_all(&mut *conn).await?;
        rows.extend(
            found
                .into_iter()
                .filter(|r| chunk.binary_search_by(|e| (r.1, r.0).cmp(e)).is_ok()),
        );
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{RevealsOf, UserId};
    use crate::store::reveals::tests::{exec, migrate_from, migrated_before, reveal_at as reveal};

    #[test]
    fn a_posting_lists_one_sellers_reveals_newest_first() {
        let batch = [
            reveal(5, 1, Some("a")),
            reveal(700, 2, Some("a")),
            reveal(9, 1, Some("b")),
            reveal(5, 1, None),
            reveal(300_000_000, 1, Some("c")),
        ];
        let rows: Vec<(i64, &Reveal)> = (10..).zip(&batch).collect();
        let postings = postings_of(&rows);
        // In order of their last id: seller 2's (11), then seller 1's (14).
        assert_eq!(postings.len(), 2);
        assert_eq!(
            postings[0],
            Posting {
                user_id: 2,
                max_at_us: 700,
                min_at_us: 700,
                first_id: 11,
                last_id: 11,
                entries: None
            }
        );
        let one = &postings[1];
        let (user, max, min) = (one.user_id, one.max_at_us, one.min_at_us);
        let got = (user, max, min, one.first_id, one.last_id);
        assert_eq!(got, (1, 300_000_000, 5, 10, 14));
        let listed: Vec<(i64, i64)> =
            entries(one.max_at_us, one.first_id, one.entries.as_deref()).collect();
        assert_eq!(listed, [(300_000_000, 14), (9, 12), (5, 13), (5, 10)]);
        let single: Vec<(i64, i64)> = entries(700, 11, None).collect();
        assert_eq!(single, [(700, 11)]);
        // A blob cut short ends the list; it does not panic.
        let blob = one.entries.as_deref().unwrap();
        let cut: Vec<(i64, i64)> = entries(one.max_at_us, one.first_id, Some(&blob[..3])).collect();
        assert!(cut.len() < 4);
    }

    /// 0009 on a log written before it: a posting per reveal, pages as before.
    #[tokio::test]
    async fn the_reveals_before_postings_get_one_each() {
        let (_dir, pool) = migrated_before(9).await;
        let log = "INSERT INTO reveals (id, at_us, viewer, user_id, ad_id, category_id, kind) VALUES \
             (1, 100, 'a', 7, 1, 1, 'real'), (2, 90, 'b', 8, 1, 1, 'real'), \
             (3, 100, NULL, 7, 2, 1, 'anonymous'), (4, 120, 'a', 7, 1, 1, 'real')";
        exec(&pool, log).await;
        migrate_from(&pool, 9).await;
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM reveal_seller_postings")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 4);
        let (indexes,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'reveals_user'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(indexes, 0);
        let mut conn = pool.acquire().await.unwrap();
        let query = |after| RevealQuery {
            after,
            ..RevealQuery::newest(RevealsOf::Seller(UserId::new(7).unwrap()), 2)
        };
        let first = read_page(&mut conn, 7, &query(None)).await.unwrap();
        assert_eq!(first.iter().map(|r| r.0).collect::<Vec<_>>(), [4, 3]);
        let rest = read_page(&mut conn, 7, &query(Some((100, 3))))
            .await
            .unwrap();
        assert_eq!(rest.iter().map(|r| r.0).collect::<Vec<_>>(), [1]);
    }
}
