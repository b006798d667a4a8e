//! The budget store on PostgreSQL: each report one statement over arrays.

use super::{Expired, Spend, TotalRow, key, seconds};
use crate::store::error::StoreError;
use crate::store::pool::Pg;

/// How far back each exchange reads refusals others wrote: longer than an
/// interval and its call, so a refusal committed late is still read.
const RECENT_REFUSALS_S: f64 = 10.0;

pub(super) async fn report(pg: &Pg, spends: &[Spend]) -> Result<Vec<TotalRow>, StoreError> {
    let viewers: Vec<i64> = spends.iter().map(|s| key(s.viewer)).collect();
    let kinds: Vec<i16> = spends.iter().map(|s| i16::from(s.kind)).collect();
    let windows: Vec<i64> = spends.iter().map(|s| i64::from(s.window)).collect();
    let ns: Vec<i64> = spends.iter().map(|s| i64::from(s.n)).collect();
    let mut tx = pg.begin().await?;
    // The window before by the primary key's (viewer, kind) prefix: `+ 0` keeps
    // the planner off the (kind, window_id) index, which it takes for a window
    // past its statistics and which scans the whole window for each row.
    let rows: Vec<TotalRow> = sqlx::query_as(
        "WITH up AS ( \
           INSERT INTO viewer_budgets (viewer, kind, window_id, spent) \
           SELECT * FROM UNNEST($1::int8[], $2::int2[], $3::int8[], $4::int8[]) \
           ON CONFLICT (viewer, kind, window_id) \
           DO UPDATE SET spent = viewer_budgets.spent + excluded.spent \
           RETURNING viewer, kind, window_id, spent) \
         SELECT up.viewer, up.kind, up.window_id, up.spent, \
           COALESCE((SELECT b.spent FROM viewer_budgets b \
             WHERE b.viewer = up.viewer AND b.kind = up.kind \
               AND b.window_id + 0 = up.window_id - 1), 0) \
         FROM up",
    )
    .persistent(false)
    .bind(&viewers)
    .bind(&kinds)
    .bind(&windows)
    .bind(&ns)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows)
}

pub(super) async fn refuse(pg: &Pg, refusals: &[(u64, u64)]) -> Result<(), StoreError> {
    let viewers: Vec<i64> = refusals.iter().map(|r| key(r.0)).collect();
    let untils: Vec<i64> = refusals.iter().map(|r| seconds(r.1)).collect();
    let mut tx = pg.begin().await?;
    sqlx::query(
        "INSERT INTO viewer_refusals (viewer, until_s) \
         SELECT * FROM UNNEST($1::int8[], $2::int8[]) \
         ON CONFLICT (viewer) DO UPDATE \
         SET until_s = GREATEST(viewer_refusals.until_s, excluded.until_s), \
             at = clock_timestamp()",
    )
    .persistent(false)
    .bind(&viewers)
    .bind(&untils)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Refusals in force at `now_s`: every one, or (not `all`) the recent ones.
pub(super) async fn refusals(
    pg: &Pg,
    all: bool,
    now_s: u64,
) -> Result<Vec<(i64, i64)>, StoreError> {
    let sql = if all {
        "SELECT viewer, until_s FROM viewer_refusals WHERE until_s > $1"
    } else {
        "SELECT viewer, until_s FROM viewer_refusals \
         WHERE at > clock_timestamp() - make_interval(secs => $2) AND until_s > $1"
    };
    let mut tx = pg.begin().await?;
    let query = sqlx::query_as(sql).persistent(false).bind(seconds(now_s));
    let query = if all {
        query
    } else {
        query.bind(RECENT_REFUSALS_S)
    };
    let rows = query.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows)
}

pub(super) async fn replicas(pg: &Pg, replica: u64, within_s: u32) -> Result<i64, StoreError> {
    let mut tx = pg.begin().await?;
    sqlx::query(
        "INSERT INTO budget_replicas (replica, seen_at) VALUES ($1, clock_timestamp()) \
         ON CONFLICT (replica) DO UPDATE SET seen_at = excluded.seen_at",
    )
    .persistent(false)
    .bind(key(replica))
    .execute(&mut *tx)
    .await?;
    let others: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM budget_replicas \
         WHERE replica <> $1 AND seen_at > clock_timestamp() - make_interval(secs => $2)",
    )
    .persistent(false)
    .bind(key(replica))
    .bind(f64::from(within_s))
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(others)
}

/// One batch of retention; then the replicas not seen for an hour.
pub(super) async fn prune(
    pg: &Pg,
    expired: &[Expired],
    batch: i64,
) -> Result<(Vec<u64>, u64), StoreError> {
    let mut tx = pg.begin().await?;
    let mut deleted = Vec::with_capacity(expired.len());
    for step in expired {
        let query = match *step {
            Expired::Windows { kind, before } => sqlx::query(
                "DELETE FROM viewer_budgets WHERE ctid = ANY (ARRAY(SELECT ctid FROM viewer_budgets \
                 WHERE kind = $1 AND window_id < $2 LIMIT $3))",
            )
            .bind(kind)
            .bind(before),
            Expired::Refusals { before_s } => sqlx::query(
                "DELETE FROM viewer_refusals WHERE ctid = ANY (ARRAY(SELECT ctid FROM viewer_refusals \
                 WHERE until_s < $1 LIMIT $2))",
            )
            .bind(before_s),
        };
        let done = query
            .bind(batch)
            .persistent(false)
            .execute(&mut *tx)
            .await?;
        deleted.push(done.rows_affected());
    }
    let replicas =
        sqlx::query("DELETE FROM budget_replicas WHERE seen_at < now() - interval '1 hour'")
            .persistent(false)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    tx.commit().await?;
    Ok((deleted, replicas))
}
