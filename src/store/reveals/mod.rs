//! The reveal store: the reveal log in the database (docs/reveal-log.md). A
//! reveal's reason is stored as the integer [`Reason::encode`] gives: codes
//! only, never a number or a phone digit.

mod buckets;
mod inserts;
mod postgres;
mod seller_postings;
mod sqlite;
#[cfg(test)]
mod tests;
mod viewer_runs;

use std::sync::atomic::{AtomicBool, Ordering};

use super::error::StoreError;
use super::pool::{Backend, on_connection, signed, unsigned};
use crate::domain::reason::Reason;
use crate::domain::{
    AdId, CategoryId, Reveal, RevealCounts, RevealQuery, Source, StoredReveal, UserId, Viewer,
};

fn counts_of(reveals: &[Reveal]) -> Vec<(AdId, Source, u64)> {
    // foldhash: a flush of cold traffic hashes one new ad per reveal.
    let mut counts: foldhash::HashMap<(AdId, Source), u64> =
        foldhash::HashMap::with_capacity_and_hasher(reveals.len().min(1 << 16), Default::default());
    for reveal in reveals {
        *counts.entry((reveal.ad, reveal.kind)).or_default() += 1;
    }
    let mut counts: Vec<_> = counts
        .into_iter()
        .map(|((ad, kind), n)| (ad, kind, n))
        .collect();
    counts.sort_unstable_by_key(|&(ad, kind, _)| (ad, kind.as_str()));
    counts
}

/// (id, at_us, viewer, user_id, ad_id, category_id, kind, reason).
type RevealRow = (i64, i64, Option<String>, i64, i64, i64, String, Option<i64>);

const REVEAL_COLUMNS: &str = "id, at_us, viewer, user_id, ad_id, category_id, kind, reason";

fn reason_column(reveal: &Reveal) -> Option<i64> {
    reveal.reason.map(|reason| i64::from(reason.encode()))
}

static UNDECODED_LOGGED: AtomicBool = AtomicBool::new(false);

/// The reason a stored integer stands for: one that does not decode (never
/// written so) reads as none, the first logged, so a page never fails on one.
fn reason_of(column: Option<i64>) -> Option<Reason> {
    let bits = column?;
    let reason = u32::try_from(bits).ok().and_then(Reason::decode);
    if reason.is_none() && !UNDECODED_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            bits,
            "reveals: a stored reason does not decode; read as none (logged once)"
        );
    }
    reason
}

fn stored(row: RevealRow) -> Option<StoredReveal> {
    let (id, at_us, viewer, user, ad, category, kind, reason) = row;
    Some(StoredReveal {
        id,
        reveal: Reveal {
            at_us,
            viewer: viewer.and_then(|v| Viewer::parse(v.as_bytes()).ok()),
            user: UserId::new(unsigned(user)).ok()?,
            ad: AdId::new(unsigned(ad)).ok()?,
            category: CategoryId::new(unsigned(category)).ok()?,
            kind: Source::from_name(&kind)?,
            reason: reason_of(reason),
        },
    })
}

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RevealStoreError(#[from] StoreError);

impl RevealStoreError {
    pub fn cause(&self) -> &StoreError {
        &self.0
    }
}

#[derive(Debug, Clone)]
pub struct RevealStore {
    backend: Backend,
    /// SQLite only: the connection the log is written on (flush, retention).
    sqlite_writer: Option<sqlx::SqlitePool>,
}

impl RevealStore {
    pub(super) fn of(backend: Backend, sqlite_writer: Option<sqlx::SqlitePool>) -> Self {
        RevealStore {
            backend,
            sqlite_writer,
        }
    }

    /// Whether the log is written in this process (SQLite).
    pub fn is_embedded(&self) -> bool {
        matches!(self.backend, Backend::Sqlite(_))
    }

    fn sqlite_writer<'a>(&'a self, shared: &'a sqlx::SqlitePool) -> &'a sqlx::SqlitePool {
        self.sqlite_writer.as_ref().unwrap_or(shared)
    }

    /// Writes a batch and adds its per-ad counts, in one transaction.
    pub async fn write_reveals(&self, reveals: &[Reveal]) -> Result<(), RevealStoreError> {
        if reveals.is_empty() {
            return Ok(());
        }
        let counts = counts_of(reveals);
        let backend = &self.backend;
        Ok(backend
            .call("write_reveals", async {
                match backend {
                    Backend::Postgres(pg) => postgres::write(pg, reveals, &counts).await,
                    Backend::Sqlite(pool) => {
                        sqlite::write(self.sqlite_writer(pool), reveals, &counts).await
                    }
                }
            })
            .await?)
    }

    pub async fn read_reveals(
        &self,
        query: &RevealQuery,
    ) -> Result<Vec<StoredReveal>, RevealStoreError> {
        let backend = &self.backend;
        let rows = backend
            .read("read_reveals", async {
                match backend {
                    Backend::Postgres(pg) => postgres::read(pg, query).await,
                    Backend::Sqlite(pool) => sqlite::read(pool, query).await,
                }
            })
            .await?;
        Ok(rows.into_iter().filter_map(stored).collect())
    }

    /// The counts of one ad, summed over every replica's flushes.
    pub async fn ad_reveal_counts(&self, ad: AdId) -> Result<RevealCounts, RevealStoreError> {
        let sql = "SELECT kind, n FROM ad_reveal_counts WHERE ad_id = $1";
        let rows: Vec<(String, i64)> = self
            .backend
            .read("ad_reveal_counts", async {
                Ok::<_, StoreError>(on_connection!(&self.backend, conn => {
                    sqlx::query_as(sql)
                        .persistent(false)
                        .bind(signed(ad.get()))
                        .fetch_all(&mut *conn)
                        .await?
                }))
            })
            .await?;
        let mut counts = RevealCounts::default();
        for (kind, n) in rows {
            if let Some(kind) = Source::from_name(&kind) {
                counts.add(kind, unsigned(n));
            }
        }
        Ok(counts)
    }

    /// Deletes up to `batch` of the oldest reveals older than `keep` by the
    /// database's clock, never this replica's (one running ahead would delete
    /// every replica's recent ones); returns how many. On SQLite, of the `batch`
    /// lowest ids those older: only none means nothing older is left.
    pub async fn delete_reveals_older_than(
        &self,
        keep: std::time::Duration,
        batch: i64,
    ) -> Result<u64, RevealStoreError> {
        let keep_us = i64::try_from(keep.as_micros()).unwrap_or(i64::MAX);
        let backend = &self.backend;
        Ok(backend
            .call("delete_reveals", async {
                match backend {
                    Backend::Postgres(pg) => postgres::delete_older_than(pg, keep_us, batch).await,
                    Backend::Sqlite(pool) => {
                        sqlite::delete_older_than(self.sqlite_writer(pool), keep_us, batch).await
                    }
                }
            })
            .await?)
    }
}
