//! The reveal store: the reveal log in the database, both dialects. Batches
//! written with their per-ad counts in one transaction (PostgreSQL: `COPY`;
//! SQLite: multi-row inserts), keyset pages read newest first, the counts of an
//! ad, and retention in small batches. Held by the flush and retention tasks
//! and by the reveal routes.

mod seller_postings;
#[cfg(test)]
mod test_support;
mod viewer_runs;

use super::StoreError;
use super::database::{Backend, signed, unsigned};
use crate::domain::{
    AdId, CategoryId, Reveal, RevealCounts, RevealQuery, RevealsOf, Source, StoredReveal, UserId,
    Viewer,
};

/// The most rows one SQLite insert takes: six parameters a row, under SQLite's
/// limit of 32,766 per statement. A batch goes in statements of a power of two
/// rows (4,096, then the binary digits of the rest: see [`sqlite_chunks`]), so
/// that a replica prepares at most thirteen statements and keeps them cached,
/// rather than a new one for each flush's last chunk.
const SQLITE_ROWS_PER_INSERT: usize = 4_096;

/// `items` in chunks of [`SQLITE_ROWS_PER_INSERT`], then of decreasing powers
/// of two: 10,000 rows are 4,096 + 4,096 + 1,024 + 512 + 256 + 16.
fn sqlite_chunks<T>(mut items: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        let n = SQLITE_ROWS_PER_INSERT.min(1 << items.len().ilog2());
        let (chunk, rest) = items.split_at(n);
        items = rest;
        Some(chunk)
    })
}

/// `head VALUES (?,..),.. tail`: an insert of `rows` rows of `columns` values,
/// written with `push_str` alone. sqlx's `QueryBuilder` writes each separator
/// through `write!`, seven a reveal, which with the sort was most of the flush
/// thread's profile at the hit path's maximum.
fn sqlite_insert(head: &str, columns: usize, rows: usize, tail: &str) -> String {
    let row = format!("({})", vec!["?"; columns].join(","));
    let mut sql = String::with_capacity(head.len() + 8 + rows * (row.len() + 1) + tail.len());
    sql.push_str(head);
    sql.push_str(" VALUES ");
    for i in 0..rows {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(&row);
    }
    sql.push_str(tail);
    sql
}

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

type RevealRow = (i64, i64, Option<String>, i64, i64, i64, String);

