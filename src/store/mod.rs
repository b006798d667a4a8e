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
            Store::Postgres(pg) => {
                let mut $conn = pg.begin().await?;
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

use crate::domain::{Applied, Status, StatusChange, UserId};

pub use postgres::keeps_sessions;
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
    /// No connection could be had: the pool's own error ("pool timed out")
    /// hides why, so the store asks once more itself and names the cause.
    #[error("cannot connect to {target}: {cause}")]
    Unreachable { target: String, cause: String },
    /// The call did not finish within its bound (see [`Bounds`]); on the
    /// database's side the statement is cancelled by its own timeout.
    #[error("{operation} did not finish within {bound:?}")]
    TimedOut {
        operation: &'static str,
        bound: Duration,
    },
}

/// How long a database call may take (docs/configuration.md, `database.*`).
/// PostgreSQL enforces both on the server per transaction (`statement_timeout`,
/// `lock_timeout`: `SET LOCAL`, so a transaction-mode pooler passes them on);
/// SQLite waits for the write lock at most `lock` (its busy timeout). The
/// client also gives up on a PostgreSQL call after [`Bounds::call`], for a
/// connection that died without a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// One statement (a snapshot's largest statement must fit: see the docs).
    pub statement: Duration,
    /// Waiting for a lock another session holds (a table, the writers' lock).
    pub lock: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            statement: Duration::from_secs(60),
            lock: Duration::from_secs(5),
        }
    }
}

impl Bounds {
    /// The client's bound on one call that writes: a connection, then a
    /// statement.
    pub fn call(&self) -> Duration {
        ACQUIRE_TIMEOUT + self.statement + Duration::from_secs(1)
    }

    /// The client's bound on one read (a catch-up page, a feed cursor, a page
    /// of the reveal log): a connection, a lock wait, and two seconds for rows
    /// that come from an index. Shorter than [`Bounds::call`], so a connection
    /// that died silently holds the sync loop seconds, not a minute.
    pub fn read(&self) -> Duration {
        ACQUIRE_TIMEOUT + self.lock + Duration::from_secs(2)
    }
}

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
    bounds: Bounds,
}

impl Pg {
    /// A transaction with this store's bounds set on the server (`SET LOCAL`,
    /// one round trip: pooler-safe, and gone with the transaction).
    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "SELECT set_config('statement_timeout', $1, true), \
             set_config('lock_timeout', $2, true)",
        )
        .persistent(false)
        .bind(self.bounds.statement.as_millis().to_string())
        .bind(self.bounds.lock.as_millis().to_string())
        .execute(&mut *tx)
        .await?;
        Ok(tx)
    }
}

