//! The budget store: what each viewer spent per budget window, summed over the
//! fleet, and the viewers refused until a time (docs/budgets.md).
//! Held by the budgets' exchange task, which calls it once per
//! `rate_limit.exchange_interval_ms`: one upsert for every viewer the replica
//! served in the interval (in chunks the caller sizes, each its own
//! transaction), never a write per request; and by its retention, one small
//! batch a transaction (`budget::retention`).
//!
//! The interface is here, with the rows both dialects read and write (a
//! spend, a total, a retention batch and their columns); each dialect's SQL
//! is in its own file ([`sqlite`], [`postgres`]).

mod postgres;
mod sqlite;

use super::error::StoreError;
use super::pool::{Backend, on_connection};

/// What one replica spent on one viewer in one window since its last report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spend {
    /// The viewer's fleet key (a hash of the id, the same on every replica).
    pub viewer: u64,
    /// 0: the minute budget; 1: the day budget.
    pub kind: u8,
    pub window: u32,
    pub n: u32,
}

/// The fleet's total of one viewer's window after a report, and of the window
/// before it (PostgreSQL; SQLite, one replica, reports what it knows: 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Total {
    pub viewer: u64,
    pub kind: u8,
    pub window: u32,
    pub spent: u64,
    pub before: u64,
}

/// What one batch of retention deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub rows: u64,
    /// A statement deleted a full batch: there may be more.
    pub more: bool,
}

/// The budget store failed: the cause ([`StoreError`]), named as this store's.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BudgetStoreError(#[from] StoreError);

/// The budget store's handle (see the module doc); made by
/// `Database::budgets`.
#[derive(Debug, Clone)]
pub struct BudgetStore {
    backend: Backend,
}

impl BudgetStore {
    pub(super) fn of(backend: Backend) -> Self {
        BudgetStore { backend }
    }

    /// Adds `spends` to the fleet's totals, in one transaction, and returns the
    /// totals after it. Rows are written in key order, so two replicas'
    /// reports cannot deadlock. One statement on PostgreSQL: the caller keeps
    /// a report to a few thousand spends (`budget::exchange`), far inside
    /// `database.statement_timeout_ms`.
    ///
    /// # Errors
    /// The database refused or is unreachable; nothing was added.
    pub async fn report(&self, spends: &[Spend]) -> Result<Vec<Total>, BudgetStoreError> {
        if spends.is_empty() {
            return Ok(Vec::new());
        }
        let mut spends = spends.to_vec();
        spends.sort_unstable_by_key(|s| (key(s.viewer), s.kind, s.window));
        let backend = &self.backend;
        let rows = backend
            .call("report_budgets", async {
                match backend {
                    Backend::Postgres(pg) => postgres::report(pg, &spends).await,
                    Backend::Sqlite(pool) => sqlite::report(pool, &spends).await,
                }
            })
            .await?;
        Ok(rows.into_iter().map(total).collect())
    }

    /// Refuses each viewer until the given second (kept if already later).
    ///
    /// # Errors
    /// The database refused or is unreachable.
    pub async fn refuse(&self, refusals: &[(u64, u64)]) -> Result<(), BudgetStoreError> {
        if refusals.is_empty() {
            return Ok(());
        }
        let mut refusals = refusals.to_vec();
        refusals.sort_unstable_by_key(|&(viewer, _)| key(viewer));
        refusals.dedup_by_key(|&mut (viewer, _)| viewer);
        let backend = &self.backend;
        Ok(backend
            .call("refuse_viewers", async {
                match backend {
                    Backend::Postgres(pg) => postgres::refuse(pg, &refusals).await,
                    Backend::Sqlite(pool) => sqlite::refuse(pool, &refusals).await,
                }
            })
            .await?)
    }

    /// Refusals to apply: with `all`, every one still in force at `now_s` (at
    /// start); otherwise those written in the last few seconds (each
    /// exchange; PostgreSQL only: on SQLite this replica wrote them itself).
    ///
    /// # Errors
    /// The database is unreachable.
    pub async fn refusals(
        &self,
        all: bool,
        now_s: u64,
    ) -> Result<Vec<(u64, u64)>, BudgetStoreError> {
        let rows = match (&self.backend, all) {
            (Backend::Sqlite(_), false) => Vec::new(),
            (Backend::Sqlite(pool), true) => {
                self.backend
                    .read("read_refusals", sqlite::refusals(pool, now_s))
                    .await?
            }
            (Backend::Postgres(pg), all) => {
                self.backend
                    .read("read_refusals", postgres::refusals(pg, all, now_s))
                    .await?
            }
        };
        Ok(rows
            .into_iter()
            .map(|(viewer, until)| (viewer_of(viewer), u64::try_from(until).unwrap_or(0)))
            .collect())
    }

