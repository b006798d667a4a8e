//! The pool every store handle holds, of one database kind ([`Backend`]),
//! and how each call on it is bounded and timed: [`Bounds`] (the
//! `database.*` bounds), PostgreSQL's transactions with those bounds set on
//! the server ([`Pg`]), and the wrappers that bound each call on the client
//! side, time it for the operation histogram and explain a pool timeout.
//! Made by `database` when it opens the database; every store handle holds
//! one.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::error::StoreError;
use crate::domain::wall_clock::Stopwatch;

/// How long a connection attempt may take before the operation fails (and the
/// webhook answers 503) rather than hanging on a dead database.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// How every SQLite write transaction begins: status changes, snapshots, the
/// reveal flush and retention alike take the write lock before their first
/// read, so the gateway's own writers queue for it (up to the busy timeout,
/// `database.lock_timeout_ms`) instead of refusing each other with
/// `SQLITE_BUSY_SNAPSHOT` (see `status::sqlite`).
pub(super) const SQLITE_BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// How long a database call may take (docs/configuration.md, `database.*`).
/// PostgreSQL enforces both on the server per transaction (`statement_timeout`,
/// `lock_timeout`: `SET LOCAL`, so a transaction-mode pooler passes them on);
/// SQLite waits for the write lock at most `lock` (its busy timeout). The
/// client also gives up on every call, of either kind, after its bound
/// ([`Bounds::call`], [`Bounds::read`], [`Bounds::short`]): for a PostgreSQL
/// connection that died without a word, and for an SQLite file on a disk that
/// stopped answering (a busy timeout bounds lock waits, not I/O).
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

    /// The client's bound on one read (a catch-up page, a page of the reveal
    /// log): a connection, a lock wait, and two seconds for rows that come
    /// from an index. Shorter than [`Bounds::call`], so a connection that died
    /// silently holds the sync loop seconds, not a minute.
    pub fn read(&self) -> Duration {
        ACQUIRE_TIMEOUT + self.lock + Duration::from_secs(2)
    }

    /// The whole of a small call, connection included: a webhook delta, an
    /// invalidation, a single-row read (the feed cursor), a lease's take or
    /// renewal. `lock`, on the client and on the server alike (statement,
    /// lock wait and idle time in the transaction): a database that stops
    /// answering costs a webhook this long, not a snapshot's statement bound.
    pub fn short(&self) -> Duration {
        self.lock
    }

    /// The client's bound on an SQLite snapshot's finish, one call of several
    /// large statements in one write transaction: the wait for the write lock
    /// (`lock`, the busy timeout), then the index, the update, the insert and
    /// the commit, each within a statement's bound, and a second. PostgreSQL
    /// bounds each of its statements on the server, and each batch of its
    /// finish by [`Bounds::call`]; SQLite has no statement timeout, and a 10,000,000-id
    /// snapshot over a full set spends tens of seconds of CPU in each of the
    /// update and the insert (docs/status-sync.md, "Every call and its bound").
    pub fn sqlite_finish(&self) -> Duration {
        self.lock + 4 * self.statement + Duration::from_secs(1)
    }
}

/// The pool of one database kind: what every handle holds, and the one place
/// outside a capability's SQL that says which kinds there are.
#[derive(Debug, Clone)]
pub(super) enum Backend {
    Sqlite(Sqlite),
    Postgres(Pg),
}

/// An SQLite store: the pool every query runs on, and the bounds its calls
/// are given on the client. SQLite enforces only the busy timeout (`lock`, set
/// on each connection where the pool is opened); a statement has no timeout
/// of its own, and a disk that stalls holds a call in the middle of a read, a
/// write or an fsync for as long as it stalls, so every call is bounded here
/// as on PostgreSQL. Derefs to the pool: the dialect files take
/// `&SqlitePool`.
#[derive(Debug, Clone)]
pub(super) struct Sqlite {
    pub(super) pool: sqlx::SqlitePool,
    pub(super) bounds: Bounds,
}

impl std::ops::Deref for Sqlite {
    type Target = sqlx::SqlitePool;

    fn deref(&self) -> &sqlx::SqlitePool {
        &self.pool
    }
}

