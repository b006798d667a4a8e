//! The status store: the status set's rows and the change log they share with cache
//! invalidations, in one order (docs/status-sync.md, "Replication between replicas").

mod postgres;
mod sqlite;

use std::collections::HashMap;
use std::time::Duration;

use super::error::StoreError;
use super::leadership::Fence;
use super::pool::{Backend, on_connection, unsigned};
use crate::domain::wall_clock::Stopwatch;
use crate::domain::{Applied, Status, StatusChange, UserId};

/// Rows read per catch-up query.
pub const CHANGES_PAGE: i64 = 50_000;

/// A snapshot that stamps at least this many rows leaves its listing for the
/// other replicas (PostgreSQL); a smaller one is read as rows.
const LISTING_ROWS: u64 = 50_000;

/// The row of the snapshot floor (migration 0002; user ids start at 1): see
/// docs/status-sync.md, "The snapshot and its floor".
pub const FLOOR_USER: u64 = 0;

/// A row of the change log: a status as stored, or a cache invalidation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub user_id: u64,
    pub seq: i64,
    pub change: Change,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Status {
        status: Status,
        /// The change that last turned call tracking on or off (0: never).
        flip_seq: i64,
    },
    Invalidated,
}

/// (user_id, enabled, version, change_seq, flip_seq, is an invalidation).
type RowTuple = (i64, bool, i64, i64, i64, bool);

impl From<RowTuple> for Row {
    fn from((user_id, enabled, version, seq, flip_seq, invalidation): RowTuple) -> Self {
        Row {
            user_id: unsigned(user_id),
            seq,
            change: if invalidation {
                Change::Invalidated
            } else {
                Change::Status {
                    status: Status {
                        enabled,
                        version: unsigned(version),
                    },
                    flip_seq,
                }
            },
        }
    }
}

/// A position in the change log: (change_seq, user_id) of the last row seen.
pub type Watermark = (i64, i64);

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StatusStoreError(#[from] StoreError);

impl StatusStoreError {
    pub fn cause(&self) -> &StoreError {
        &self.0
    }
}

#[derive(Debug, Clone)]
pub struct StatusStore {
    backend: Backend,
}

impl StatusStore {
    pub(super) fn of(backend: Backend) -> Self {
        StatusStore { backend }
    }

    pub fn call_bound(&self) -> Duration {
        self.backend.call_bound()
    }

    pub fn short_bound(&self) -> Duration {
        self.backend.short_bound()
    }

    /// Applies a delta delivery in one transaction (with the feed cursor and its
    /// lease, if any) within `deadline`; on an error nothing was applied.
    pub async fn apply_changes(
        &self,
        items: &[StatusChange],
        feed: Option<(&str, Option<&Fence>)>,
        deadline: tokio::time::Instant,
    ) -> Result<Applied, StatusStoreError> {
        let cursor = feed.map(|(cursor, _)| cursor);
        Ok(self
            .backend
            .until("apply_changes", deadline, async {
                match &self.backend {
                    Backend::Sqlite(pool) => sqlite::apply_changes(pool, items, cursor).await,
                    Backend::Postgres(pg) => postgres::apply_changes(pg, items, feed).await,
                }
            })
            .await?)
    }

    /// Starts a full snapshot: ids are pushed in chunks (duplicates allowed), then
    /// [`PreparedSnapshot::finish`] applies it. Dropped unfinished, it rolls back.
    pub async fn begin_snapshot(&self) -> Result<SnapshotLoad, StatusStoreError> {
        let tx = self
            .backend
            .call("begin_snapshot", async {
                Ok(match &self.backend {
                    Backend::Sqlite(pool) => {
                        SnapshotTx::Sqlite(sqlite::begin_snapshot(pool).await?)
                    }
                    Backend::Postgres(pg) => {
                        SnapshotTx::Postgres(postgres::begin_snapshot(pg).await?)
                    }
                })
            })
            .await?;
        Ok(SnapshotLoad {
            started: Stopwatch::start(),
            backend: self.backend.clone(),
            tx,
        })
    }

    pub async fn changes_after(
        &self,
        after: Watermark,
        limit: i64,
    ) -> Result<Vec<Row>, StatusStoreError> {
        Ok(self
            .backend
            .read("changes_after", async {
                match &self.backend {
                    Backend::Sqlite(pool) => sqlite::changes_after(pool, after, limit).await,
                    Backend::Postgres(pg) => postgres::changes_after(pg, after, limit).await,
                }
            })
            .await?)
    }

    /// Records that every cached number of `users` is to be dropped on every
    /// replica, and prunes the records older than `keep` (the longest a cached
    /// entry can be served). SQLite has no other replica: nothing to record.
    pub async fn record_invalidations(
        &self,
        users: &[UserId],
        keep: Duration,
        deadline: tokio::time::Instant,
    ) -> Result<(), StatusStoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(pg) => Ok(self
                .backend
                .until(
                    "record_invalidations",
                    deadline,
                    postgres::record_invalidations(pg, users, keep),
                )
                .await?),
        }
    }

    pub fn keeps_listings(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// The listing the snapshot stamped `seq` left, if any (migration 0008).
    pub async fn snapshot_listing(
        &self,
        seq: i64,
    ) -> Result<Option<(u64, Vec<u8>)>, StatusStoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(None),
            Backend::Postgres(pg) => Ok(self
                .backend
                .read("snapshot_listing", postgres::snapshot_listing(pg, seq))
                .await?),
        }
    }

    pub async fn feed_cursor(&self) -> Result<Option<String>, StatusStoreError> {
        let query = "SELECT cursor FROM status_feed_cursor WHERE id = 1";
        let deadline = tokio::time::Instant::now() + self.short_bound();
        Ok(self
            .backend
            .until("feed_cursor", deadline, async {
                Ok(on_connection!(&self.backend, conn => {
                    sqlx::query_scalar(query)
                        .persistent(false)
                        .fetch_optional(&mut *conn)
                        .await?
                }))
            })
            .await?)
    }
}