fn stored(row: RevealRow) -> Option<StoredReveal> {
    let (id, at_us, viewer, user, ad, category, kind) = row;
    Some(StoredReveal {
        id,
        reveal: Reveal {
            at_us,
            viewer: viewer.and_then(|v| Viewer::parse(v.as_bytes()).ok()),
            user: UserId::new(unsigned(user)).ok()?,
            ad: AdId::new(unsigned(ad)).ok()?,
            category: CategoryId::new(unsigned(category)).ok()?,
            kind: Source::from_name(&kind)?,
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
/// [`super::Database::reveals`].
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
        Ok(backend.call("write_reveals", async {
            match backend {
                Backend::Postgres(pg) => {
                    let mut tx = pg.begin().await?;
                    let mut copy = tx
                        .copy_in_raw(
                            "COPY reveals (at_us, viewer, user_id, ad_id, category_id, kind) \
                             FROM STDIN",
                        )
                        .await?;
                    copy.send(copy_text(reveals).as_bytes()).await?;
                    copy.finish().await?;
                    let ads: Vec<i64> = counts.iter().map(|c| signed(c.0.get())).collect();
                    let kinds: Vec<&str> = counts.iter().map(|c| c.1.as_str()).collect();
                    let ns: Vec<i64> = counts.iter().map(|c| signed(c.2)).collect();
                    sqlx::query(
                        "INSERT INTO ad_reveal_counts (ad_id, kind, n) \
                         SELECT * FROM UNNEST($1::int8[], $2::text[], $3::int8[]) \
                         ON CONFLICT (ad_id, kind) DO UPDATE SET n = ad_reveal_counts.n + excluded.n",
                    )
                    .persistent(false)
                    .bind(&ads)
                    .bind(&kinds)
                    .bind(&ns)
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                }
                Backend::Sqlite(pool) => {
                    // Sorted before the transaction: it takes the file's write
                    // lock, which status writes wait for (docs/status-sync.md).
                    let ordered = in_viewer_order(reveals);
                    let mut tx = self
                        .sqlite_writer(pool)
                        .begin_with(super::database::SQLITE_BEGIN_WRITE)
                        .await?;
                    // Ids given here rather than by SQLite, so the flush knows
                    // its viewers' runs and sellers' postings: the next after
                    // the largest a reveal, a run or a posting holds, so that
                    // an id is never reused while a run or posting not yet
                    // pruned still names it (when retention emptied the log,
                    // say). Runs and postings go in id order: the last is the
                    // largest.
                    let (first_id,): (i64,) = sqlx::query_as(
                        "SELECT max(\
                         coalesce((SELECT max(id) FROM reveals), 0), \
                         coalesce((SELECT last_id FROM reveal_viewer_runs ORDER BY id DESC LIMIT 1), 0), \
                         coalesce((SELECT last_id FROM reveal_seller_postings ORDER BY id DESC LIMIT 1), 0)\
                         ) + 1",
                    )
                    .fetch_one(&mut *tx)
                    .await?;
                    let by_viewer: Vec<(i64, &Reveal)> = (first_id..).zip(ordered).collect();
                    // `OR FAIL`: a statement that fails keeps the rows it
                    // inserted before, so SQLite keeps no statement journal
                    // for it (a copy of every page it touches, written to a
                    // temporary file); the transaction is what is atomic here,
                    // and on any error it is rolled back whole.
                    for chunk in sqlite_chunks(&by_viewer) {
                        let sql = sqlite_insert(
                            "INSERT OR FAIL INTO reveals (id, at_us, viewer, user_id, ad_id, category_id, kind)",
                            7,
                            chunk.len(),
                            "",
                        );
                        let mut query = sqlx::query(&sql);
                        for &(id, r) in chunk {
                            query = query
                                .bind(id)
                                .bind(r.at_us)
                                .bind(r.viewer.as_ref().map(Viewer::as_str))
                                .bind(signed(r.user.get()))
                                .bind(signed(r.ad.get()))
                                .bind(signed(r.category.get()))
                                .bind(r.kind.as_str());
                        }
                        query.execute(&mut *tx).await?;
                    }
                    viewer_runs::write(&mut tx, &viewer_runs::runs_of(&by_viewer)).await?;
                    seller_postings::write(&mut tx, &seller_postings::postings_of(&by_viewer))
                        .await?;
                    for chunk in sqlite_chunks(&counts) {
                        let sql = sqlite_insert(
                            "INSERT OR FAIL INTO ad_reveal_counts (ad_id, kind, n)",
                            3,
                            chunk.len(),
                            " ON CONFLICT (ad_id, kind) DO UPDATE SET n = ad_reveal_counts.n + excluded.n",
                        );
                        let mut query = sqlx::query(&sql);
                        for (ad, kind, n) in chunk {
                            query = query
                                .bind(signed(ad.get()))
                                .bind(kind.as_str())
                                .bind(signed(*n));
                        }
                        query.execute(&mut *tx).await?;
                    }
                    tx.commit().await?;
                }
            }
            Ok(())
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
        if let Backend::Sqlite(pool) = &self.backend {
            let rows = self
                .backend
                .read("read_reveals", async {
                    // One snapshot: runs or postings and their rows as of one
                    // commit.
                    let mut tx = pool.begin().await?;
                    let rows = match &query.of {
                        RevealsOf::Viewer(viewer) => {
                            viewer_runs::read_page(&mut tx, viewer.as_str(), query).await?
                        }
                        RevealsOf::Seller(user) => {
                            seller_postings::read_page(&mut tx, signed(user.get()), query).await?
                        }
                    };
                    tx.commit().await?;
                    Ok::<_, StoreError>(rows)
                })
                .await?;
            return Ok(rows.into_iter().filter_map(stored).collect());
        }
        let (column, key) = match &query.of {
            RevealsOf::Seller(user) => ("user_id", Key::Int(signed(user.get()))),
            RevealsOf::Viewer(viewer) => ("viewer", Key::Text(viewer.as_str().to_owned())),
        };
        let (after_at, after_id) = query.after.unwrap_or((i64::MAX, i64::MAX));
        // PostgreSQL: its indexes on (user_id, at_us, id) and (viewer, at_us,
        // id) serve the page; SQLite went through runs or postings above.
        let sql = format!(
            "SELECT id, at_us, viewer, user_id, ad_id, category_id, kind FROM reveals \
             WHERE {column} = $1 AND at_us >= $2 AND at_us < $3 AND (at_us, id) < ($4, $5) \
             ORDER BY at_us DESC, id DESC LIMIT $6"
        );
        let limit = i64::from(query.limit);
        let rows: Vec<RevealRow> = self
            .backend
            .read("read_reveals", async {
                Ok::<_, StoreError>(on_connection!(&self.backend, conn => {
                    let q = sqlx::query_as(&sql).persistent(false);
                    let q = match key {
                        Key::Int(v) => q.bind(v),
                        Key::Text(v) => q.bind(v),
                    };
                    q.bind(query.since_us)
                        .bind(query.until_us)
                        .bind(after_at)
                        .bind(after_id)
                        .bind(limit)
                        .fetch_all(&mut *conn)
                        .await?
                }))
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
        let deleted = self
            .backend
            .call("delete_reveals", async {
                Ok::<_, StoreError>(match &self.backend {
                    Backend::Postgres(pg) => {
                        // `now()` is the transaction's start, a moment ago.
                        let mut tx = pg.begin().await?;
                        let deleted = sqlx::query(
                            "DELETE FROM reveals WHERE id IN \
                             (SELECT id FROM reveals \
                              WHERE at_us < (EXTRACT(EPOCH FROM now()) * 1000000)::int8 - $1 \
                              ORDER BY at_us LIMIT $2)",
                        )
                        .persistent(false)
                        .bind(keep_us)
                        .bind(batch)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        tx.commit().await?;
                        deleted
                    }
                    Backend::Sqlite(pool) => {
                        // The oldest ids, of them those past the cutoff: ids grow
                        // with time (written in flush order), so no index on
                        // at_us is kept (migrations/sqlite/0006); the
                        // viewers' runs go with their reveals (0007). A row whose
                        // at_us is past the cutoff but behind a younger one (a
                        // wall clock stepped back) goes once that one does: late
                        // by the step, never early. Julian days to microseconds
                        // since the epoch (2440587.5 is 1970-01-01): `julianday`
                        // reads the clock in every SQLite.
                        let mut tx = self
                            .sqlite_writer(pool)
                            .begin_with(super::database::SQLITE_BEGIN_WRITE)
                            .await?;
                        let deleted = sqlx::query(
                            "DELETE FROM reveals WHERE id IN \
                             (SELECT id FROM reveals ORDER BY id LIMIT ?2) \
                             AND at_us < CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) - ?1",
                        )
                        .bind(keep_us)
                        .bind(batch)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                        prune_dead(&mut tx, "reveal_viewer_runs", batch).await?;
                        prune_dead(&mut tx, "reveal_seller_postings", batch).await?;
                        tx.commit().await?;
                        deleted
                    }
                })
            })
            .await?;
        Ok(deleted)
    }
}

/// Deletes up to `batch` of the oldest rows of `table` (SQLite's viewer runs
/// or seller postings) whose reveals are all gone, in retention's transaction
/// after its delete. Both go in order of their last id, as their reveals do,
/// so the dead ones are the oldest; a reveals batch leaves at most as many
/// dead ones as it deleted rows, so one batch each keeps up.
async fn prune_dead(
    conn: &mut sqlx::SqliteConnection,
    table: &'static str,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let sql = format!(
        "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT ?1) \
         AND last_id < coalesce((SELECT min(id) FROM reveals), 9223372036854775807)"
    );
    Ok(sqlx::query(&sql)
        .bind(batch)
        .execute(&mut *conn)
        .await?
        .rows_affected())
}

enum Key {
    Int(i64),
    Text(String),
}

/// The batch ordered by viewer (those without one first), then by seller and
/// time: each viewer's reveals of a flush are then one run of ids (see
/// [`viewer_runs`]). Ids still grow from one flush to the
/// next, so the log's order in time holds for retention within one flush
/// interval.
fn in_viewer_order(reveals: &[Reveal]) -> Vec<&Reveal> {
    // Each viewer's rank among the batch's viewers (0: none), so that the sort
    // of the batch compares integers: comparing the viewer ids themselves, a
    // reveal against a reveal, was most of the flush thread's profile (issue
    // 24). Only the few distinct ids are sorted as strings.
    let mut ranks: foldhash::HashMap<&str, usize> = foldhash::HashMap::default();
    for reveal in reveals {
        if let Some(viewer) = &reveal.viewer {
            ranks.entry(viewer.as_str()).or_default();
        }
    }
    let mut viewers: Vec<&str> = ranks.keys().copied().collect();
    viewers.sort_unstable();
    for (rank, viewer) in viewers.into_iter().enumerate() {
        ranks.insert(viewer, rank + 1);
    }
    let mut keyed: Vec<(usize, u64, i64, &Reveal)> = reveals
        .iter()
        .map(|r| {
            let viewer = r
                .viewer
                .as_ref()
                .map_or(0, |v| ranks.get(v.as_str()).copied().unwrap_or(0));
            (viewer, r.user.get(), r.at_us, r)
        })
        .collect();
    // Within a viewer, by seller and time: the sort that builds the sellers'
    // postings (seller_postings.rs) then meets its input nearly in order when
    // a flush has few viewers. Nothing reads ids as arrival order: pages order
    // by `at_us`, a run by its range, a posting by its entries.
    keyed.sort_unstable_by_key(|&(viewer, user, at_us, _)| (viewer, user, at_us));
    keyed.into_iter().map(|(.., r)| r).collect()
}

/// Reveals in COPY's text format: tab-separated, `\N` for null. Viewer ids are
/// visible ASCII, so a backslash is the one character that needs escaping.
/// Numbers go through `itoa`, and a viewer id is copied as it is unless it
/// holds a backslash: on PostgreSQL the flush runs on a request worker, where
/// `write!` went through the formatting machinery twice a reveal and the
/// escaping allocated a copy of every id.
fn copy_text(reveals: &[Reveal]) -> String {
    let mut text = String::with_capacity(reveals.len() * 64);
    let mut number = itoa::Buffer::new();
    for r in reveals {
        text.push_str(number.format(r.at_us));
        text.push('\t');
        match r.viewer.as_ref().map(Viewer::as_str) {
            Some(viewer) if viewer.contains('\\') => {
                text.push_str(&viewer.replace('\\', "\\\\"));
            }
            Some(viewer) => text.push_str(viewer),
            None => text.push_str("\\N"),
        }
        for id in [r.user.get(), r.ad.get(), r.category.get()] {
            text.push('\t');
            text.push_str(number.format(id));
        }
        text.push('\t');
        text.push_str(r.kind.as_str());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reveal of `of`, read page by page (`limit` a page) as the admin
    /// route's cursor walks them: newest first.
    async fn every_page(store: &RevealStore, of: RevealsOf, limit: u32) -> Vec<StoredReveal> {
        let mut all: Vec<StoredReveal> = Vec::new();
        loop {
            let page = store
                .read_reveals(&RevealQuery {
                    of: of.clone(),
                    since_us: i64::MIN,
                    until_us: i64::MAX,
                    after: all.last().map(|r| (r.reveal.at_us, r.id)),
                    limit,
                })
                .await
                .unwrap();
            if page.is_empty() {
                return all;
            }
            all.extend(page);
        }
    }

    fn reveal(ad: u64, kind: Source, viewer: Option<&str>) -> Reveal {
        Reveal {
            at_us: 1_700_000_000_000_000,
            viewer: viewer.map(|v| Viewer::parse(v.as_bytes()).unwrap()),
            user: UserId::new(42).unwrap(),
            ad: AdId::new(ad).unwrap(),
            category: CategoryId::new(9).unwrap(),
            kind,
        }
    }

    #[test]
    fn counts_are_one_row_per_ad_and_kind() {
        let batch = [
            reveal(1, Source::Real, None),
            reveal(1, Source::Real, None),
            reveal(2, Source::Anonymous, None),
            reveal(1, Source::Calltracking, None),
            reveal(1, Source::Real, None),
        ];
        let counts = counts_of(&batch);
        assert_eq!(counts.len(), 3);
        assert!(counts.contains(&(AdId::new(1).unwrap(), Source::Real, 3)));
        assert!(counts.contains(&(AdId::new(1).unwrap(), Source::Calltracking, 1)));
        assert!(counts.contains(&(AdId::new(2).unwrap(), Source::Anonymous, 1)));
    }

    #[test]
    fn an_insert_has_a_placeholder_per_value() {
        assert_eq!(
            sqlite_insert("INSERT INTO t (a, b)", 2, 3, " ON CONFLICT DO NOTHING"),
            "INSERT INTO t (a, b) VALUES (?,?),(?,?),(?,?) ON CONFLICT DO NOTHING"
        );
    }

    /// Viewers in order (so a flush is one run per viewer), those without
    /// one first, and within a viewer by seller and time.
    #[test]
    fn a_flush_is_grouped_by_viewer_then_seller_and_time() {
        let at = |r: &Reveal, n: i64, user: u64| Reveal {
            at_us: r.at_us + n,
            user: UserId::new(user).unwrap(),
            ..r.clone()
        };
        let (b, a) = (
            reveal(1, Source::Real, Some("b")),
            reveal(1, Source::Real, Some("a")),
        );
        let none = reveal(1, Source::Real, None);
        let batch = [
            at(&b, 5, 7),
            at(&a, 4, 9),
            at(&none, 3, 8),
            at(&b, 2, 6),
            at(&a, 1, 9),
            at(&b, 0, 7),
        ];
        let order: Vec<(Option<&str>, u64, i64)> = in_viewer_order(&batch)
            .into_iter()
            .map(|r| {
                let viewer = r.viewer.as_ref().map(Viewer::as_str);
                (viewer, r.user.get(), r.at_us - none.at_us)
            })
            .collect();
        assert_eq!(
            order,
            [
                (None, 8, 3),
                (Some("a"), 9, 1),
                (Some("a"), 9, 4),
                (Some("b"), 6, 2),
                (Some("b"), 7, 0),
                (Some("b"), 7, 5),
            ]
        );
    }

    /// One flush is written in viewer order (for the viewer index), not in
    /// the order of time: pages still come newest first, by seller and by
    /// viewer, and a cursor walks them without a gap or a repeat.
    #[tokio::test]
    async fn a_flush_in_viewer_order_still_pages_newest_first() {
        let (_dir, database) = crate::store::Database::scratch().await;
        let store = database.reveals();
        // Twelve reveals a microsecond apart, viewers c, b, a, none, c, b, ...
        let viewers = [Some("c"), Some("b"), Some("a"), None];
        let batch: Vec<Reveal> = (0..12u64)
            .map(|n| Reveal {
                at_us: 1_700_000_000_000_000 + i64::try_from(n).unwrap(),
                ..reveal(100 + n, Source::Real, viewers[(n % 4) as usize])
            })
            .collect();
        store.write_reveals(&batch).await.unwrap();
        let ads = |reveals: Vec<StoredReveal>| -> Vec<u64> {
            reveals.iter().map(|r| r.reveal.ad.get()).collect()
        };
        let by_seller =
            ads(every_page(&store, RevealsOf::Seller(UserId::new(42).unwrap()), 2).await);
        assert_eq!(by_seller, (100..112).rev().collect::<Vec<u64>>());
        let by_viewer =
            ads(every_page(&store, RevealsOf::Viewer(Viewer::parse(b"b").unwrap()), 2).await);
        assert_eq!(by_viewer, [109, 105, 101]);
    }

    /// A flush of several statements (10,000 reveals: six chunks) writes every
    /// row and counts each exactly, in one transaction.
    #[tokio::test]
    async fn a_flush_of_many_chunks_writes_and_counts_every_reveal() {
        let (_dir, database) = crate::store::Database::scratch().await;
        let store = database.reveals();
        let batch: Vec<Reveal> = (0..10_000u64)
            .map(|n| reveal(1 + n % 3, Source::Real, Some("v")))
            .collect();
        store.write_reveals(&batch).await.unwrap();
        let mut total = 0;
        for ad in 1..=3 {
            total += store
                .ad_reveal_counts(AdId::new(ad).unwrap())
                .await
                .unwrap()
                .total();
        }
        assert_eq!(total, 10_000);
        let rows = every_page(
            &store,
            RevealsOf::Viewer(Viewer::parse(b"v").unwrap()),
            1000,
        )
        .await
        .len();
        assert_eq!(rows, 10_000);
    }

    #[test]
    fn sqlite_chunks_are_powers_of_two_at_most_the_limit() {
        let rows: Vec<u32> = (0..10_000).collect();
        let sizes: Vec<usize> = sqlite_chunks(&rows).map(<[u32]>::len).collect();
        assert_eq!(sizes, [4_096, 4_096, 1_024, 512, 256, 16]);
        let again: Vec<u32> = sqlite_chunks(&rows).flatten().copied().collect();
        assert_eq!(again, rows, "every row once, in order");
        assert_eq!(sqlite_chunks::<u32>(&[]).count(), 0);
        assert_eq!(
            sqlite_chunks(&[1]).map(<[i32]>::len).collect::<Vec<_>>(),
            [1]
        );
    }

    #[test]
    fn copy_text_escapes_and_marks_nulls() {
        let text = copy_text(&[
            reveal(1, Source::Real, Some("a\\b")),
            reveal(2, Source::Anonymous, None),
            reveal(3, Source::Calltracking, Some("v-1")),
        ]);
        assert_eq!(
            text,
            "1700000000000000\ta\\\\b\t42\t1\t9\treal\n1700000000000000\t\\N\t42\t2\t9\tanonymous\n\
             1700000000000000\tv-1\t42\t3\t9\tcalltracking\n"
        );
    }

    /// Migration 0008 rebuilds the per-ad counts `WITHOUT ROWID`: counts a
    /// replica wrote before it are all there after it, and the table has no
    /// rowid any more.
    #[tokio::test]
    async fn the_counts_survive_their_rebuild_without_rowid() {
        let (_dir, pool) = test_support::migrated_before(8).await;
        sqlx::raw_sql(
            "INSERT INTO ad_reveal_counts (ad_id, kind, n) \
             VALUES (7, 'real', 3), (7, 'anonymous', 1), (9, 'calltracking', 12)",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::raw_sql(&test_support::migration(8))
            .execute(&pool)
            .await
            .unwrap();
        let counts: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT ad_id, kind, n FROM ad_reveal_counts ORDER BY ad_id, kind")
                .fetch_all(&pool)
                .await
                .unwrap();
        let expected = [(7, "anonymous", 1), (7, "real", 3), (9, "calltracking", 12)];
        let expected: Vec<(i64, String, i64)> = expected
            .into_iter()
            .map(|(ad, kind, n)| (ad, kind.to_owned(), n))
            .collect();
        assert_eq!(counts, expected);
        let rowid = sqlx::query("SELECT rowid FROM ad_reveal_counts")
            .fetch_all(&pool)
            .await;
        assert!(rowid.is_err(), "the table still has a rowid");
    }
}
