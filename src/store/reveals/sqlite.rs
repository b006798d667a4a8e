//! The reveal log on SQLite: a flush is written on the log's own writer with
//! ids it assigns, in viewer order, and indexed by runs and postings.

use sqlx::{SqliteConnection, SqlitePool};

use super::inserts::{sqlite_chunks, sqlite_insert};
use super::{RevealRow, reason_column};
use super::{buckets, seller_postings, viewer_runs};
use crate::domain::{AdId, Reveal, RevealQuery, RevealsOf, Source, Viewer};
use crate::store::error::StoreError;
use crate::store::pool::{SQLITE_BEGIN_WRITE, signed};

pub(super) async fn write(
    writer: &SqlitePool,
    reveals: &[Reveal],
    counts: &[(AdId, Source, u64)],
) -> Result<(), StoreError> {
    // Sorted before the transaction: it takes the file's write lock, which
    // status writes wait for.
    let ordered = in_viewer_order(reveals);
    let at = reveals.iter().map(|r| r.at_us);
    let span = (at.clone().min().unwrap_or(0), at.max().unwrap_or(0));
    let mut tx = writer.begin_with(SQLITE_BEGIN_WRITE).await?;
    let first_id = next_id(&mut tx).await?;
    let by_viewer: Vec<(i64, &Reveal)> = (first_id..).zip(ordered).collect();
    insert_reveals(&mut tx, &by_viewer).await?;
    viewer_runs::write(&mut tx, &viewer_runs::runs_of(&by_viewer)).await?;
    seller_postings::write(&mut tx, &seller_postings::postings_of(&by_viewer)).await?;
    let last_id = by_viewer.last().map_or(first_id, |&(id, _)| id);
    buckets::widen(&mut tx, (first_id, last_id), span).await?;
    add_counts(&mut tx, counts).await?;
    tx.commit().await?;
    Ok(())
}

/// The id a flush's first reveal gets: the next after the largest a reveal,
/// a run or a posting holds, so that no id is reused while a run or posting
/// not yet pruned names it. Runs and postings go in id order.
async fn next_id(tx: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    let (first_id,): (i64,) = sqlx::query_as(
        "SELECT max(\
         coalesce((SELECT max(id) FROM reveals), 0), \
         coalesce((SELECT last_id FROM reveal_viewer_runs ORDER BY id DESC LIMIT 1), 0), \
         coalesce((SELECT last_id FROM reveal_seller_postings ORDER BY id DESC LIMIT 1), 0)\
         ) + 1",
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(first_id)
}

/// Inserts the rows of a flush under their ids. `OR FAIL`, so SQLite keeps no
/// statement journal: the transaction is what is atomic, rolled back whole.
async fn insert_reveals(
    tx: &mut SqliteConnection,
    by_viewer: &[(i64, &Reveal)],
) -> Result<(), sqlx::Error> {
    for chunk in sqlite_chunks(by_viewer, 8) {
        let sql = sqlite_insert(
            "INSERT OR FAIL INTO reveals \
             (id, at_us, viewer, user_id, ad_id, category_id, kind, reason)",
            8,
            chunk.len(),
            "",
        );
        let mut query = sqlx::query(&sql);
        for &(id, r) in chunk {
            query = query
                .bind(id)
                .bind(r.at_us)
                .bind(r.viewer.as_ref().map(Viewer::as_str))
                .bind(signed(r.user.get()))
                .bind(signed(r.ad.get()))
                .bind(signed(r.category.get()))
                .bind(r.kind.as_str())
                .bind(reason_column(r));
        }
        query.execute(&mut *tx).await?;
    }
    Ok(())
}

async fn add_counts(
    tx: &mut SqliteConnection,
    counts: &[(AdId, Source, u64)],
) -> Result<(), sqlx::Error> {
    for chunk in sqlite_chunks(counts, 3) {
        let sql = sqlite_insert(
            "INSERT OR FAIL INTO ad_reveal_counts (ad_id, kind, n)",
            3,
            chunk.len(),
            " ON CONFLICT (ad_id, kind) DO UPDATE SET n = ad_reveal_counts.n + excluded.n",
        );
        let mut query = sqlx::query(&sql);
        for (ad, kind, n) in chunk {
            query = query
                .bind(signed(ad.get()))
                .bind(kind.as_str())
                .bind(signed(*n));
        }
        query.execute(&mut *tx).await?;
    }
    Ok(())
}

pub(super) async fn read(
    pool: &SqlitePool,
    query: &RevealQuery,
) -> Result<Vec<RevealRow>, StoreError> {
    // One snapshot: runs or postings and their rows as of one commit.
    let mut tx = pool.begin().await?;
    let rows = match &query.of {
        RevealsOf::Viewer(viewer) => {
            viewer_runs::read_page(&mut tx, viewer.as_str(), query).await?
        }
        RevealsOf::Seller(user) => {
            seller_postings::read_page(&mut tx, signed(user.get()), query).await?
        }
    };
    tx.commit().await?;
    Ok(rows)
}

/// Deletes up to `batch` of the lowest ids, of them those older than
/// `keep_us` by SQLite's clock, on `writer`; returns how many. Ids grow with
/// time, so no index on at_us is kept. A row behind a younger one (a clock
/// stepped back) goes once that one does: late, never early. Julian days to
/// microseconds since the epoch (2440587.5 is 1970-01-01).
pub(super) async fn delete_older_than(
    writer: &SqlitePool,
    keep_us: i64,
    batch: i64,
) -> Result<u64, StoreError> {
    let mut tx = writer.begin_with(SQLITE_BEGIN_WRITE).await?;
    let deleted = sqlx::query(
        "DELETE FROM reveals WHERE id IN \
         (SELECT id FROM reveals ORDER BY id LIMIT ?2) \
         AND at_us < CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) - ?1",
    )
    .bind(keep_us)
    .bind(batch)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    prune_dead(&mut tx, "reveal_viewer_runs", batch).await?;
    prune_dead(&mut tx, "reveal_seller_postings", batch).await?;
    buckets::prune(&mut tx).await?;
    tx.commit().await?;
    Ok(deleted)
}

/// Deletes up to `batch` of the oldest rows of `table` whose reveals are all
/// gone; in order of their last id, so one batch keeps up with retention.
async fn prune_dead(
    conn: &mut sqlx::SqliteConnection,
    table: &'static str,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let sql = format!(
        "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT ?1) \
         AND last_id < coalesce((SELECT min(id) FROM reveals), 9223372036854775807)"
    );
    Ok(sqlx::query(&sql)
        .bind(batch)
        .execute(&mut *conn)
        .await?
        .rows_affected())
}

