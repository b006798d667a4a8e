//! The status store: the call-tracking status set's rows, and the change log
//! they share with cache invalidations. Held by the status service alone.
//!
//! Every write is one transaction that stamps the rows it changes with the next
//! *change sequence* value. Writers are serialised (PostgreSQL: a transaction-level
//! advisory lock taken before the sequence value; SQLite: its single writer), so
//! sequence values become visible in order and a reader that asks for "changes
//! after (seq, user)" can never skip a row. That question,
//! [`StatusStore::changes_after`], is the only way memory learns about changes:
//! at start-up, after a local write, on a change hint, and on a short poll.
//!
//! Invalidations are part of this store rather than a store of their own: they
//! take the same sequence, the same writers' lock and the same notification,
//! and the one reader reads both in one order; that order is what makes a
//! flip and an invalidation of the same seller apply in the order they were
//! written. SQLite serves one replica and records none.
//!
//! The interface is here, with what both dialects read and write: a row of
//! the change log ([`Row`]), a position in it ([`Watermark`]), the snapshot
//! floor's row ([`FLOOR_USER`]) and a delivery's plan against the stored
//! versions. The two dialects are a file each ([`sqlite`], [`postgres`]):
//! their write paths differ in shape (multi-row inserts under SQLite's one
//! writer; arrays, `COPY` and an advisory lock on PostgreSQL), not only in
//! placeholders.

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

/// A snapshot that stamps at least this many rows (a catch-up page) leaves its
/// listing for the other replicas (PostgreSQL; see
/// [`StatusStore::snapshot_listing`]); a smaller one is read as rows.
const LISTING_ROWS: u64 = 50_000;

/// The row that holds the snapshot floor (migration 0002): user ids start at 1,
/// so user 0 is free. Its version is the last snapshot's; every user without a
/// row of their own has that version, disabled. A snapshot moves it like any
/// other row at or below its version; deltas read it as the version of users
/// without a row; catch-up hands it over with the other rows, in change order.
pub const FLOOR_USER: u64 = 0;

/// A row of the change log, in change order: a status as stored, or a cache
/// invalidation (PostgreSQL only; with SQLite invalidations stay local).
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
    /// Every cached number of the seller is to be dropped.
    Invalidated,
}

/// A row as both databases return it: (user_id, enabled, version, change_seq,
/// flip_seq, is an invalidation).
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

/// The status store failed: the cause ([`StoreError`]), under a name of its own
/// so that a log or an answer says which store it was.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StatusStoreError(#[from] StoreError);

impl StatusStoreError {
    pub fn cause(&self) -> &StoreError {
        &self.0
    }
}

/// The status store's handle (see the module doc); made by
/// `Database::status`.
#[derive(Debug, Clone)]
pub struct StatusStore {
    backend: Backend,
}

impl StatusStore {
    pub(super) fn of(backend: Backend) -> Self {
        StatusStore { backend }
    }

    /// The client's bound on one call (see [`crate::store::Bounds::call`]).
    pub fn call_bound(&self) -> Duration {
        self.backend.call_bound()
    }

    /// The bound of a small call, whole (see [`crate::store::Bounds::short`]): a
    /// delta, an invalidation, the writers' turn for them.
    pub fn short_bound(&self) -> Duration {
        self.backend.short_bound()
    }

    /// Applies a delta delivery in one transaction (with the feed cursor that
    /// brought it and the lease it was read under, if any); returns what
    /// applied and what was ignored. Given up at `deadline` (both dialects).
    ///
    /// # Errors
    /// The database refused or is unreachable, or the feed's lease is lost
    /// ([`StoreError::LeaseLost`]); nothing was applied.
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
    /// [`PreparedSnapshot::finish`] applies it in the same transaction. Dropping the
    /// load unfinished rolls it back.
    ///
    /// # Errors
    /// The database is unreachable.
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

    /// Up to `limit` rows changed after `after`, in change order.
    ///
    /// # Errors
    /// The database is unreachable.
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