/// A PostgreSQL store: the pool every query runs on (PostgreSQL itself, or a
/// transaction-mode pooler in front of it), and where to reach PostgreSQL itself
/// for the two things that need a session of their own: migrations (sqlx's
/// migrator holds a session advisory lock) and LISTEN (its pool is the
/// listener's own, see [`super::hints::ChangeHints`]). Feed leadership is a lease row
/// through the pool.
///
/// Pooler-safe by construction: every statement is unnamed
/// (`persistent(false)`: a named one would outlive the transaction on a server
/// connection the pooler hands to another client next), and every statement
/// runs inside a transaction, even a lone read (sqlx sends an unnamed
/// statement's parse and its execution as two round trips, which a
/// transaction-mode pooler may send to two server connections otherwise).
#[derive(Debug, Clone)]
pub(super) struct Pg {
    pub(super) pool: sqlx::PgPool,
    /// Boxed: connect options are a few hundred bytes, the pool a pointer.
    pub(super) direct: Box<PgConnectOptions>,
    pub(super) bounds: Bounds,
}

impl Pg {
    /// A transaction with this store's bounds set on the server (`SET LOCAL`,
    /// one round trip: pooler-safe, and gone with the transaction).
    pub(super) async fn begin(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
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

    /// A transaction for a small call ([`Bounds::short`]): its statements,
    /// its lock waits and its idle time each bounded by `lock` on the server.
    /// The idle bound matters when the client freezes (SIGSTOP, a VM paused)
    /// in mid-transaction: its connection stays open, and without it the
    /// locks it holds (the writers' advisory lock, a lease row) would stay
    /// held for as long as it sleeps, stopping every other replica's writes.
    pub(super) async fn begin_short(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let bound = self.bounds.short().as_millis().to_string();
        sqlx::query(
            "SELECT set_config('statement_timeout', $1, true), \
             set_config('lock_timeout', $1, true), \
             set_config('idle_in_transaction_session_timeout', $1, true)",
        )
        .persistent(false)
        .bind(bound)
        .execute(&mut *tx)
        .await?;
        Ok(tx)
    }
}

impl Backend {
    /// The bounds of this store's calls (`database.*`).
    fn bounds(&self) -> Bounds {
        match self {
            Backend::Postgres(pg) => pg.bounds,
            Backend::Sqlite(sqlite) => sqlite.bounds,
        }
    }

    /// The bound of a small call ([`Bounds::short`]), on either kind: a
    /// webhook against a locked or stalled SQLite file answers 503 within
    /// `lock` as on PostgreSQL, its turn among the local writers included (so
    /// a delta queued behind a large snapshot's finish may be refused, and
    /// retried by its sender, rather than hold its caller for a minute).
    pub(super) fn short_bound(&self) -> Duration {
        self.bounds().short()
    }

    /// Runs one small database call that must be over by `deadline` (the
    /// caller's share of [`Bounds::short`], after a wait for its turn): see
    /// [`Backend::bounded`].
    pub(super) async fn until<T>(
        &self,
        operation: &'static str,
        deadline: tokio::time::Instant,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bound = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.bounded(operation, bound, f).await
    }

    /// The client's bound on one call (see [`Bounds::call`]).
    pub(super) fn call_bound(&self) -> Duration {
        self.bounds().call()
    }

    /// Runs one database call that writes: see [`Backend::bounded`], with
    /// [`Bounds::call`].
    pub(super) async fn call<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded(operation, self.call_bound(), f).await
    }

    /// The client's bound on a snapshot's finish (on PostgreSQL, on what
    /// comes before it: its batches are bounded each): [`Bounds::call`] on
    /// PostgreSQL, [`Bounds::sqlite_finish`] on SQLite.
    pub(super) fn finish_bound(&self) -> Duration {
        match self {
            Backend::Postgres(pg) => pg.bounds.call(),
            Backend::Sqlite(sqlite) => sqlite.bounds.sqlite_finish(),
        }
    }