/// The batch by viewer (those without one first), then seller and time, so
/// each viewer's reveals of a flush are one run of ids.
pub(super) fn in_viewer_order(reveals: &[Reveal]) -> Vec<&Reveal> {
    // Each viewer's rank (0: none), so that the sort compares integers, not ids.
    let mut ranks: foldhash::HashMap<&str, usize> = foldhash::HashMap::default();
    for reveal in reveals {
        if let Some(viewer) = &reveal.viewer {
            ranks.entry(viewer.as_str()).or_default();
        }
    }
    let mut viewers: Vec<&str> = ranks.keys().copied().collect();
    viewers.sort_unstable();
    for (rank, viewer) in viewers.into_iter().enumerate() {
        ranks.insert(viewer, rank + 1);
    }
    let mut keyed: Vec<(usize, u64, i64, &Reveal)> = reveals
        .iter()
        .map(|r| {
            let viewer = r
                .viewer
                .as_ref()
                .map_or(0, |v| ranks.get(v.as_str()).copied().unwrap_or(0));
            (viewer, r.user.get(), r.at_us, r)
        })
        .collect();
    // Within a viewer, by seller and time: the postings' sort then meets its
    // input nearly in order. Nothing reads ids as arrival order.
    keyed.sort_unstable_by_key(|&(viewer, user, at_us, _)| (viewer, user, at_us));
    keyed.into_iter().map(|(.., r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::UserId;
    use crate::store::reveals::tests::reveal;

    /// Viewers in order, those without one first, then by seller and time.
    #[test]
    fn a_flush_is_grouped_by_viewer_then_seller_and_time() {
        let at = |r: &Reveal, n: i64, user: u64| Reveal {
            at_us: r.at_us + n,
            user: UserId::new(user).unwrap(),
            ..r.clone()
        };
        let b = reveal(1, Source::RealPhone, Some("b"));
        let a = reveal(1, Source::RealPhone, Some("a"));
        let none = reveal(1, Source::RealPhone, None);
        #[rustfmt::skip]
        let batch = [
            at(&b, 5, 7), at(&a, 4, 9), at(&none, 3, 8),
            at(&b, 2, 6), at(&a, 1, 9), at(&b, 0, 7),
        ];
        let order: Vec<(Option<&str>, u64, i64)> = in_viewer_order(&batch)
            .into_iter()
            .map(|r| {
                let viewer = r.viewer.as_ref().map(Viewer::as_str);
                (viewer, r.user.get(), r.at_us - none.at_us)
            })
            .collect();
        #[rustfmt::skip]
        let want = [
            (None, 8, 3), (Some("a"), 9, 1), (Some("a"), 9, 4),
            (Some("b"), 6, 2), (Some("b"), 7, 0), (Some("b"), 7, 5),
        ];
        assert_eq!(order, want);
    }
}