    /// Records, in the change log, that every cached number of `users` is to be
    /// dropped on every replica, and prunes the records older than `keep` (the
    /// longest time a cached entry can still be served: an older record cannot
    /// drop anything). With SQLite there is no other replica: nothing to record.
    ///
    /// # Errors
    /// The database refused or is unreachable; nothing was recorded.
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

    /// Whether a snapshot leaves its listing for other replicas
    /// ([`PreparedSnapshot::finish`]): on PostgreSQL. SQLite serves one
    /// replica.
    pub fn keeps_listings(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// The listing a snapshot stamped `seq` left (migration 0008): its
    /// version and its ids as [`PreparedSnapshot::finish`] was given them;
    /// `None` when it left none (a small snapshot, SQLite, or a later
    /// large snapshot replaced it). Within a read's bound.
    ///
    /// # Errors
    /// The database is unreachable.
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

    /// The status feed's stored cursor.
    ///
    /// # Errors
    /// The database is unreachable.
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
    /// The database it came from, for the bound of each call.
    backend: Backend,
    /// For the `apply_snapshot` duration metric.
    started: Stopwatch,
}

enum SnapshotTx {
    /// A connection, not a transaction: see `sqlite::begin_snapshot`.
    Sqlite(sqlite::SnapshotConn),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl SnapshotLoad {
    /// Adds enabled ids (validated by the caller).
    ///
    /// # Errors
    /// The database failed; drop the load.
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

    /// Takes the writers' turn to apply the snapshot at `version`, and the
    /// change its rows will be stamped with. From then until the returned
    /// [`PreparedSnapshot`] is finished or dropped, no other write to the
    /// change log can commit (PostgreSQL: the writers' advisory lock; SQLite:
    /// its write lock): every change before the snapshot's is stored, and
    /// none after it. The caller may read the change log meanwhile, on
    /// another connection. This, what the caller does before finishing, and
    /// the finish share the finish's bound ([`PreparedSnapshot::deadline`]);
    /// on PostgreSQL the finish's batches are bounded each, not by it (see
    /// [`PreparedSnapshot::finish`]).
    ///
    /// # Errors
    /// The database failed; nothing was applied.
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

/// A snapshot holding the writers' turn, not yet applied (see
/// [`SnapshotLoad::prepare`]); dropped unfinished, it rolls back and gives
/// the turn up.
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
    /// The change the snapshot's rows are stamped with: every row it writes,
    /// the floor's included, has this `change_seq`.
    pub fn seq(&self) -> i64 {
        self.seq
    }

    /// When the finish's bound runs out, counted from the prepare (on
    /// PostgreSQL, the bound of what comes before the finish).
    pub fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }

    /// The finish's bound, whole.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Applies the snapshot and commits; whether it changed any row. One that
    /// changed none (every entry and the floor above its version) stamped
    /// nothing with [`PreparedSnapshot::seq`], and SQLite hands that value
    /// to the next write. `listing`, the snapshot's ids encoded, is stored
    /// with it when it stamped at least [`LISTING_ROWS`] rows, where
    /// [`StatusStore::keeps_listings`], in place of any older one.
    ///
    /// # Errors
    /// The database failed; nothing was applied.
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
            // Its statements in batches, each bounded as one call (a
            // connection is held already: the statement's bound and a
            // second or so), the whole not: the number of batches grows
            // with the snapshot and with the set.
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

/// Distinct users of a delivery, and the floor row: the stored versions a
/// delivery is planned against.
fn users_of(items: &[StatusChange]) -> Vec<u64> {
    let mut users: Vec<u64> = items.iter().map(|i| i.user.get()).collect();
    users.push(FLOOR_USER);
    users.sort_unstable();
    users.dedup();
    users
}

/// Plans a delivery against the stored versions read with [`users_of`] (the
/// floor row among them).
fn plan(items: &[StatusChange], mut stored: HashMap<u64, u64>) -> (Applied, Vec<StatusChange>) {
    let floor = stored.remove(&FLOOR_USER).unwrap_or(0);
    crate::domain::plan_changes(items, &stored, floor)
}
