//! The reveal store: the reveal log in the database. Batches written with
//! their per-ad counts in one transaction (PostgreSQL: `COPY`; SQLite:
//! multi-row inserts), keyset pages read newest first, the counts of an ad,
//! and retention in small batches. Held by the flush and retention tasks and
//! by the reveal routes.
//!
//! The interface is here, with what both dialects share: a batch's per-ad
//! counts and the row a reveal is read back from ([`RevealRow`]). Each
//! dialect is a file of its own ([`sqlite`], [`postgres`]). SQLite keeps no index
//! entry per reveal: its indexes are the viewers' runs ([`viewer_runs`]) and
//! the sellers' postings ([`seller_postings`]), written by its flush in
//! multi-row inserts ([`inserts`]).
//!
//! Each reveal carries its reason ([`Reason`]: why it was of its kind) as the
//! integer [`Reason::encode`] gives, in a nullable integer column (`reason`,
//! migrations/sqlite/0010 and migrations/postgres/0007): at most 22 bits,
//! never text, NULL for a reveal recorded before reasons were kept. It holds
//! codes only (which source did not answer, on which verdict, where the answer
//! came from): no number and no phone digit is stored with it, as none is
//! with the rest of the row. Read back by [`Reason::decode`]; an integer it
//! does not decode (never written so) reads as no reason, and the first one a
//! process meets is logged ([`reason_of`]).

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

/// Per-ad counts of one batch: one row per (ad, kind) that occurs in it.
fn counts_of(reveals: &[Reveal]) -> Vec<(AdId, Source, u64)> {
    // foldhash: a flush of cold traffic hashes one new ad per reveal, and
    // SipHash cost about 200 instructions a reveal here (callgrind).
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

/// A row of `reveals` as both dialects read it: (id, at_us, viewer, user_id,
/// ad_id, category_id, kind, reason).
type RevealRow = (i64, i64, Option<String>, i64, i64, i64, String, Option<i64>);

/// The columns of a [`RevealRow`], as both dialects select them.
const REVEAL_COLUMNS: &str = "id, at_us, viewer, user_id, ad_id, category_id, kind, reason";

/// The integer a reveal's reason is stored as; NULL (`None`) without one.
fn reason_column(reveal: &Reveal) -> Option<i64> {
    reveal.reason.map(|reason| i64::from(reason.encode()))
}

/// Whether this process has logged a stored reason it could not decode.
static UNDECODED_LOGGED: AtomicBool = AtomicBool::new(false);

/// The reason a stored integer stands for. NULL is a reveal recorded before
/// reasons were kept. An integer [`Reason::decode`] does not take (never
/// written by [`Reason::encode`]: a row written by hand, or by a later version
/// with codes this one does not know) reads as no reason too, and the first
/// such a process meets is logged, so that a page never fails on one.
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

/// The reveal a row stands for; `None` for a row no reveal could hold.
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

/// The reveal store failed: the cause ([`StoreError`]), under a name of its own
/// so that a log or an answer says which store it was.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RevealStoreError(#[from] StoreError);

impl RevealStoreError {
    pub fn cause(&self) -> &StoreError {
        &self.0
    }
}

/// The reveal store's handle (see the module doc); made by
/// `Database::reveals`.
#[derive(Debug, Clone)]
pub struct RevealStore {
    backend: Backend,
    /// SQLite only: the connection the log is written on (flush and retention;
    /// see `database::connect_sqlite_log_writer`). Reads use the shared pool.
    sqlite_writer: Option<sqlx::SqlitePool>,
}

impl RevealStore {
    pub(super) fn of(backend: Backend, sqlite_writer: Option<sqlx::SqlitePool>) -> Self {
        RevealStore {
            backend,
            sqlite_writer,
        }
    }

    /// Whether the log is written in this process (SQLite, on connection
    /// threads of its own) rather than by a database server over sockets.
    pub fn is_embedded(&self) -> bool {
        matches!(self.backend, Backend::Sqlite(_))
    }

    /// The SQLite pool the log is written on: its own writer when it has one.
    fn sqlite_writer<'a>(&'a self, shared: &'a sqlx::SqlitePool) -> &'a sqlx::SqlitePool {
        self.sqlite_writer.as_ref().unwrap_or(shared)
    }

    /// Writes a batch of reveals and adds its per-ad counts, in one transaction.
    ///
    /// # Errors
    /// The database refused or is unreachable; nothing was written.
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

    /// One page of the log, newest first (at most `query.limit` rows).
    ///
    /// # Errors
    /// The database is unreachable.
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

    /// The counts of one ad, summed over every replica's flushes so far.
    ///
    /// # Errors
    /// The database is unreachable.
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
    /// database's clock; returns how many. Small batches keep each transaction
    /// (and its locks) short. On SQLite "the oldest" are the `batch` lowest
    /// ids, of them those older than `keep` (no index on time there): a short
    /// count does not mean nothing older is left, only none means that.
    ///
    /// The cutoff is the database's `now` less `keep`, computed in the statement:
    /// never this replica's clock, since one replica whose clock ran far ahead
    /// would delete every replica's recent reveals.
    ///
    /// # Errors
    /// The database is unreachable.
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
