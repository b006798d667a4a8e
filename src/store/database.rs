//! The opened database, both dialects: connecting (SQLite creates its file,
//! PostgreSQL connects lazily), the bounds of every call ([`Bounds`]) and the
//! wrappers that apply them on the client side and time each operation,
//! migrations, the pooler check, closing. The capability handles
//! ([`super::StatusStore`], [`super::RevealStore`], [`super::Leadership`],
//! [`super::ChangeHints`]) are made from a [`Database`] and share its pool.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Row as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::{BudgetStore, ChangeHints, Leadership, RevealStore, StatusStore};

/// How long a connection attempt may take before the operation fails (and the
/// webhook answers 503) rather than hanging on a dead database.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// How every SQLite write transaction begins: status changes, snapshots, the
/// reveal flush and retention alike take the write lock before their first
/// read, so the gateway's own writers queue for it (up to the busy timeout,
/// `database.lock_timeout_ms`) instead of refusing each other with
/// `SQLITE_BUSY_SNAPSHOT` (see `status::sqlite`).
pub(super) const SQLITE_BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// Why a database call failed, whichever store made it. Each store hands it on
/// wrapped in its own error ([`super::StatusStoreError`],
/// [`super::RevealStoreError`]), so that whoever logs or answers it says which
/// store failed; the database-wide work (opening, migrations, leadership)
/// returns it bare.
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
    /// A write for a leased duty (the status feed's cursor) was refused: the
    /// lease it was made under has expired or another replica took it.
    #[error("the {0} lease is no longer this replica's")]
    LeaseLost(&'static str),
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
}

/// The one database the app opened: the source of every store handle, and
/// the work that concerns the database as a whole (migrations, the pooler
/// check, closing). Owned by `app`; cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Database {
    backend: Backend,
    /// SQLite only: the reveal log's writer, a connection of its own (see
    /// [`connect_sqlite_log_writer`]).
    log_writer: Option<sqlx::SqlitePool>,
}

