//! Feed leadership on PostgreSQL: the lease row's SQL.

use std::time::Duration;

use crate::store::error::StoreError;
use crate::store::pool::Pg;

/// The feed's row in the `leases` table (migration 0006 creates it, expired).
const FEED_LEASE: &str = "status_feed";

/// Takes the lease if it is expired or already `holder`'s: the new epoch.
pub(super) async fn take(pg: &Pg, holder: &str, ttl: Duration) -> Result<Option<i64>, StoreError> {
    let mut tx = pg.begin_short().await?;
    let epoch = sqlx::query_scalar(
        "UPDATE leases SET holder = $2, epoch = epoch + 1, \
         acquired_at = clock_timestamp(), renewed_at = clock_timestamp(), \
         expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond' \
         WHERE name = $1 AND (expires_at <= clock_timestamp() OR holder = $2) \
         RETURNING epoch",
    )
    .persistent(false)
    .bind(FEED_LEASE)
    .bind(holder)
    .bind(millis(ttl))
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(epoch)
}

pub(super) async fn renew(
    pg: &Pg,
    holder: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<(), StoreError> {
    let mut tx = pg.begin_short().await?;
    check(&mut tx, holder, epoch, ttl).await?;
    tx.commit().await?;
    Ok(())
}

/// Checks in `tx` that the lease is `holder`'s at `epoch` and not expired,
/// and renews it for `ttl`; the row stays locked until `tx` ends.
pub(super) async fn check(
    tx: &mut sqlx::PgConnection,
    holder: &str,
    epoch: i64,
    ttl: Duration,
) -> Result<(), StoreError> {
    let renewed = sqlx::query(
        "UPDATE leases SET renewed_at = clock_timestamp(), \
         expires_at = clock_timestamp() + $4::int8 * interval '1 millisecond' \
         WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > clock_timestamp()",
    )
    .persistent(false)
    .bind(FEED_LEASE)
    .bind(holder)
    .bind(epoch)
    .bind(millis(ttl))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if renewed == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost(FEED_LEASE))
    }
}

/// Gives the lease back if still `holder`'s at `epoch`: it expires now.
pub(super) async fn release(pg: &Pg, holder: &str, epoch: i64) -> Result<bool, StoreError> {
    let mut tx = pg.begin_short().await?;
    let released = sqlx::query(
        "UPDATE leases SET expires_at = clock_timestamp() \
         WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > clock_timestamp()",
    )
    .persistent(false)
    .bind(FEED_LEASE)
    .bind(holder)
    .bind(epoch)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(released == 1)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