impl Store {
    /// Opens a pool. SQLite creates the file (and its directory) now; PostgreSQL
    /// connects lazily, so a database that is down at start delays readiness
    /// instead of failing the start.
    ///
    /// # Errors
    /// A URL that does not parse, or an SQLite file that cannot be created.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        Store::connect_via(url, None, max_connections, Bounds::default()).await
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
        bounds: Bounds,
    ) -> Result<Store, StoreError> {
        if url.starts_with("sqlite:") {
            sqlite::connect(url, max_connections, bounds.lock)
                .await
                .map(Store::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Store::Postgres(Pg {
                pool: postgres::connect(url, max_connections)?,
                direct: Box::new(postgres::options(direct.unwrap_or(url))?),
                bounds,
            }))
        } else {
            Err(StoreError::UnsupportedUrl)
        }
    }

    /// The client's bound on one call (see [`Bounds::call`]).
    pub fn call_bound(&self) -> Duration {
        match self {
            Store::Postgres(pg) => pg.bounds.call(),
            // Local: a statement cannot hang on a network, and the busy
            // timeout bounds the wait for the write lock.
            Store::Sqlite(_) => Bounds::default().call(),
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
            // A connection, not a pool: its error names the cause (a pool's
            // says only that it timed out).
            Store::Postgres(pg) => {
                let connect = <sqlx::PgConnection as sqlx::Connection>::connect_with(&pg.direct);
                let mut direct = match tokio::time::timeout(ACQUIRE_TIMEOUT, connect).await {
                    Ok(connected) => connected.map_err(|error| StoreError::Unreachable {
                        target: postgres::target(&pg.direct),
                        cause: error.to_string(),
                    })?,
                    Err(_) => {
                        return Err(StoreError::Unreachable {
                            target: postgres::target(&pg.direct),
                            cause: format!("no answer within {ACQUIRE_TIMEOUT:?}"),
                        });
                    }
                };
                // Lock waits bounded like every other call's: a migration
                // stuck behind another session's lock fails, and the load
                // retries it. No statement timeout: a migration that builds an
                // index on a large table may rightly take longer than any
                // request's bound.
                let bound = format!("SET lock_timeout = {}", pg.bounds.lock.as_millis());
                sqlx::Executor::execute(&mut direct, bound.as_str()).await?;
                // `run_direct`, sqlx's own way around `run`'s "Acquire is not
                // general enough" in a spawned task; it takes the same lock.
                let result = sqlx::migrate!("migrations/postgres")
                    .run_direct(&mut direct)
                    .await;
                let _ = sqlx::Connection::close(direct).await;
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
        self.call("apply_changes", async {
            match self {
                Store::Sqlite(pool) => sqlite::apply_changes(pool, items, cursor).await,
                Store::Postgres(pg) => postgres::apply_changes(pg, items, cursor).await,
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
        let tx = self
            .call("begin_snapshot", async {
                Ok(match self {
                    Store::Sqlite(pool) => SnapshotTx::Sqlite(sqlite::begin_snapshot(pool).await?),
                    Store::Postgres(pg) => {
                        SnapshotTx::Postgres(postgres::begin_snapshot(pg).await?)
                    }
                })
            })
            .await?;
        Ok(SnapshotLoad {
            started: std::time::Instant::now(),
            store: self.clone(),
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
    ) -> Result<Vec<Row>, StoreError> {
        self.read("changes_after", async {
            match self {
                Store::Sqlite(pool) => sqlite::changes_after(pool, after, limit).await,
                Store::Postgres(pg) => postgres::changes_after(pg, after, limit).await,
            }
        })
        .await
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
    ) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(_) => Ok(()),
            Store::Postgres(pg) => {
                self.call(
                    "record_invalidations",
                    postgres::record_invalidations(pg, users, keep),
                )
                .await
            }
        }
    }

    /// Whether the connection this store uses for sessions (`direct_url`, or
    /// `url` without it) is a transaction-mode pooler, which keeps none (see
    /// [`postgres::keeps_sessions`]). `None` when it cannot tell (the database
    /// does not answer).
    pub async fn lacks_session(&self) -> Option<bool> {
        match self {
            Store::Sqlite(_) => Some(false),
            Store::Postgres(pg) => postgres::keeps_sessions(&pg.direct)
                .await
                .ok()
                .map(|keeps| !keeps),
        }
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
        self.read("feed_cursor", async {
            Ok(on_connection!(self, conn => {
                sqlx::query_scalar(query)
                    .persistent(false)
                    .fetch_optional(&mut *conn)
                    .await?
            }))
        })
        .await
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
    /// The store it came from, for the bound of each call.
    store: Store,
    started: std::time::Instant,
}

enum SnapshotTx {
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

impl SnapshotLoad {
    /// Adds enabled ids (validated by the caller).
    ///
    /// # Errors
    /// The database failed; drop the load.
    pub async fn push(&mut self, ids: &[u64]) -> Result<(), StoreError> {
        let tx = &mut self.tx;
        self.store
            .call("push_snapshot", async {
                match tx {
                    SnapshotTx::Sqlite(tx) => sqlite::push_snapshot(tx, ids).await,
                    SnapshotTx::Postgres(tx) => postgres::push_snapshot(tx, ids).await,
                }
            })
            .await
    }

    /// Applies the snapshot at `version` and commits.
    ///
    /// # Errors
    /// The database failed; nothing was applied.
    pub async fn finish(self, version: u64) -> Result<(), StoreError> {
        let SnapshotLoad { tx, store, started } = self;
        let result = store
            .call("finish_snapshot", async {
                match tx {
                    SnapshotTx::Sqlite(tx) => sqlite::finish_snapshot(tx, version).await,
                    SnapshotTx::Postgres(tx) => postgres::finish_snapshot(tx, version).await,
                }
            })
            .await;
        metrics::histogram!("phones_gateway_db_operation_duration_seconds", "operation" => "apply_snapshot")
            .record(started.elapsed().as_secs_f64());
        result
    }
}

impl Store {
    /// Runs one database call that writes: see [`Store::bounded`], with
    /// [`Bounds::call`].
    async fn call<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bound = match self {
            Store::Postgres(pg) => Some(pg.bounds.call()),
            Store::Sqlite(_) => None,
        };
        self.bounded(operation, bound, f).await
    }

    /// Runs one database call that only reads: see [`Store::bounded`], with
    /// [`Bounds::read`], so that the sync loop is back within seconds after a
    /// connection died silently.
    async fn read<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bound = match self {
            Store::Postgres(pg) => Some(pg.bounds.read()),
            Store::Sqlite(_) => None,
        };
        self.bounded(operation, bound, f).await
    }

    /// Runs one database call: bounded on PostgreSQL by `bound` (a connection
    /// that died without a word cannot hold the caller; SQLite is local),
    /// timed for the operation histogram, and with a pool timeout explained
    /// (see [`StoreError::Unreachable`]).
    async fn bounded<T>(
        &self,
        operation: &'static str,
        bound: Option<Duration>,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = std::time::Instant::now();
        let out = match bound {
            Some(bound) => tokio::time::timeout(bound, f)
                .await
                .unwrap_or(Err(StoreError::TimedOut { operation, bound })),
            None => f.await,
        };
        metrics::histogram!("phones_gateway_db_operation_duration_seconds", "operation" => operation)
            .record(start.elapsed().as_secs_f64());
        match out {
            Err(StoreError::Database(sqlx::Error::PoolTimedOut)) => Err(self.explain().await),
            other => other,
        }
    }

    /// Why no pooled connection could be had: one connection attempt of its own,
    /// whose error names the cause (refused, authentication, DNS), with where it
    /// went (host:port and database, never the password).
    async fn explain(&self) -> StoreError {
        let Store::Postgres(pg) = self else {
            return StoreError::Database(sqlx::Error::PoolTimedOut);
        };
        let options = pg.pool.connect_options();
        let target = postgres::target(&options);
        let attempt = tokio::time::timeout(
            ACQUIRE_TIMEOUT,
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&options),
        )
        .await;
        let cause = match attempt {
            Err(_) => format!("no answer within {ACQUIRE_TIMEOUT:?}"),
            Ok(Err(error)) => error.to_string(),
            Ok(Ok(connection)) => {
                let _ = sqlx::Connection::close(connection).await;
                format!(
                    "every pooled connection stayed busy for {ACQUIRE_TIMEOUT:?} \
                     (database.max_connections is {})",
                    pg.pool.options().get_max_connections()
                )
            }
        };
        StoreError::Unreachable { target, cause }
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
