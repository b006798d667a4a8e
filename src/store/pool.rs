//! The pool every store handle holds ([`Backend`]), and how each call on it
//! is bounded and timed (docs/status-sync.md, "Bounded calls").

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::error::StoreError;
use crate::domain::wall_clock::Stopwatch;

/// How long taking a connection may take before the call fails, not hangs.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// How every SQLite write transaction begins, so that writers queue for the
/// write lock instead of refusing each other (docs/status-sync.md, "The set").
pub(super) const SQLITE_BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// How long a database call may take (`database.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub statement: Duration,
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
    /// The client's bound on a call that writes: a connection, then a statement.
    pub fn call(&self) -> Duration {
        ACQUIRE_TIMEOUT + self.statement + Duration::from_secs(1)
    }

    /// The client's bound on a read: a connection, a lock wait, and 2 s.
    pub fn read(&self) -> Duration {
        ACQUIRE_TIMEOUT + self.lock + Duration::from_secs(2)
    }

    /// The whole of a small call (a delta, an invalidation, the feed cursor, a
    /// lease), connection included, on the client and on the server alike.
    pub fn short(&self) -> Duration {
        self.lock
    }

    /// The client's bound on an SQLite snapshot's finish: the lock wait, then
    /// four statements' bounds.
    pub fn sqlite_finish(&self) -> Duration {
        self.lock + 4 * self.statement + Duration::from_secs(1)
    }
}

#[derive(Debug, Clone)]
pub(super) enum Backend {
    Sqlite(Sqlite),
    Postgres(Pg),
}

/// An SQLite store: SQLite bounds only lock waits itself, so every call is
/// bounded on the client as on PostgreSQL. Derefs to the pool.
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

/// A PostgreSQL store: its pool (PostgreSQL or a pooler), and PostgreSQL
/// itself for what needs a session. Pooler-safe: every statement is unnamed
/// and in a transaction (docs/status-sync.md, "Behind a transaction-mode pooler").
#[derive(Debug, Clone)]
pub(super) struct Pg {
    pub(super) pool: sqlx::PgPool,
    /// Boxed: connect options are a few hundred bytes, the pool a pointer.
    pub(super) direct: Box<PgConnectOptions>,
    pub(super) bounds: Bounds,
}

impl Pg {
    /// A transaction with this store's bounds set on the server (`SET LOCAL`).
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

    /// A transaction for a small call ([`Bounds::short`]): statements, lock waits
    /// and idle time each bounded by `lock` on the server. The idle bound frees
    /// the locks (the writers' lock, a lease row) of a client frozen mid-transaction.
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
    fn bounds(&self) -> Bounds {
        match self {
            Backend::Postgres(pg) => pg.bounds,
            Backend::Sqlite(sqlite) => sqlite.bounds,
        }
    }

    pub(super) fn short_bound(&self) -> Duration {
        self.bounds().short()
    }

    pub(super) async fn until<T>(
        &self,
        operation: &'static str,
        deadline: tokio::time::Instant,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bound = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.bounded(operation, bound, f).await
    }

    pub(super) fn call_bound(&self) -> Duration {
        self.bounds().call()
    }

    pub(super) async fn call<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded(operation, self.call_bound(), f).await
    }

    /// The client's bound on a snapshot's finish (PostgreSQL: before its batches).
    pub(super) fn finish_bound(&self) -> Duration {
        match self {
            Backend::Postgres(pg) => pg.bounds.call(),
            Backend::Sqlite(sqlite) => sqlite.bounds.sqlite_finish(),
        }
    }

    pub(super) async fn read<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded(operation, self.bounds().read(), f).await
    }

    /// Runs one call within `bound` on the client, timed, a pool timeout
    /// explained. Given up, its future is dropped and sqlx rolls its transaction
    /// back: nothing applies unless its commit was answered.
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

    /// Runs a call whose every statement is bounded by itself; timed, no bound.
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

    /// Why no pooled connection could be had: all busy (said without connecting,
    /// so the pool's cap holds), or, with none, one attempt's error naming the
    /// cause and where (never the password).
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

/// Runs one query on either database, on `$conn`: on PostgreSQL in a
/// transaction (pooler-safe), on SQLite on a pooled connection.
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
