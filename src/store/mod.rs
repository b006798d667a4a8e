//! Durable storage of the call-tracking status set, through sqlx: SQLite (one
//! replica, the embedded default) or PostgreSQL (a cluster), behind one [`Store`].
//!
//! Every write is one transaction that stamps the rows it changes with the next
//! *change sequence* value. Writers are serialised (PostgreSQL: a transaction-level
//! advisory lock taken before the sequence value; SQLite: its single writer), so
//! sequence values become visible in order and a reader that asks for "changes
//! after (seq, user)" can never skip a row. That question, [`Store::changes_after`],
//! is the only way memory learns about changes: at start-up, after a local write,
//! on a PostgreSQL notification, and on a short poll.

/// Runs one query-building expression on whichever database this store holds
/// (sqlx's query types differ per database, so one function cannot take both),
/// with `$conn` the connection to run it on: on PostgreSQL a transaction, a
/// lone statement too, so that it is pooler-safe (see [`Pg`]); on SQLite a
/// pooled connection, a lone statement being atomic there. Evaluates to the
/// expression's value, or returns the error.
macro_rules! on_connection {
    ($store:expr, $conn:ident => $query:expr) => {
        match $store {
            Store::Postgres(Pg { pool, .. }) => {
                let mut $conn = pool.begin().await?;
                let value = $query;
                $conn.commit().await?;
                value
            }
            Store::Sqlite(pool) => {
                let mut $conn = pool.acquire().await?;
                $query
            }
        }
    };
}

mod postgres;
mod reveals;
mod signals;
mod sqlite;

use std::collections::HashMap;
use std::time::Duration;

use crate::domain::{Applied, Status, StatusChange};

pub use signals::{ChangeHints, Leadership};

/// Rows read per catch-up query.
pub const CHANGES_PAGE: i64 = 50_000;

/// The row that holds the snapshot floor (migration 0002): user ids start at 1,
/// so user 0 is free. Its version is the last snapshot's; every user without a
/// row of their own has that version, disabled. A snapshot moves it like any
/// other row at or below its version; deltas read it as the version of users
/// without a row; catch-up hands it over with the other rows, in change order.
pub const FLOOR_USER: u64 = 0;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported database URL (expected sqlite:// or postgres://)")]
    UnsupportedUrl,
}

/// A stored status and the change that last touched it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub user_id: u64,
    pub status: Status,
    pub seq: i64,
}

/// A row as both databases return it: (user_id, enabled, version, change_seq).
type RowTuple = (i64, bool, i64, i64);

impl From<RowTuple> for Row {
    fn from((user_id, enabled, version, seq): RowTuple) -> Self {
        Row {
            user_id: unsigned(user_id),
            status: Status {
                enabled,
                version: unsigned(version),
            },
            seq,
        }
    }
}

/// A position in the change log: (change_seq, user_id) of the last row seen.
pub type Watermark = (i64, i64);

#[derive(Debug, Clone)]
pub enum Store {
    Sqlite(sqlx::SqlitePool),
    Postgres(Pg),
}

/// A PostgreSQL store: the pool every query runs on (PostgreSQL itself, or a
/// transaction-mode pooler in front of it), and where to reach PostgreSQL itself
/// for the two things that need a session of their own: migrations (sqlx's
/// migrator holds a session advisory lock) and feed leadership.
///
/// Pooler-safe by construction: every statement is unnamed
/// (`persistent(false)`: a named one would outlive the transaction on a server
/// connection the pooler hands to another client next), and every statement
/// runs inside a transaction, even a lone read (sqlx sends an unnamed
/// statement's parse and its execution as two round trips, which a
/// transaction-mode pooler may send to two server connections otherwise).
#[derive(Debug, Clone)]
pub struct Pg {
    pool: sqlx::PgPool,
    /// Boxed: connect options are a few hundred bytes, the pool a pointer.
    direct: Box<sqlx::postgres::PgConnectOptions>,
}

