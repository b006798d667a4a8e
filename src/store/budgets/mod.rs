//! The budget store: what each viewer spent per budget window, summed over the
//! fleet, and the viewers refused until a time (docs/budgets.md).

mod postgres;
mod sqlite;

use super::error::StoreError;
use super::pool::{Backend, on_connection};

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
/// before it (SQLite: 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Total {
    pub viewer: u64,
    pub kind: u8,
    pub window: u32,
    pub spent: u64,
    pub before: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub rows: u64,
    /// A statement deleted a full batch: there may be more.
    pub more: bool,
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BudgetStoreError(#[from] StoreError);

#[derive(Debug, Clone)]
pub struct BudgetStore {
    backend: Backend,
}

impl BudgetStore {
    pub(super) fn of(backend: Backend) -> Self {
        BudgetStore { backend }
    }

    /// Adds `spends` to the fleet's totals, in one transaction, and returns the
    /// totals after it. Rows are written in key order, so two replicas' reports
    /// cannot deadlock.
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

    /// Refusals to apply: with `all`, every one in force (at start); else those
    /// written in the last few seconds (none on SQLite: this replica wrote them).
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

    /// Marks this replica alive; how many replicas exchanged in the last
    /// `within_s` seconds, itself included (1 on SQLite).
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

    /// One batch of retention, in one short transaction; the caller repeats it
    /// while [`Pruned::more`].
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

    /// Rows in `viewer_budgets` (minute, day) and `viewer_refusals`, for tests.
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

/// One statement of a batch of retention. One kind of window at a time: a
/// range of the (kind, window_id) index a LIMIT stops early (an OR of both
/// kinds is a bitmap of every expired row on PostgreSQL, built each batch).
#[derive(Debug, Clone, Copy)]
enum Expired {
    Windows { kind: i16, before: i64 },
    Refusals { before_s: i64 },
}

/// (viewer, kind, window_id, spent, spent in the window before).
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
