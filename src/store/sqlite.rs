//! The SQLite store: the embedded default, for one replica. WAL journal,
//! `synchronous = FULL` (an acknowledged change survives a crash of the machine,
//! not only of the process), one writer at a time by SQLite's own lock.
//!
//! Every write transaction starts with [`BEGIN_WRITE`] (`BEGIN IMMEDIATE`),
//! status changes, snapshots, the reveal flush and retention alike, so the
//! gateway's own writers queue for the lock instead of refusing each other. A
//! deferred `BEGIN` that reads first takes a read snapshot; when another pooled
//! connection commits before it upgrades to a write, SQLite answers
//! `SQLITE_BUSY_SNAPSHOT` at once, without the busy timeout, since waiting cannot
//! help a stale snapshot: with the reveal log flushing every 10 ms, most 5,000-item
//! deliveries were refused 503 that way (tests/it/reveals.rs). `BEGIN IMMEDIATE`
//! takes the write lock before the first read, waiting up to the busy timeout.

use std::collections::HashMap;
use std::str::FromStr;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection as _, QueryBuilder, Row as _, Sqlite, SqlitePool};

use super::{
    ACQUIRE_TIMEOUT, Row, RowTuple, StoreError, Watermark, plan, signed, unsigned, users_of,
};
use crate::domain::Applied;
use crate::domain::StatusChange;

/// How every write transaction begins (see the module doc).
pub const BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// How long a writer waits for another's lock before the operation fails (the
/// webhook answers 503): longer than any one write of the gateway's takes.
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Bound parameters per statement, under SQLite's limit of 32,766.
const MAX_PARAMS: usize = 30_000;

pub async fn connect(url: &str, max_connections: u32) -> Result<SqlitePool, StoreError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT);
    if let Some(dir) = options.get_filename().parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
        }
    }
    Ok(SqlitePoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await?)
}

async fn next_seq(tx: &mut sqlx::SqliteConnection) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT COALESCE(MAX(change_seq), 0) + 1 FROM calltracking_status")
            .fetch_one(tx)
            .await?,
    )
}

pub async fn apply_changes(
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
        // Four parameters per row.
        for chunk in rows.chunks(MAX_PARAMS / 4) {
            let mut query = QueryBuilder::<Sqlite>::new(
                "INSERT INTO calltracking_status (user_id, enabled, version, change_seq) ",
            );
            query.push_values(chunk, |mut b, row| {
                b.push_bind(signed(row.user.get()))
                    .push_bind(row.enabled)
                    .push_bind(signed(row.version.get()))
                    .push_bind(seq);
            });
            query.push(
                " ON CONFLICT (user_id) DO UPDATE SET enabled = excluded.enabled, \
                 version = excluded.version, change_seq = excluded.change_seq \
                 WHERE excluded.version > calltracking_status.version",
            );
            query.build().execute(&mut *tx).await?;
        }
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

/// A snapshot being uploaded: a pooled connection of its own, whose temporary
/// table holds the ids.
pub type SnapshotConn = PoolConnection<Sqlite>;

/// Starts a snapshot: a connection with an empty temporary table of ids. The
/// upload writes only the temporary database, outside any transaction, so it
/// neither holds the main database's write lock (a 10,000,000-id upload would
/// stall every other writer past the busy timeout) nor takes a read snapshot of
/// it that a commit elsewhere would make stale before [`finish_snapshot`]
/// writes. The connection is closed, not pooled again, when it is dropped:
/// the temporary table, also of an abandoned upload, goes with it.
pub async fn begin_snapshot(pool: &SqlitePool) -> Result<SnapshotConn, StoreError> {
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

pub async fn push_snapshot(tx: &mut sqlx::SqliteConnection, ids: &[u64]) -> Result<(), StoreError> {
    for chunk in ids.chunks(MAX_PARAMS) {
        let mut query = QueryBuilder::<Sqlite>::new("INSERT INTO snapshot_ids (user_id) ");
        query.push_values(chunk, |mut b, user| {
            b.push_bind(signed(*user));
        });
        query.build().execute(&mut *tx).await?;
    }
    Ok(())
}

/// Applies the uploaded ids at `version` in one write transaction.
pub async fn finish_snapshot(mut conn: SnapshotConn, version: u64) -> Result<(), StoreError> {
    let mut tx = conn.begin_with(BEGIN_WRITE).await?;
    sqlx::query("CREATE INDEX IF NOT EXISTS temp.snapshot_ids_user ON snapshot_ids (user_id)")
        .execute(&mut *tx)
        .await?;
    let seq = next_seq(&mut tx).await?;
    let version = signed(version);
    sqlx::query(
        "UPDATE calltracking_status \
         SET enabled = (user_id IN (SELECT user_id FROM snapshot_ids)), version = ?1, change_seq = ?2 \
         WHERE version <= ?1",
    )
    .bind(version)
    .bind(seq)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO calltracking_status (user_id, enabled, version, change_seq) \
         SELECT DISTINCT user_id, 1, ?1, ?2 FROM snapshot_ids \
         WHERE (SELECT version FROM calltracking_status WHERE user_id = 0) <= ?1 \
         ON CONFLICT (user_id) DO NOTHING",
    )
    .bind(version)
    .bind(seq)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DROP TABLE temp.snapshot_ids")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

pub async fn changes_after(
    pool: &SqlitePool,
    after: Watermark,
    limit: i64,
) -> Result<Vec<Row>, StoreError> {
    let rows: Vec<RowTuple> = sqlx::query_as(
        "SELECT user_id, enabled, version, change_seq FROM calltracking_status \
         WHERE (change_seq, user_id) > (?, ?) ORDER BY change_seq, user_id LIMIT ?",
    )
    .bind(after.0)
    .bind(after.1)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(Row::from).collect())
}