impl Database {
    /// A migrated SQLite database in a fresh directory, for unit tests; the
    /// directory goes when the returned guard is dropped.
    #[cfg(test)]
    pub(crate) async fn scratch() -> (tempfile::TempDir, Database) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}/scratch.db", dir.path().display());
        let database = Database::connect(&url, 2).await.expect("a SQLite file");
        database.migrate().await.expect("the migrations");
        (dir, database)
    }

    /// Opens a pool. SQLite creates the file (and its directory) now; PostgreSQL
    /// connects lazily, so a database that is down at start delays readiness
    /// instead of failing the start.
    ///
    /// # Errors
    /// A URL that does not parse, or an SQLite file that cannot be created.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Database, StoreError> {
        Database::connect_via(url, None, max_connections, Bounds::default()).await
    }

    /// As [`Database::connect`]; for PostgreSQL, `direct` (when given) reaches
    /// PostgreSQL itself when `url` is a transaction-mode pooler (see [`Pg`]).
    ///
    /// # Errors
    /// A URL that does not parse, or an SQLite file that cannot be created.
    pub async fn connect_via(
        url: &str,
        direct: Option<&str>,
        max_connections: u32,
        bounds: Bounds,
    ) -> Result<Database, StoreError> {
        let mut log_writer = None;
        let backend = if url.starts_with("sqlite:") {
            let pool = connect_sqlite(url, max_connections, bounds.lock).await?;
            log_writer = Some(connect_sqlite_log_writer(url, bounds.lock)?);
            Backend::Sqlite(pool)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres(Pg {
                pool: connect_postgres(url, max_connections)?,
                direct: Box::new(pg_options(direct.unwrap_or(url))?),
                bounds,
            })
        } else {
            return Err(StoreError::UnsupportedUrl);
        };
        Ok(Database {
            backend,
            log_writer,
        })
    }

    /// The status set's store and its change log (held by the status service).
    pub fn status(&self) -> StatusStore {
        StatusStore::of(self.backend.clone())
    }

    /// The reveal log's store (held by the flush, retention and the reveal routes).
    pub fn reveals(&self) -> RevealStore {
        RevealStore::of(self.backend.clone(), self.log_writer.clone())
    }

    /// Viewer budgets' store (held by the budgets' exchange task).
    pub fn budgets(&self) -> BudgetStore {
        BudgetStore::of(self.backend.clone())
    }

    /// Feed leadership (held by the feed loop): a lease of `ttl` on
    /// PostgreSQL (see [`Leadership`]).
    pub fn leadership(&self, ttl: Duration) -> Leadership {
        Leadership::of(&self.backend, ttl)
    }

    /// Hints that the change log may have grown (for the sync loop; see
    /// [`ChangeHints`]); a broken listener is retried every `retry`. Without
    /// `listen`, none: the caller's poll alone finds changes.
    pub fn change_hints(&self, retry: Duration, listen: bool) -> ChangeHints {
        ChangeHints::of(&self.backend, retry, listen)
    }

    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Applies the embedded migrations of this database kind.
    ///
    /// # Errors
    /// The database is unreachable or a migration failed.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Sqlite(pool) => sqlx::migrate!("migrations/sqlite").run(pool).await?,
            // On a connection of its own to PostgreSQL itself: the migrator's
            // session lock means nothing through a transaction-mode pooler.
            // A connection, not a pool: its error names the cause (a pool's
            // says only that it timed out).
            Backend::Postgres(pg) => {
                let connect = <sqlx::PgConnection as sqlx::Connection>::connect_with(&pg.direct);
                let mut direct = match tokio::time::timeout(ACQUIRE_TIMEOUT, connect).await {
                    Ok(connected) => connected.map_err(|error| StoreError::Unreachable {
                        target: target(&pg.direct),
                        cause: error.to_string(),
                    })?,
                    Err(_) => {
                        return Err(StoreError::Unreachable {
                            target: target(&pg.direct),
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

    /// Whether the connection this database uses for sessions (`direct_url`,
    /// or `url` without it) is a transaction-mode pooler, which keeps none (see
    /// [`keeps_sessions`]).
    ///
    /// # Errors
    /// It cannot tell: the database did not answer (within [`PROBE_BOUND`]).
    pub async fn lacks_session(&self) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(false),
            Backend::Postgres(pg) => keeps_sessions(&pg.direct).await.map(|keeps| !keeps),
        }
    }

    /// Closes the pool every handle shares (and SQLite's reveal log writer).
    pub async fn close(&self) {
        if let Some(writer) = &self.log_writer {
            writer.close().await;
        }
        match &self.backend {
            Backend::Sqlite(pool) => pool.close().await,
            Backend::Postgres(Pg { pool, .. }) => pool.close().await,
        }
    }
}

/// The pool of one database kind: what every handle holds, and the one place
/// outside a capability's SQL that says which kinds there are.
#[derive(Debug, Clone)]
pub(super) enum Backend {
    Sqlite(sqlx::SqlitePool),
    Postgres(Pg),
}

/// A PostgreSQL store: the pool every query runs on (PostgreSQL itself, or a
/// transaction-mode pooler in front of it), and where to reach PostgreSQL itself
/// for the two things that need a session of their own: migrations (sqlx's
/// migrator holds a session advisory lock) and LISTEN (its pool is the
/// listener's own, see [`super::ChangeHints`]). Feed leadership is a lease row
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
    /// The bound of a small call ([`Bounds::short`]). SQLite: a call's, as
    /// for every write there ([`Backend::call_bound`]): its writers queue for
    /// one file, and a small write queued behind a large snapshot must not be
    /// refused for it (its wait for SQLite's own lock is the busy timeout).
    pub(super) fn short_bound(&self) -> Duration {
        match self {
            Backend::Postgres(pg) => pg.bounds.short(),
            Backend::Sqlite(_) => self.call_bound(),
        }
    }

    /// Runs one small database call that must be over by `deadline` (the
    /// caller's share of [`Bounds::short`], after a wait for its turn): see
    /// [`Backend::bounded`]. SQLite is local and bounded by its busy timeout.
    pub(super) async fn until<T>(
        &self,
        operation: &'static str,
        deadline: tokio::time::Instant,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bound = match self {
            Backend::Postgres(_) => {
                Some(deadline.saturating_duration_since(tokio::time::Instant::now()))
            }
            Backend::Sqlite(_) => None,
        };
        self.bounded(operation, bound, f).await
    }

    /// The client's bound on one call (see [`Bounds::call`]).
    pub(super) fn call_bound(&self) -> Duration {
        match self {
            Backend::Postgres(pg) => pg.bounds.call(),
            // Local: a statement cannot hang on a network, and the busy
            // timeout bounds the wait for the write lock.
            Backend::Sqlite(_) => Bounds::default().call(),
        }
    }

    /// Runs one database call that writes: see [`Backend::bounded`], with
    /// [`Bounds::call`].
    pub(super) async fn call<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bound = match self {
            Backend::Postgres(pg) => Some(pg.bounds.call()),
            Backend::Sqlite(_) => None,
        };
        self.bounded(operation, bound, f).await
    }

    /// Runs one database call that only reads: see [`Backend::bounded`], with
    /// [`Bounds::read`], so that the sync loop is back within seconds after a
    /// connection died silently.
    pub(super) async fn read<T>(
        &self,
        operation: &'static str,
        f: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bound = match self {
            Backend::Postgres(pg) => Some(pg.bounds.read()),
            Backend::Sqlite(_) => None,
        };
        self.bounded(operation, bound, f).await
    }

    /// Runs one database call: bounded on PostgreSQL by `bound` (a connection
    /// that died without a word cannot hold the caller; SQLite is local),
    /// timed for the operation histogram, and with a pool timeout explained
    /// (see [`StoreError::Unreachable`]).
    #[allow(
        clippy::disallowed_types,
        reason = "a duration metric: wall time, also under a paused test clock"
    )]
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
        match (out, bound) {
            // The explanation within what is left of the bound: its own
            // connection attempt on a silent database would add 3 s.
            (Err(StoreError::Database(sqlx::Error::PoolTimedOut)), Some(bound)) => {
                let left = bound.saturating_sub(start.elapsed());
                Err(tokio::time::timeout(left, self.explain())
                    .await
                    .unwrap_or(StoreError::TimedOut { operation, bound }))
            }
            (Err(StoreError::Database(sqlx::Error::PoolTimedOut)), None) => {
                Err(self.explain().await)
            }
            (other, _) => other,
        }
    }

    /// Why no pooled connection could be had: one connection attempt of its own,
    /// whose error names the cause (refused, authentication, DNS), with where it
    /// went (host:port and database, never the password).
    async fn explain(&self) -> StoreError {
        let Backend::Postgres(pg) = self else {
            return StoreError::Database(sqlx::Error::PoolTimedOut);
        };
        let options = pg.pool.connect_options();
        let target = target(&options);
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

/// SQLite, the embedded default, for one replica. WAL journal,
/// `synchronous = FULL` (an acknowledged change survives a crash of the machine,
/// not only of the process), one writer at a time by SQLite's own lock.
/// `lock`: how long a writer waits for another's lock (`database.lock_timeout_ms`).
async fn connect_sqlite(
    url: &str,
    max_connections: u32,
    lock: Duration,
) -> Result<sqlx::SqlitePool, StoreError> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(lock);
    if let Some(dir) = options.get_filename().parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
        }
    }
    Ok(SqlitePoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await?)
}