/// A snapshot being loaded: one open transaction holding a temporary table of ids.
pub struct SnapshotLoad {
    tx: SnapshotTx,
    backend: Backend,
    started: Stopwatch,
}

enum SnapshotTx {
    /// A connection, not a transaction: see `sqlite::begin_snapshot`.
    Sqlite(sqlite::SnapshotConn),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl SnapshotLoad {
    /// Adds enabled ids (validated by the caller); on an error, drop the load.
    pub async fn push(&mut self, ids: &[u64]) -> Result<(), StatusStoreError> {
        let tx = &mut self.tx;
        Ok(self
            .backend
            .call("push_snapshot", async {
                match tx {
                    SnapshotTx::Sqlite(tx) => sqlite::push_snapshot(tx, ids).await,
                    SnapshotTx::Postgres(tx) => postgres::push_snapshot(tx, ids).await,
                }
            })
            .await?)
    }

    /// Takes the writers' turn for the snapshot at `version`, and the change its
    /// rows will be stamped with: until the [`PreparedSnapshot`] is finished or
    /// dropped no other change-log write commits (the caller may read the log on
    /// another connection). Shares the finish's bound.
    pub async fn prepare(self, version: u64) -> Result<PreparedSnapshot, StatusStoreError> {
        let SnapshotLoad {
            mut tx,
            backend,
            started,
        } = self;
        let bound = backend.finish_bound();
        let deadline = tokio::time::Instant::now() + bound;
        let seq = backend
            .until("prepare_snapshot", deadline, async {
                match &mut tx {
                    SnapshotTx::Sqlite(tx) => sqlite::prepare_snapshot(tx).await,
                    SnapshotTx::Postgres(tx) => postgres::prepare_snapshot(tx).await,
                }
            })
            .await?;
        Ok(PreparedSnapshot {
            tx,
            backend,
            started,
            version,
            seq,
            deadline,
            bound,
        })
    }
}

/// A snapshot holding the writers' turn; dropped unfinished, it rolls back and yields it.
pub struct PreparedSnapshot {
    tx: SnapshotTx,
    backend: Backend,
    started: Stopwatch,
    version: u64,
    seq: i64,
    deadline: tokio::time::Instant,
    bound: Duration,
}

impl PreparedSnapshot {
    /// The `change_seq` of every row the snapshot writes, the floor's included.
    pub fn seq(&self) -> i64 {
        self.seq
    }

    /// When the finish's bound runs out, counted from the prepare.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }

    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Applies the snapshot and commits; whether it changed any row (if none,
    /// it stamped nothing with [`PreparedSnapshot::seq`], and SQLite hands that
    /// value to the next write). `listing` is stored with it when it stamped at
    /// least [`LISTING_ROWS`] rows, where [`StatusStore::keeps_listings`].
    pub async fn finish(self, listing: Option<&[u8]>) -> Result<bool, StatusStoreError> {
        let PreparedSnapshot {
            tx,
            backend,
            started,
            version,
            seq,
            deadline,
            ..
        } = self;
        let result = match tx {
            SnapshotTx::Sqlite(tx) => {
                let finish = sqlite::finish_snapshot(tx, version, seq);
                backend.until("finish_snapshot", deadline, finish).await
            }
            // Batches bounded each (the number grows with the snapshot), not the whole.
            SnapshotTx::Postgres(tx) => {
                let statement = backend.call_bound();
                let finish = postgres::finish_snapshot(tx, version, seq, listing, statement);
                backend.stepped("finish_snapshot", finish).await
            }
        };
        metrics::histogram!("phones_gateway_db_operation_duration_seconds", "operation" => "apply_snapshot")
            .record(started.elapsed().as_secs_f64());
        Ok(result?)
    }
}

/// The distinct users of a delivery, and the floor row.
fn users_of(items: &[StatusChange]) -> Vec<u64> {
    let mut users: Vec<u64> = items.iter().map(|i| i.user.get()).collect();
    users.push(FLOOR_USER);
    users.sort_unstable();
    users.dedup();
    users
}

fn plan(items: &[StatusChange], mut stored: HashMap<u64, u64>) -> (Applied, Vec<StatusChange>) {
    let floor = stored.remove(&FLOOR_USER).unwrap_or(0);
    crate::domain::plan_changes(items, &stored, floor)
}