    /// Runs one database call that only reads: see [`Backend::bounded`], with
    /// [`Bounds::read`], so that the sync loop is back within seconds after a
    /// connection died silently (or a disk stalled).
    pub(super) async fn read<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded(operation, self.bounds().read(), f).await
    }

    /// Runs one database call, taking its connection included: bounded by
    /// `bound` on the client (a PostgreSQL connection that died without a word,
    /// or an SQLite file on a stalled disk, cannot hold the caller), timed for
    /// the operation histogram, and with a pool timeout explained (see
    /// [`StoreError::Unreachable`]). Given up, the call's future is dropped:
    /// sqlx rolls back its open transaction (on SQLite, on the connection's
    /// own thread once the statement it is in returns), so nothing applies
    /// unless its commit had been answered.
    pub(super) async fn bounded<T>(
        &self,
        operation: &'static str,
        bound: Duration,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Stopwatch::start();
        let out = tokio::time::timeout(bound, f)
            .await
            .unwrap_or(Err(StoreError::TimedOut { operation, bound }));
        metrics::histogram!("phones_gateway_db_operation_duration_seconds", "operation" => operation)
            .record(start.elapsed().as_secs_f64());
        match out {
            // The explanation within what is left of the bound: its own
            // connection attempt on a silent database would add 3 s.
            Err(StoreError::Database(sqlx::Error::PoolTimedOut)) => {
                let left = bound.saturating_sub(start.elapsed());
                Err(tokio::time::timeout(left, self.explain())
                    .await
                    .unwrap_or(StoreError::TimedOut { operation, bound }))
            }
            other => other,
        }
    }

    /// Runs a call whose every statement is bounded by itself (a PostgreSQL
    /// snapshot's finish, in batches whose number grows with the snapshot:
    /// see `status::postgres::SNAPSHOT_BATCH`), timed for the operation
    /// histogram; no bound of the whole.
    pub(super) async fn stepped<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Stopwatch::start();
        let out = f.await;
        metrics::histogram!("phones_gateway_db_operation_duration_seconds", "operation" => operation)
            .record(start.elapsed().as_secs_f64());
        out
    }

    /// Why no pooled connection could be had. With connections in the pool,
    /// they were all busy: said without connecting, so a replica never holds
    /// more connections than its pool (plus the notification listener and the
    /// feed's lease) even while its pool is busy. With none, one connection
    /// attempt of its own, whose error names the cause (refused,
    /// authentication, DNS), with where it went (host:port and database, never
    /// the password).
    async fn explain(&self) -> StoreError {
        let Backend::Postgres(pg) = self else {
            return StoreError::Database(sqlx::Error::PoolTimedOut);
        };
        let options = pg.pool.connect_options();
        let target = target(&options);
        let busy = || {
            format!(
                "every pooled connection stayed busy for {ACQUIRE_TIMEOUT:?} \
                 (database.max_connections is {})",
                pg.pool.options().get_max_connections()
            )
        };
        if pg.pool.size() > 0 {
            return StoreError::Unreachable {
                target,
                cause: busy(),
            };
        }
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
                busy()
            }
        };
        StoreError::Unreachable { target, cause }
    }
}

/// Where `options` reach, for a log line: host:port (or the socket) and the
/// database; never the user's password.
pub(super) fn target(options: &PgConnectOptions) -> String {
    let database = options.get_database().unwrap_or("");
    match options.get_socket() {
        Some(socket) => format!("{}/{database}", socket.display()),
        None => format!("{}:{}/{database}", options.get_host(), options.get_port()),
    }
}

/// Versions and ids are at most `i64::MAX` (validated at the edge); stored signed.
pub(super) fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(super) fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// Runs one query-building expression on whichever database `$backend` holds
/// (a [`Backend`]; sqlx's query types differ per database, so one function
/// cannot take both), with `$conn` the connection to run it on: on PostgreSQL
/// a transaction, a lone statement too, so that it is pooler-safe (see
/// [`Pg`]); on SQLite a pooled connection, a lone statement being atomic
/// there. Evaluates to the expression's value, or returns the error. For
/// queries whose text is the same in both dialects.
macro_rules! on_connection {
    ($backend:expr, $conn:ident => $query:expr) => {
        match $backend {
            $crate::store::pool::Backend::Postgres(pg) => {
                let mut $conn = pg.begin().await?;
                let value = $query;
                $conn.commit().await?;
                value
            }
            $crate::store::pool::Backend::Sqlite(pool) => {
                let mut $conn = pool.acquire().await?;
                $query
            }
        }
    };
}
pub(super) use on_connection;
