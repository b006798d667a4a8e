//! The budget store on SQLite, one replica: no window before, no other replica.

use sqlx::{QueryBuilder, Sqlite, SqlitePool};

use super::{Expired, Spend, TotalRow, key, seconds};
use crate::store::error::StoreError;
use crate::store::pool::SQLITE_BEGIN_WRITE;

/// Four parameters a row, under SQLite's limit of 32,766 per statement.
const ROWS_PER_INSERT: usize = 8_000;

pub(super) async fn report(
    pool: &SqlitePool,
    spends: &[Spend],
) -> Result<Vec<TotalRow>, StoreError> {
    let mut tx = pool.begin_with(SQLITE_BEGIN_WRITE).await?;
    let mut totals = Vec::with_capacity(spends.len());
    for chunk in spends.chunks(ROWS_PER_INSERT) {
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO viewer_budgets (viewer, kind, window_id, spent) ",
        );
        query.push_values(chunk, |mut b, s| {
            b.push_bind(key(s.viewer))
                .push_bind(i64::from(s.kind))
                .push_bind(i64::from(s.window))
                .push_bind(i64::from(s.n));
        });
        query.push(
            " ON CONFLICT (viewer, kind, window_id) \
             DO UPDATE SET spent = viewer_budgets.spent + excluded.spent \
             RETURNING viewer, kind, window_id, spent, 0",
        );
        let rows: Vec<TotalRow> = query.build_query_as().fetch_all(&mut *tx).await?;
        totals.extend(rows);
    }
    tx.commit().await?;
    Ok(totals)
}

pub(super) async fn refuse(pool: &SqlitePool, refusals: &[(u64, u64)]) -> Result<(), StoreError> {
    let mut tx = pool.begin_with(SQLITE_BEGIN_WRITE).await?;
    for chunk in refusals.chunks(ROWS_PER_INSERT) {
        let mut query =
            QueryBuilder::<Sqlite>::new("INSERT INTO viewer_refusals (viewer, until_s) ");
        query.push_values(chunk, |mut b, r| {
            b.push_bind(key(r.0)).push_bind(seconds(r.1));
        });
        query.push(
            " ON CONFLICT (viewer) DO UPDATE \
             SET until_s = MAX(viewer_refusals.until_s, excluded.until_s)",
        );
        query.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

pub(super) async fn refusals(pool: &SqlitePool, now_s: u64) -> Result<Vec<(i64, i64)>, StoreError> {
    Ok(
        sqlx::query_as("SELECT viewer, until_s FROM viewer_refusals WHERE until_s > $1")
            .bind(seconds(now_s))
            .fetch_all(pool)
            .await?,
    )
}

pub(super) async fn prune(
    pool: &SqlitePool,
    expired: &[Expired],
    batch: i64,
) -> Result<Vec<u64>, StoreError> {
    let mut tx = pool.begin_with(SQLITE_BEGIN_WRITE).await?;
    let mut deleted = Vec::with_capacity(expired.len());
    for step in expired {
        let query = match *step {
            Expired::Windows { kind, before } => sqlx::query(
                "DELETE FROM viewer_budgets WHERE (viewer, kind, window_id) IN \
                 (SELECT viewer, kind, window_id FROM viewer_budgets \
                  WHERE kind = $1 AND window_id < $2 LIMIT $3)",
            )
            .bind(i64::from(kind))
            .bind(before),
            Expired::Refusals { before_s } => sqlx::query(
                "DELETE FROM viewer_refusals WHERE viewer IN (SELECT viewer FROM viewer_refusals \
                 WHERE until_s < $1 LIMIT $2)",
            )
            .bind(before_s),
        };
        deleted.push(query.bind(batch).execute(&mut *tx).await?.rows_affected());
    }
    tx.commit().await?;
    Ok(deleted)
}