/// The page cache of the reveal log's SQLite writer, in KiB. A flush of 30,000
/// reveals (a second at the hit path's maximum on one core) dirties about 6 MiB
/// of pages; with SQLite's default of 2 MiB the flush spilled dirty pages to the
/// WAL in mid-transaction and read index pages back from the file, which was a
/// third of the log's cost (the log's profile). Bounded: RSS grows by at most
/// this much.
pub(super) const SQLITE_LOG_CACHE_KIB: u32 = 32 * 1024;

/// WAL pages after which a commit on the reveal log's writer checkpoints
/// (SQLite's default: 1,000, about one flush at the hit path's maximum). Each
/// flush rewrites the same index pages; copied back to the database file every
/// eighth flush rather than every one, each is copied once for eight flushes.
/// The WAL grows to about 32 MiB before it is reset.
pub(super) const SQLITE_LOG_CHECKPOINT_PAGES: u32 = 8_000;

/// The reveal log's writer on SQLite: one connection of its own, held open, so
/// that its page cache ([`SQLITE_LOG_CACHE_KIB`]) stays warm from one flush to
/// the next instead of being spread over (and evicted from) the status set's
/// pool. Its thread yields the core to requests (see [`super::priority`]).
/// Same file, same durability as [`connect_sqlite`] (`synchronous =
/// FULL`: a flush acknowledged is on disk; measured, `NORMAL` saved nothing
/// at one commit a second). The flush and retention write on it; the reveal
/// routes read on the shared pool. Connects lazily: [`connect_sqlite`] has
/// created the file.
fn connect_sqlite_log_writer(url: &str, lock: Duration) -> Result<sqlx::SqlitePool, StoreError> {
    let options = SqliteConnectOptions::from_str(url)?
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(lock)
        .pragma("cache_size", format!("-{SQLITE_LOG_CACHE_KIB}"))
        .pragma(
            "wal_autocheckpoint",
            SQLITE_LOG_CHECKPOINT_PAGES.to_string(),
        )
        .thread_name(super::priority::writer_thread_name);
    Ok(SqlitePoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        // Each time the connection (and so its thread) is new.
        .after_connect(|_, _| {
            Box::pin(async {
                super::priority::lower_writer_threads();
                Ok(())
            })
        })
        .connect_lazy_with(options))
}

