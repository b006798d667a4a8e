//! The PostgreSQL store: for a cluster of replicas, directly or through a
//! transaction-mode pooler (every statement unnamed and in a transaction: see
//! `super::Pg`). Writers take a
//! transaction-level advisory lock before the change sequence value, so values
//! commit in order; each write notifies `calltracking_status` on commit (a hint to
//! the other replicas to catch up; the poll covers a lost one).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Row as _};

use super::{Row, RowTuple, StoreError, Watermark, plan, signed, unsigned, users_of};
use crate::domain::Applied;
use crate::domain::StatusChange;

/// The notification channel of status changes.
pub(super) const CHANNEL: &str = "calltracking_status";
/// Advisory lock key serialising writers ("ctstatus" in ASCII).
const WRITE_LOCK: i64 = 0x6374_7374_6174_7573;
/// Advisory lock key of the status-feed leader.
pub(super) const FEED_LOCK: i64 = 0x6374_6665_6564_6c64;

pub fn options(url: &str) -> Result<PgConnectOptions, StoreError> {
    Ok(PgConnectOptions::from_str(url)?)
}

pub fn connect(url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(super::ACQUIRE_TIMEOUT)
        .connect_lazy_with(options(url)?))
}

async fn begin_write(
    pool: &PgPool,
) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, i64), StoreError> {
    let mut tx = pool.begin().await?;
    let seq = take_write_turn(&mut tx).await?;
    Ok((tx, seq))
}

/// Waits for the writers' lock, then draws this transaction's change sequence
/// value: in that order, so values commit in the order they were drawn.
async fn take_write_turn(tx: &mut sqlx::PgConnection) -> Result<i64, StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .persistent(false)
        .bind(WRITE_LOCK)
        .execute(&mut *tx)
        .await?;
    Ok(
        sqlx::query_scalar("SELECT nextval('calltracking_change_seq')")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?,
    )
}

async fn notify_and_commit(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    seq: i64,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .persistent(false)
        .bind(CHANNEL)
        .bind(seq.to_string())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

pub async fn apply_changes(
    pool: &PgPool,
    items: &[StatusChange],
    cursor: Option<&str>,
) -> Result<Applied, StoreError> {
    let (mut tx, seq) = begin_write(pool).await?;
    let users: Vec<i64> = users_of(items).into_iter().map(signed).collect();
    let stored: HashMap<u64, u64> =
        sqlx::query("SELECT user_id, version FROM calltracking_status WHERE user_id = ANY($1)")
            .persistent(false)
            .bind(&users)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .map(|row| (unsigned(row.get(0)), unsigned(row.get(1))))
            .collect();
    let (counts, rows) = plan(items, stored);
    if !rows.is_empty() {
        let ids: Vec<i64> = rows.iter().map(|r| signed(r.user.get())).collect();
        let enabled: Vec<bool> = rows.iter().map(|r| r.enabled).collect();
        let versions: Vec<i64> = rows.iter().map(|r| signed(r.version.get())).collect();
        sqlx::query(
            "INSERT INTO calltracking_status (user_id, enabled, version, change_seq) \
             SELECT u, e, v, $4 FROM UNNEST($1::int8[], $2::bool[], $3::int8[]) AS t(u, e, v) \
             ON CONFLICT (user_id) DO UPDATE SET enabled = excluded.enabled, \
             version = excluded.version, change_seq = excluded.change_seq \
             WHERE excluded.version > calltracking_status.version",
        )
        .persistent(false)
        .bind(&ids)
        .bind(&enabled)
        .bind(&versions)
        .bind(seq)
        .execute(&mut *tx)
        .await?;
    }
    if let Some(cursor) = cursor {
        sqlx::query(
            "INSERT INTO status_feed_cursor (id, cursor) VALUES (1, $1) \
             ON CONFLICT (id) DO UPDATE SET cursor = excluded.cursor",
        )
        .persistent(false)
        .bind(cursor)
        .execute(&mut *tx)
        .await?;
    }
    notify_and_commit(tx, seq).await?;
    Ok(counts)
}

/// Starts a snapshot: a transaction with an empty temporary table of ids. The
/// writers' advisory lock is taken only in [`finish_snapshot`], so a long upload
/// does not hold up other replicas' writes.
pub async fn begin_snapshot(
    pool: &PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("CREATE TEMP TABLE snapshot_ids (user_id BIGINT NOT NULL) ON COMMIT DROP")
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// One COPY per pushed chunk.
pub async fn push_snapshot(tx: &mut sqlx::PgConnection, ids: &[u64]) -> Result<(), StoreError> {
    let mut copy = tx
        .copy_in_raw("COPY snapshot_ids (user_id) FROM STDIN")
        .await?;
    let mut buffer = String::with_capacity(ids.len() * 12);
    for user in ids {
        // Writing to a String cannot fail.
        let _ = writeln!(buffer, "{user}");
    }
    copy.send(buffer.as_bytes()).await?;
    copy.finish().await?;
    Ok(())
}

pub async fn finish_snapshot(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    version: u64,
) -> Result<(), StoreError> {
    sqlx::query("CREATE INDEX ON snapshot_ids (user_id)")
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    sqlx::query("ANALYZE snapshot_ids")
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    let seq = take_write_turn(&mut tx).await?;
    let version = signed(version);
    sqlx::query(
        "UPDATE calltracking_status s \
         SET enabled = EXISTS (SELECT 1 FROM snapshot_ids t WHERE t.user_id = s.user_id), \
             version = $1, change_seq = $2 \
         WHERE s.version <= $1",
    )
    .persistent(false)
    .bind(version)
    .bind(seq)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO calltracking_status (user_id, enabled, version, change_seq) \
         SELECT DISTINCT user_id, true, $1, $2 FROM snapshot_ids \
         WHERE (SELECT version FROM calltracking_status WHERE user_id = 0) <= $1 \
         ON CONFLICT (user_id) DO NOTHING",
    )
    .persistent(false)
    .bind(version)
    .bind(seq)
    .execute(&mut *tx)
    .await?;
    notify_and_commit(tx, seq).await
}

pub async fn changes_after(
    pool: &PgPool,
    after: Watermark,
    limit: i64,
) -> Result<Vec<Row>, StoreError> {
    // In a transaction, alone as it is: pooler-safe (see `super::Pg`).
    let mut tx = pool.begin().await?;
    let rows: Vec<RowTuple> = sqlx::query_as(
        "SELECT user_id, enabled, version, change_seq FROM calltracking_status \
         WHERE (change_seq, user_id) > ($1, $2) ORDER BY change_seq, user_id LIMIT $3",
    )
    .persistent(false)
    .bind(after.0)
    .bind(after.1)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows.into_iter().map(Row::from).collect())
}