    /// Marks this replica as alive and returns how many replicas exchanged in
    /// the last `within_s` seconds, itself included (1 on SQLite).
    ///
    /// # Errors
    /// The database is unreachable.
    pub async fn replicas(&self, replica: u64, within_s: u32) -> Result<u32, BudgetStoreError> {
        let Backend::Postgres(pg) = &self.backend else {
            return Ok(1);
        };
        let others = self
            .backend
            .call("budget_replicas", postgres::replicas(pg, replica, within_s))
            .await?;
        Ok(u32::try_from(others).unwrap_or(u32::MAX).saturating_add(1))
    }

    /// One batch of retention, in one short transaction: at most `batch`
    /// minute rows of windows before `minute`, as many day rows of days before
    /// `day`, as many refusals that ended before `now_s` (and, on PostgreSQL,
    /// the replicas not seen for an hour). The caller repeats it while
    /// [`Pruned::more`] says a statement found a full batch.
    ///
    /// # Errors
    /// The database refused or is unreachable; what earlier batches deleted
    /// stays deleted.
    pub async fn prune(
        &self,
        minute: u32,
        day: u32,
        now_s: u64,
        batch: i64,
    ) -> Result<Pruned, BudgetStoreError> {
        let expired = [
            Expired::Windows {
                kind: 0,
                before: i64::from(minute),
            },
            Expired::Windows {
                kind: 1,
                before: i64::from(day),
            },
            Expired::Refusals {
                before_s: seconds(now_s),
            },
        ];
        let batch = batch.max(1);
        let backend = &self.backend;
        let (deleted, replicas) = backend
            .call("prune_budgets", async {
                match backend {
                    Backend::Postgres(pg) => postgres::prune(pg, &expired, batch).await,
                    Backend::Sqlite(pool) => Ok((sqlite::prune(pool, &expired, batch).await?, 0)),
                }
            })
            .await?;
        let full = |n: u64| i64::try_from(n).unwrap_or(i64::MAX) >= batch;
        Ok(Pruned {
            rows: deleted.iter().sum::<u64>() + replicas,
            more: deleted.into_iter().any(full),
        })
    }

    /// Rows in `viewer_budgets` (minute rows, day rows) and in
    /// `viewer_refusals`: for tests and the retention bench.
    ///
    /// # Errors
    /// The database is unreachable.
    pub async fn rows(&self) -> Result<(u64, u64, u64), BudgetStoreError> {
        let query = "SELECT \
             (SELECT count(*) FROM viewer_budgets WHERE kind = 0), \
             (SELECT count(*) FROM viewer_budgets WHERE kind = 1), \
             (SELECT count(*) FROM viewer_refusals)";
        let (minutes, days, refusals): (i64, i64, i64) = self
            .backend
            .read("count_budgets", async {
                Ok::<_, StoreError>(on_connection!(&self.backend, conn => {
                    sqlx::query_as(query).persistent(false).fetch_one(&mut *conn).await?
                }))
            })
            .await?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok((n(minutes), n(days), n(refusals)))
    }
}

/// One statement of a batch of retention: at most a batch of the rows it
/// names. One kind of window at a time: a plain range of the (kind,
/// window_id) index, which a LIMIT stops early (an OR of both kinds is a
/// bitmap of every expired row on PostgreSQL, built again for each batch).
#[derive(Debug, Clone, Copy)]
enum Expired {
    /// The windows of `kind` before `before`.
    Windows { kind: i16, before: i64 },
    /// The refusals that ended before `before_s`.
    Refusals { before_s: i64 },
}

/// A total as both dialects return it: (viewer, kind, window_id, spent,
/// spent in the window before).
type TotalRow = (i64, i16, i64, i64, i64);

// Viewers are stored as the signed bit pattern of their 64-bit key.
#[allow(clippy::cast_possible_wrap, reason = "a bit pattern, both ways")]
fn key(viewer: u64) -> i64 {
    viewer as i64
}
#[allow(clippy::cast_sign_loss, reason = "a bit pattern, both ways")]
fn viewer_of(key: i64) -> u64 {
    key as u64
}

fn total((viewer, kind, window, spent, before): TotalRow) -> Total {
    Total {
        viewer: viewer_of(viewer),
        kind: u8::try_from(kind).unwrap_or(u8::MAX),
        window: u32::try_from(window).unwrap_or(u32::MAX),
        spent: u64::try_from(spent).unwrap_or(0),
        before: u64::try_from(before).unwrap_or(0),
    }
}

fn seconds(s: u64) -> i64 {
    i64::try_from(s).unwrap_or(i64::MAX)
}
