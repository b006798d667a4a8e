//! The status store on SQLite, for one replica. Every write transaction
//! starts with [`BEGIN_WRITE`], so the gateway's writers queue for the write
//! lock instead of refusing each other (docs/status-sync.md, "The set").

use std::collections::HashMap;

use sqlx::pool::PoolConnection;
use sqlx::{QueryBuilder, Row as _, Sqlite, SqlitePool};

use super::{Row, RowTuple, Watermark, plan, users_of};
use crate::domain::Applied;
use crate::domain::StatusChange;
use crate::store::error::StoreError;
use crate::store::pool::{SQLITE_BEGIN_WRITE as BEGIN_WRITE, signed, unsigned};

/// Bound parameters per statement, under SQLite's limit of 32,766.
const MAX_PARAMS: usize = 30_000;

async fn next_seq(tx: &mut sqlx::SqliteConnection) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT COALESCE(MAX(change_seq), 0) + 1 FROM calltracking_status")
            .fetch_one(tx)
            .await?,
    )
}

pub(super) async fn apply_changes(
    pool: &SqlitePool,
    items: &[StatusChange],
    cursor: Option<&str>,
) -> Result<Applied, StoreError> {
    // Reads the stored versions, then writes: the write lock first.
    let mut tx = pool.begin_with(BEGIN_WRITE).await?;
    let mut stored = HashMap::new();
    for chunk in users_of(items).chunks(MAX_PARAMS) {
        let mut query = QueryBuilder::<Sqlite>::new(
            "SELECT user_id, version FROM calltracking_status WHERE user_id IN (",
        );
        let mut list = query.separated(", ");
        for user in chunk {
            list.push_bind(signed(*user));
        }
        query.push(")");
        for row in query.build().fetch_all(&mut *tx).await? {
            stored.insert(unsigned(row.get(0)), unsigned(row.get(1)));
        }
    }
    let (counts, rows) = plan(items, stored);
    if !rows.is_empty() {
        let seq = next_seq(&mut tx).await?;
        for chunk in rows.chunks(MAX_PARAMS / 5) {
            let mut query = QueryBuilder::<Sqlite>::new(
                "INSERT INTO calltracking_status (user_id, enabled, version, change_seq, flip_seq) ",
            );
            query.push_values(chunk, |mut b, row| {
                b.push_bind(signed(row.user.get()))
                    .push_bind(row.enabled)
                    .push_bind(signed(row.version.get()))
                    .push_bind(seq)
                    .push_bind(if row.enabled { seq } else { 0 });
            });
            query.push(
                " ON CONFLICT (user_id) DO UPDATE SET enabled = excluded.enabled, \
                 version = excluded.version, change_seq = excluded.change_seq, \
                 flip_seq = CASE WHEN excluded.enabled <> calltracking_status.enabled \
                            THEN excluded.change_seq ELSE calltracking_status.flip_seq END \
                 WHERE excluded.version > calltracking_status.version",
            );
            query.build().execute(&mut *tx).await?;
        }
    }
    #[cfg(feature = "test-faults")]
    for item in items {
        crate::store::faults::stall_at(item.version.get()).await;
    }
    if let Some(cursor) = cursor {
        sqlx::query(
            "INSERT INTO status_feed_cursor (id, cursor) VALUES (1, ?) \
             ON CONFLICT (id) DO UPDATE SET cursor = excluded.cursor",
        )
        .bind(cursor)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(counts)
}

/// A snapshot being uploaded: a connection whose temporary table holds the ids.
pub(super) type SnapshotConn = PoolConnection<Sqlite>;

/// Starts a snapshot: a connection with an empty temporary table of ids,
/// outside any transaction (docs/status-sync.md, "The set"). Closed, not
/// pooled again, when dropped: the table goes with it.
pub(super) async fn begin_snapshot(pool: &SqlitePool) -> Result<SnapshotConn, StoreError> {
    let mut conn = pool.acquire().await?;
    conn.close_on_drop();
    sqlx::query("CREATE TEMP TABLE IF NOT EXISTS snapshot_ids (user_id INTEGER NOT NULL)")
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM snapshot_ids")
        .execute(&mut *conn)
        .await?;
    Ok(conn)
}

pub(super) async fn push_snapshot(
    tx: &mut sqlx::SqliteConnection,
    ids: &[u64],
) -> Result<(), StoreError> {
    for chunk in ids.chunks(MAX_PARAMS) {
        let mut query = QueryBuilder::<Sqlite>::new("INSERT INTO snapshot_ids (user_id) ");
        query.push_values(chunk, |mut b, user| {
            b.push_bind(signed(*user));
        });
        query.build().execute(&mut *tx).await?;
    }
    Ok(())
}

/// Indexes the uploaded ids (before the lock: it writes only the temporary
/// database), then takes the write lock and the change the snapshot's rows
/// will be stamped with. Begun by a plain statement, not an sqlx
/// `Transaction`: a snapshot dropped unfinished closes its connection, and
/// SQLite rolls back an open transaction on close.
pub(super) async fn prepare_snapshot(conn: &mut SnapshotConn) -> Result<i64, StoreError> {
    sqlx::query("CREATE INDEX IF NOT EXISTS temp.snapshot_ids_user ON snapshot_ids (user_id)")
        .execute(&mut **conn)
        .await?;
    sqlx::query(BEGIN_WRITE).execute(&mut **conn).await?;
    next_seq(conn).await
}

pub(super) async fn finish_snapshot(
    mut conn: SnapshotConn,
    version: u64,
    seq: i64,
) -> Result<bool, StoreError> {
    let version = signed(version);
    let updated = sqlx::query(
        "UPDATE calltracking_status \
         SET flip_seq = CASE WHEN enabled <> (user_id IN (SELECT user_id FROM snapshot_ids)) \
                        THEN ?2 ELSE flip_seq END, \
             enabled = (user_id IN (SELECT user_id FROM snapshot_ids)), version = ?1, change_seq = ?2 \
         WHERE version <= ?1",
    )
    .bind(version)
    .bind(seq)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    #[cfg(feature = "test-faults")]
    crate::store::faults::stall_at(unsigned(version)).await;
    let inserted = sqlx::query(
        "INSERT INTO calltracking_status (user_id, enabled, version, change_seq, flip_seq) \
         SELECT DISTINCT user_id, 1, ?1, ?2, ?2 FROM snapshot_ids \
         WHERE (SELECT version FROM calltracking_status WHERE user_id = 0) <= ?1 \
         ON CONFLICT (user_id) DO NOTHING",
    )
    .bind(version)
    .bind(seq)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    sqlx::query("DROP TABLE temp.snapshot_ids")
        .execute(&mut *conn)
        .await?;
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    Ok(updated + inserted > 0)
}

pub(super) async fn changes_after(
    pool: &SqlitePool,
    after: Watermark,
    limit: i64,
) -> Result<Vec<Row>, StoreError> {
    // "After (seq, user)" as two index ranges: SQLite seeks a row value on
    // `change_seq` alone, and would walk a large change from its first row.
    let rows: Vec<RowTuple> = sqlx::query_as(
        "SELECT user_id, enabled, version, change_seq, flip_seq, 0 FROM \
         (SELECT * FROM (SELECT user_id, enabled, version, change_seq, flip_seq \
                         FROM calltracking_status WHERE change_seq = ?1 AND user_id > ?2 \
                         ORDER BY user_id LIMIT ?3) \
          UNION ALL \
          SELECT * FROM (SELECT user_id, enabled, version, change_seq, flip_seq \
                         FROM calltracking_status WHERE change_seq > ?1 \
                         ORDER BY change_seq, user_id LIMIT ?3)) \
         ORDER BY change_seq, user_id LIMIT ?3",
    )
    .bind(after.0)
    .bind(after.1)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(Row::from).collect())
}