impl Store {
    /// Opens a pool. SQLite creates the file (and its directory) now; PostgreSQL
    /// connects lazily, so a database that is down at start delays readiness
    /// instead of failing the start.
    ///
    /// # Errors
    /// A URL that does not parse, or an SQLite file that cannot be created.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        Store::connect_via(url, None, max_connections).await
    }

    /// As [`Store::connect`]; for PostgreSQL, `direct` (when given) reaches
    /// PostgreSQL itself when `url` is a transaction-mode pooler (see [`Pg`]).
    ///
    /// # Errors
    /// A URL that does not parse, or an SQLite file that cannot be created.
    pub async fn connect_via(
        url: &str,
        direct: Option<&str>,
        max_connections: u32,
    ) -> Result<Store, StoreError> {
        if url.starts_with("sqlite:") {
            sqlite::connect(url, max_connections)
                .await
                .map(Store::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Store::Postgres(Pg {
                pool: postgres::connect(url, max_connections)?,
                direct: Box::new(postgres::options(direct.unwrap_or(url))?),
            }))
        } else {
            Err(StoreError::UnsupportedUrl)
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// Applies the embedded migrations of this database kind.
    ///
    /// # Errors
    /// The database is unreachable or a migration failed.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(pool) => sqlx::migrate!("migrations/sqlite").run(pool).await?,
            // On a connection of its own to PostgreSQL itself: the migrator's
            // session lock means nothing through a transaction-mode pooler.
            Store::Postgres(pg) => {
                let direct = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(ACQUIRE_TIMEOUT)
                    .connect_with((*pg.direct).clone())
                    .await?;
                let result = sqlx::migrate!("migrations/postgres").run(&direct).await;
                direct.close().await;
                result?;
            }
        }
        Ok(())
    }

    /// Applies a delta delivery in one transaction (with the feed cursor that
    /// brought it, if any); returns what applied and what was ignored.
    ///
    /// # Errors
    /// The database refused or is unreachable; nothing was applied.
    pub async fn apply_changes(
        &self,
        items: &[StatusChange],
        cursor: Option<&str>,
    ) -> Result<Applied, StoreError> {
        timed("apply_changes", async {
            match self {
                Store::Sqlite(pool) => sqlite::apply_changes(pool, items, cursor).await,
                Store::Postgres(Pg { pool, .. }) => {
                    postgres::apply_changes(pool, items, cursor).await
                }
            }
        })
        .await
    }

    /// Starts a full snapshot: ids are pushed in chunks (duplicates allowed), then
    /// [`SnapshotLoad::finish`] applies it in the same transaction. Dropping the
    /// load unfinished rolls it back.
    ///
    /// # Errors
    /// The database is unreachable.
    pub async fn begin_snapshot(&self) -> Result<SnapshotLoad, StoreError> {
        Ok(SnapshotLoad {
            started: std::time::Instant::now(),
            tx: match self {
                Store::Sqlite(pool) => SnapshotTx::Sqlite(sqlite::begin_snapshot(pool).await?),
                Store::Postgres(Pg { pool, .. }) => {
                    SnapshotTx::Postgres(postgres::begin_snapshot(pool).await?)
                }
            },
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
    ) -> Result<Vec<Row>, StoreError> {
        timed("changes_after", async {
            match self {
                Store::Sqlite(pool) => sqlite::changes_after(pool, after, limit).await,
                Store::Postgres(Pg { pool, .. }) => {
                    postgres::changes_after(pool, after, limit).await
                }
            }
        })
        .await
    }

    /// Hints that the change log may have grown (see [`ChangeHints`]); a broken
    /// listener is retried every `retry`. Without `listen`, none: the caller's
    /// poll alone finds changes.
    pub fn change_hints(&self, retry: Duration, listen: bool) -> ChangeHints {
        ChangeHints::of(self, retry, listen)
    }

    /// Feed leadership, if no other replica holds it (see [`Leadership`]).
    ///
    /// # Errors
    /// The database is unreachable.
    pub async fn try_lead(&self) -> Result<Option<Leadership>, StoreError> {
        Leadership::try_take(self).await
    }

    /// The status feed's stored cursor.
    ///
    /// # Errors
    /// The database is unreachable.
    pub async fn feed_cursor(&self) -> Result<Option<String>, StoreError> {
        let query = "SELECT cursor FROM status_feed_cursor WHERE id = 1";
        Ok(on_connection!(self, conn => {
            sqlx::query_scalar(query)
                .persistent(false)
                .fetch_optional(&mut *conn)
                .await?
        }))
    }

    pub async fn close(&self) {
        match self {
            Store::Sqlite(pool) => pool.close().await,
            Store::Postgres(Pg { pool, .. }) => pool.close().await,
        }
    }
}

/// A snapshot being loaded: one open transaction holding a temporary table of ids.
pub struct SnapshotLoad {
    tx: SnapshotTx,
    started: std::time::Instant,
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
    pub async fn push(&mut self, ids: &[u64]) -> Result<(), StoreError> {
        match &mut self.tx {
            SnapshotTx::Sqlite(tx) => sqlite::push_snapshot(tx, ids).await,
            SnapshotTx::Postgres(tx) => postgres::push_snapshot(tx, ids).await,
        }
    }

    /// Applies the snapshot at `version` and commits.
    ///
    /// # Errors
    /// The database failed; nothing was applied.
    pub async fn finish(self, version: u64) -> Result<(), StoreError> {
        let result = match self.tx {
            SnapshotTx::Sqlite(tx) => sqlite::finish_snapshot(tx, version).await,
            SnapshotTx::Postgres(tx) => postgres::finish_snapshot(tx, version).await,
        };
        metrics::histogram!("phones_gateway_db_operation_duration_seconds", "operation" => "apply_snapshot")
            .record(self.started.elapsed().as_secs_f64());
        result
    }
}

async fn timed<T>(operation: &'static str, f: impl Future<Output = T>) -> T {
    let start = std::time::Instant::now();
    let out = f.await;
    metrics::histogram!("phones_gateway_db_operation_duration_seconds", "operation" => operation)
        .record(start.elapsed().as_secs_f64());
    out
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

/// Versions and ids are at most `i64::MAX` (validated at the edge); stored signed.
fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// How long a connection attempt may take before the operation fails (and the
/// webhook answers 503) rather than hanging on a dead database.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