fn pg_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    Ok(PgConnectOptions::from_str(url)?)
}

/// PostgreSQL, for a cluster of replicas, directly or through a
/// transaction-mode pooler (see [`Pg`]).
fn connect_postgres(url: &str, max_connections: u32) -> Result<sqlx::PgPool, StoreError> {
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy_with(pg_options(url)?))
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

/// Whether a client connection to `options` keeps one server session, as
/// PostgreSQL itself or a session-mode pooler does; a transaction-mode pooler
/// hands each transaction the server connection that is free. Probed with two
/// client connections: A asks its backend's pid; B then holds a transaction
/// open (a pooler that reuses the last-freed server connection, as PgBouncer
/// does by default, gives B the one A just used); A asks again. A session keeps
/// its pid; through a transaction-mode pooler A's second answer comes from
/// another backend. Simple-query statements, one round trip each, so the probe
/// itself is pooler-safe.
///
/// # Errors
/// No connection could be made.
pub fn keeps_sessions(
    options: &PgConnectOptions,
) -> futures_util::future::BoxFuture<'_, Result<bool, StoreError>> {
    // Boxed as `Send` here, where the compiler can see it is: through a generic
    // caller it fails to prove it for sqlx's executor lifetimes.
    Box::pin(async move {
        tokio::time::timeout(PROBE_BOUND, probe_sessions(options))
            .await
            .unwrap_or(Err(StoreError::TimedOut {
                operation: "the pooler check",
                bound: PROBE_BOUND,
            }))
    })
}

/// The pooler check's bound, whole: two connections and three rounds of
/// three statements, one of which may rightly wait [`ACQUIRE_TIMEOUT`].
pub const PROBE_BOUND: Duration = Duration::from_secs(10);

async fn probe_sessions(options: &PgConnectOptions) -> Result<bool, StoreError> {
    use sqlx::Connection as _;
    let connect = || async {
        tokio::time::timeout(ACQUIRE_TIMEOUT, sqlx::PgConnection::connect_with(options))
            .await
            .map_err(|_| StoreError::Unreachable {
                target: target(options),
                cause: format!("no answer within {ACQUIRE_TIMEOUT:?}"),
            })?
            .map_err(StoreError::from)
    };
    let mut a = connect().await?;
    let mut b = connect().await?;
    let mut keeps = true;
    for _ in 0..3 {
        let first = pid(&mut a).await?;
        sqlx::Executor::execute(&mut b, "BEGIN").await?;
        let held = pid(&mut b).await?;
        // Through a pooler whose every server connection B holds, A waits
        // for one: it has none of its own, so that too says "no session".
        let second = tokio::time::timeout(ACQUIRE_TIMEOUT, pid(&mut a)).await;
        sqlx::Executor::execute(&mut b, "COMMIT").await?;
        let Ok(second) = second else {
            keeps = false;
            break;
        };
        let second = second?;
        if first != second || held == first {
            keeps = false;
            break;
        }
    }
    let _ = a.close().await;
    let _ = b.close().await;
    Ok(keeps)
}

async fn pid(conn: &mut sqlx::PgConnection) -> Result<i32, StoreError> {
    // A query without arguments goes as one simple-protocol message.
    let row = sqlx::Executor::fetch_one(conn, "SELECT pg_backend_pid()").await?;
    Ok(row.try_get(0)?)
}

/// Versions and ids are at most `i64::MAX` (validated at the edge); stored signed.
pub(super) fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(super) fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}
