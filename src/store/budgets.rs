//! The budget store: what each viewer spent per budget window, summed over the
//! fleet, and the viewers refused until a time (docs/abuse.md), both dialects.
//! Held by the budgets' exchange task, which calls it once per
//! `rate_limit.exchange_interval_ms`: one upsert for every viewer the replica
//! served in the interval (in chunks the caller sizes, each its own
//! transaction), never a write per request; and by its retention, one small
//! batch a transaction (`budget::retention`).

use sqlx::{QueryBuilder, Sqlite};

use super::StoreError;
use super::database::{Backend, SQLITE_BEGIN_WRITE};

/// Four parameters a row, under SQLite's limit of 32,766 per statement.
const SQLITE_ROWS_PER_INSERT: usize = 8_000;
/// How far back each exchange reads refusals others wrote. Longer than an
/// exchange interval and its bounded call, so a refusal committed a little
/// after it was stamped is still read; read again at most a few times.
const RECENT_REFUSALS_S: f64 = 10.0;

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

/// The budget store failed: the cause ([`StoreError`]), named as this store's.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BudgetStoreError(#[from] StoreError);

/// The budget store's handle (see the module doc); made by
/// [`super::Database::budgets`].
#[derive(Debug, Clone)]
pub struct BudgetStore {
    backend: Backend,
}

