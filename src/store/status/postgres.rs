//! The status store on PostgreSQL, for a cluster of replicas. Each write
//! notifies `calltracking_status` on commit, a hint to the others to catch up.

use std::collections::HashMap;
use std::fmt::Write as _;

use sqlx::Row as _;

use super::{Row, RowTuple, Watermark, plan, users_of};
use crate::domain::StatusChange;
use crate::domain::{Applied, UserId};
use crate::store::error::StoreError;
use crate::store::hints::CHANNEL;
use crate::store::leadership::Fence;
use crate::store::pool::{Pg, signed, unsigned};

/// Advisory lock key serialising writers ("ctstatus" in ASCII).
const WRITE_LOCK: i64 = 0x6374_7374_6174_7573;

/// A small write's transaction, its turn among the writers and its sequence.
async fn begin_write(
    pg: &Pg,
) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, i64), StoreError> {
    let mut tx = pg.begin_short().await?;
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

pub(super) async fn apply_changes(
    pg: &Pg,
    items: &[StatusChange],
    feed: Option<(&str, Option<&Fence>)>,
) -> Result<Applied, StoreError> {
    let (mut tx, seq) = begin_write(pg).await?;
    // A feed page is taken only under the lease it was read under (checked, and
    // the row held, in this transaction): see docs/status-sync.md, "Leadership".
    if let Some((_, Some(fence))) = feed {
        fence.check(&mut tx).await?;
    }
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
            "INSERT INTO calltracking_status (user_id, enabled, version, change_seq, flip_seq) \
             SELECT u, e, v, $4, CASE WHEN e THEN $4 ELSE 0 END \
             FROM UNNEST($1::int8[], $2::bool[], $3::int8[]) AS t(u, e, v) \
             ON CONFLICT (user_id) DO UPDATE SET enabled = excluded.enabled, \
             version = excluded.version, change_seq = excluded.change_seq, \
             flip_seq = CASE WHEN excluded.enabled <> calltracking_status.enabled \
                        THEN excluded.change_seq ELSE calltracking_status.flip_seq END \
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
    if let Some((cursor, _)) = feed {
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
/// writers' lock is taken only later, so a long upload holds up no writes.
pub(super) async fn begin_snapshot(
    pg: &Pg,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pg.begin().await?;
    sqlx::query("CREATE TEMP TABLE snapshot_ids (user_id BIGINT NOT NULL) ON COMMIT DROP")
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

pub(super) async fn push_snapshot(
    tx: &mut sqlx::PgConnection,
    ids: &[u64],
) -> Result<(), StoreError> {
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

/// Indexes the loaded ids, then takes the writers' turn (held until the
/// transaction ends) and the change the snapshot's rows will be stamped with.
pub(super) async fn prepare_snapshot(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
) -> Result<i64, StoreError> {
    sqlx::query("CREATE INDEX ON snapshot_ids (user_id)")
        .persistent(false)
        .execute(&mut **tx)
        .await?;
    sqlx::query("ANALYZE snapshot_ids")
        .persistent(false)
        .execute(&mut **tx)
        .await?;
    take_write_turn(tx).await
}

/// Rows a statement of a snapshot's finish writes at most, so that no
/// statement's time grows with the snapshot.
pub(super) const SNAPSHOT_BATCH: i64 = 250_000;

/// Applies the loaded ids at `version`, stamped `seq`, with its `listing`, and
/// commits; whether it changed any row. Each batch bounded by `statement`.
pub(super) async fn finish_snapshot(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    version: u64,
    seq: i64,
    listing: Option<&[u8]>,
    statement: std::time::Duration,
) -> Result<bool, StoreError> {
    let version = signed(version);
    // Every stored row at or below the version (the floor's too) takes the
    // snapshot's state: listed, enabled; else disabled.
    let mut updated = 0;
    let mut after = i64::MIN;
    loop {
        let step = sqlx::query_as::<_, (Option<i64>, i64)>(
            "WITH batch AS (SELECT user_id FROM calltracking_status WHERE user_id > $3 \
                            ORDER BY user_id LIMIT $4), \
             changed AS ( \
               UPDATE calltracking_status s \
               SET (enabled, flip_seq) = ( \
                     SELECT n.listed, CASE WHEN n.listed <> s.enabled THEN $2 ELSE s.flip_seq END \
                     FROM (SELECT EXISTS (SELECT 1 FROM snapshot_ids t WHERE t.user_id = s.user_id)) \
                          AS n(listed)), \
                   version = $1, change_seq = $2 \
               FROM batch b WHERE s.user_id = b.user_id AND s.version <= $1 \
               RETURNING 1) \
             SELECT (SELECT max(user_id) FROM batch), (SELECT count(*) FROM changed)",
        )
        .persistent(false)
        .bind(version)
        .bind(seq)
        .bind(after)
        .bind(SNAPSHOT_BATCH)
        .fetch_one(&mut *tx);
        let (last, count) = bounded("a snapshot's update", statement, step).await?;
        updated += unsigned(count);
        match last {
            Some(last) => after = last,
            None => break,
        }
    }
    // The listed ids without a row, unless the floor is above the snapshot.
    let floor: i64 =
        sqlx::query_scalar("SELECT version FROM calltracking_status WHERE user_id = 0")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?;
    let mut inserted = 0;
    let mut after = i64::MIN;
    let mut more = floor <= version;
    while more {
        let step = sqlx::query_as::<_, (Option<i64>, i64)>(
            "WITH batch AS (SELECT DISTINCT user_id FROM snapshot_ids WHERE user_id > $3 \
                            ORDER BY user_id LIMIT $4), \
             added AS ( \
               INSERT INTO calltracking_status (user_id, enabled, version, change_seq, flip_seq) \
               SELECT user_id, true, $1, $2, $2 FROM batch \
               ON CONFLICT (user_id) DO NOTHING \
               RETURNING 1) \
             SELECT (SELECT max(user_id) FROM batch), (SELECT count(*) FROM added)",
        )
        .persistent(false)
        .bind(version)
        .bind(seq)
        .bind(after)
        .bind(SNAPSHOT_BATCH)
        .fetch_one(&mut *tx);
        let (last, count) = bounded("a snapshot's insert", statement, step).await?;
        inserted += unsigned(count);
        match last {
            Some(last) => after = last,
            None => more = false,
        }
    }
    if let Some(listing) = listing.filter(|_| updated + inserted >= super::LISTING_ROWS) {
        sqlx::query("DELETE FROM calltracking_snapshot_listings")
            .persistent(false)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO calltracking_snapshot_listings (change_seq, version, ids) \
             VALUES ($1, $2, $3)",
        )
        .persistent(false)
        .bind(seq)
        .bind(version)
        .bind(listing)
        .execute(&mut *tx)
        .await?;
    }
    notify_and_commit(tx, seq).await?;
    Ok(updated + inserted > 0)
}

async fn bounded<T>(
    operation: &'static str,
    bound: std::time::Duration,
    step: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(bound, step)
        .await
        .map_err(|_| StoreError::TimedOut { operation, bound })?
        .map_err(StoreError::from)
}

pub(super) async fn snapshot_listing(
    pg: &Pg,
    seq: i64,
) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
    // In a transaction, alone as it is: pooler-safe (see `store::pool::Pg`).
    let mut tx = pg.begin().await?;
    let row: Option<(i64, Vec<u8>)> = sqlx::query_as(
        "SELECT version, ids FROM calltracking_snapshot_listings WHERE change_seq = $1",
    )
    .persistent(false)
    .bind(seq)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(row.map(|(version, ids)| (unsigned(version), ids)))
}

pub(super) async fn changes_after(
    pg: &Pg,
    after: Watermark,
    limit: i64,
) -> Result<Vec<Row>, StoreError> {
    // In a transaction, alone as it is: pooler-safe (see `store::pool::Pg`).
    let mut tx = pg.begin().await?;
    let rows: Vec<RowTuple> = sqlx::query_as(
        "(SELECT user_id, enabled, version, change_seq, flip_seq, false AS invalidation \
          FROM calltracking_status WHERE (change_seq, user_id) > ($1, $2) \
          ORDER BY change_seq, user_id LIMIT $3) \
         UNION ALL \
         (SELECT user_id, false, 0::int8, change_seq, 0::int8, true \
          FROM cache_invalidations WHERE (change_seq, user_id) > ($1, $2) \
          ORDER BY change_seq, user_id LIMIT $3) \
         ORDER BY 4, 1 LIMIT $3",
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

/// Records invalidations in the change log, as a status change, and prunes.
pub(super) async fn record_invalidations(
    pg: &Pg,
    users: &[UserId],
    keep: std::time::Duration,
) -> Result<(), StoreError> {
    let (mut tx, seq) = begin_write(pg).await?;
    let ids: Vec<i64> = users.iter().map(|u| signed(u.get())).collect();
    sqlx::query(
        "INSERT INTO cache_invalidations (change_seq, user_id) \
         SELECT $1, u FROM UNNEST($2::int8[]) AS t(u) ON CONFLICT DO NOTHING",
    )
    .persistent(false)
    .bind(seq)
    .bind(&ids)
    .execute(&mut *tx)
    .await?;
    // The database's clock, not this replica's; in small batches.
    sqlx::query(
        "DELETE FROM cache_invalidations WHERE ctid = ANY (ARRAY( \
           SELECT ctid FROM cache_invalidations \
           WHERE at < now() - make_interval(secs => $1) LIMIT 10000))",
    )
    .persistent(false)
    .bind(keep.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    notify_and_commit(tx, seq).await
}