// Viewers are stored as the signed bit pattern of their 64-bit key.
#[allow(clippy::cast_possible_wrap, reason = "a bit pattern, both ways")]
fn key(viewer: u64) -> i64 {
    viewer as i64
}
#[allow(clippy::cast_sign_loss, reason = "a bit pattern, both ways")]
fn viewer_of(key: i64) -> u64 {
    key as u64
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
        Ok(backend
            .call("report_budgets", async {
                match backend {
                    Backend::Postgres(pg) => {
                        let viewers: Vec<i64> = spends.iter().map(|s| key(s.viewer)).collect();
                        let kinds: Vec<i16> = spends.iter().map(|s| i16::from(s.kind)).collect();
                        let windows: Vec<i64> =
                            spends.iter().map(|s| i64::from(s.window)).collect();
                        let ns: Vec<i64> = spends.iter().map(|s| i64::from(s.n)).collect();
                        let mut tx = pg.begin().await?;
                        // The window before is looked up by the primary key's
                        // (viewer, kind) prefix: `window_id + 0` keeps the
                        // planner off the (kind, window_id) index, which it
                        // takes whenever a new window is past its statistics
                        // (window ids only grow) and which scans the whole
                        // window for each row: a report of a few thousand
                        // spends over a busy window then outlasts any
                        // statement bound (docs/abuse.md).
                        let rows: Vec<(i64, i16, i64, i64, i64)> = sqlx::query_as(
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
                        Ok(rows.into_iter().map(total).collect())
                    }
                    Backend::Sqlite(pool) => {
                        let mut tx = pool.begin_with(SQLITE_BEGIN_WRITE).await?;
                        let mut totals = Vec::with_capacity(spends.len());
                        for chunk in spends.chunks(SQLITE_ROWS_PER_INSERT) {
                            let mut query = QueryBuilder::<Sqlite>::new(
                                "INSERT INTO viewer_budgets (viewer, kind, window_id, spent) ",
                            );
                            query.push_values(chunk, |mut b, s| {
                                b.push_bind(key(s.viewer))
                                    .push_bind(i64::from(s.kind))
                                    .push_bind(i64::from(s.window))
                                    .push_bind(i64::from(s.n));
                            });
                            query.push(
                                " ON CONFLICT (viewer, kind, window_id) \
                                 DO UPDATE SET spent = viewer_budgets.spent + excluded.spent \
                                 RETURNING viewer, kind, window_id, spent, 0",
                            );
                            let rows: Vec<(i64, i16, i64, i64, i64)> =
                                query.build_query_as().fetch_all(&mut *tx).await?;
                            totals.extend(rows.into_iter().map(total));
                        }
                        tx.commit().await?;
                        Ok(totals)
                    }
                }
            })
            .await?)
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
                    Backend::Postgres(pg) => {
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
                    }
                    Backend::Sqlite(pool) => {
                        let mut tx = pool.begin_with(SQLITE_BEGIN_WRITE).await?;
                        for chunk in refusals.chunks(SQLITE_ROWS_PER_INSERT) {
                            let mut query = QueryBuilder::<Sqlite>::new(
                                "INSERT INTO viewer_refusals (viewer, until_s) ",
                            );
                            query.push_values(chunk, |mut b, r| {
                                b.push_bind(key(r.0)).push_bind(seconds(r.1));
                            });
                            query.push(
                                " ON CONFLICT (viewer) DO UPDATE \
                                 SET until_s = MAX(viewer_refusals.until_s, excluded.until_s)",
                            );
                            query.build().execute(&mut *tx).await?;
                        }
                        tx.commit().await?;
                    }
                }
                Ok(())
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
        let rows: Vec<(i64, i64)> = match (&self.backend, all) {
            (Backend::Sqlite(_), false) => Vec::new(),
            (Backend::Sqlite(pool), true) => {
                self.backend
                    .read("read_refusals", async {
                        Ok::<_, StoreError>(
                            sqlx::query_as(
                                "SELECT viewer, until_s FROM viewer_refusals WHERE until_s > $1",
                            )
                            .bind(seconds(now_s))
                            .fetch_all(pool)
                            .await?,
                        )
                    })
                    .await?
            }
            (Backend::Postgres(pg), all) => {
                let sql = if all {
                    "SELECT viewer, until_s FROM viewer_refusals WHERE until_s > $1"
                } else {
                    "SELECT viewer, until_s FROM viewer_refusals \
                     WHERE at > clock_timestamp() - make_interval(secs => $2) AND until_s > $1"
                };
                self.backend
                    .read("read_refusals", async {
                        let mut tx = pg.begin().await?;
                        let query = sqlx::query_as(sql).persistent(false).bind(seconds(now_s));
                        let query = if all {
                            query
                        } else {
                            query.bind(RECENT_REFUSALS_S)
                        };
                        let rows = query.fetch_all(&mut *tx).await?;
                        tx.commit().await?;
                        Ok::<_, StoreError>(rows)
                    })
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
        let others: i64 = self
            .backend
            .call("budget_replicas", async {
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
                Ok::<_, StoreError>(others)
            })
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
        // One kind at a time: a plain range of the (kind, window_id) index,
        // which a LIMIT stops early (an OR of both kinds is a bitmap of every
        // expired row on PostgreSQL, built again for each batch).
        let (windows, refusals, replicas) = match &self.backend {
            Backend::Postgres(_) => (
                "DELETE FROM viewer_budgets WHERE ctid = ANY (ARRAY(SELECT ctid FROM viewer_budgets \
                 WHERE kind = $1 AND window_id < $2 LIMIT $3))",
                "DELETE FROM viewer_refusals WHERE ctid = ANY (ARRAY(SELECT ctid FROM viewer_refusals \
                 WHERE until_s < $1 LIMIT $2))",
                Some("DELETE FROM budget_replicas WHERE seen_at < now() - interval '1 hour'"),
            ),
            Backend::Sqlite(_) => (
                "DELETE FROM viewer_budgets WHERE (viewer, kind, window_id) IN \
                 (SELECT viewer, kind, window_id FROM viewer_budgets \
                  WHERE kind = $1 AND window_id < $2 LIMIT $3)",
                "DELETE FROM viewer_refusals WHERE viewer IN (SELECT viewer FROM viewer_refusals \
                 WHERE until_s < $1 LIMIT $2)",
                None,
            ),
        };
        let batch = batch.max(1);
        let full = |n: u64| i64::try_from(n).unwrap_or(i64::MAX) >= batch;
        let backend = &self.backend;
        Ok(backend
            .call("prune_budgets", async {
                let mut pruned = Pruned::default();
                let mut note = |n: u64| {
                    pruned.rows += n;
                    pruned.more |= full(n);
                };
                match backend {
                    Backend::Postgres(pg) => {
                        let mut tx = pg.begin().await?;
                        for (kind, before) in [(0i16, minute), (1, day)] {
                            note(
                                sqlx::query(windows)
                                    .persistent(false)
                                    .bind(kind)
                                    .bind(i64::from(before))
                                    .bind(batch)
                                    .execute(&mut *tx)
                                    .await?
                                    .rows_affected(),
                            );
                        }
                        note(
                            sqlx::query(refusals)
                                .persistent(false)
                                .bind(seconds(now_s))
                                .bind(batch)
                                .execute(&mut *tx)
                                .await?
                                .rows_affected(),
                        );
                        if let Some(replicas) = replicas {
                            pruned.rows += sqlx::query(replicas)
                                .persistent(false)
                                .execute(&mut *tx)
                                .await?
                                .rows_affected();
                        }
                        tx.commit().await?;
                    }
                    Backend::Sqlite(pool) => {
                        let mut tx = pool.begin_with(SQLITE_BEGIN_WRITE).await?;
                        for (kind, before) in [(0i64, minute), (1, day)] {
                            note(
                                sqlx::query(windows)
                                    .bind(kind)
                                    .bind(i64::from(before))
                                    .bind(batch)
                                    .execute(&mut *tx)
                                    .await?
                                    .rows_affected(),
                            );
                        }
                        note(
                            sqlx::query(refusals)
                                .bind(seconds(now_s))
                                .bind(batch)
                                .execute(&mut *tx)
                                .await?
                                .rows_affected(),
                        );
                        tx.commit().await?;
                    }
                }
                Ok::<_, StoreError>(pruned)
            })
            .await?)
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

/// What one batch of retention deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub rows: u64,
    /// A statement deleted a full batch: there may be more.
    pub more: bool,
}

fn total((viewer, kind, window, spent, before): (i64, i16, i64, i64, i64)) -> Total {
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
