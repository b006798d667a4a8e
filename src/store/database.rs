//! The opened database: connecting (SQLite creates its file, PostgreSQL
//! connects lazily), migrations, the pooler check, closing, and the store
//! handles, each made from the one pool ([`Backend`]) the [`Database`] holds;
//! on SQLite, the reveal log's writer, a connection of its own whose thread
//! runs at background priority.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Row as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::budgets::BudgetStore;
use super::error::StoreError;
use super::hints::ChangeHints;
use super::leadership::Leadership;
use super::migrations::{self, Migrations, Until};
use super::pool::{ACQUIRE_TIMEOUT, Backend, Bounds, Pg, Sqlite, target};
use super::reveals::RevealStore;
use super::status::StatusStore;
use crate::config::DatabaseConfig;

/// The one database the app opened: the source of every store handle, and
/// the work that concerns the database as a whole (migrations, the pooler
/// check, closing). Owned by `app`; cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Database {
    backend: Backend,
    /// SQLite only: the reveal log's writer, a connection of its own (see
    /// [`connect_sqlite_log_writer`]).
    log_writer: Option<sqlx::SqlitePool>,
    /// The migration that runs now (see [`Database::migrate`]).
    migrations: Migrations,
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

    /// Opens `[database]` as [`Database::connect`] does: `url` with
    /// `max_connections`, every call bounded by `statement_timeout_ms` and
    /// `lock_timeout_ms`; for PostgreSQL, `direct_url` (when set) reaches
    /// PostgreSQL itself when `url` is a transaction-mode pooler (see [`Pg`]).
    ///
    /// # Errors
    /// A URL that does not parse, or an SQLite file that cannot be created.
    pub async fn open(config: &DatabaseConfig) -> Result<Database, StoreError> {
        let bounds = Bounds {
            statement: config.statement_timeout,
            lock: config.lock_timeout,
        };
        let url = config.url.expose();
        Database::connect_via(url, config.direct_url(), config.max_connections, bounds).await
    }

    /// [`Database::open`] in loose terms, for tests that set bounds of their
    /// own without a `[database]` section.
    ///
    /// # Errors
    /// As [`Database::open`].
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
            Backend::Sqlite(Sqlite { pool, bounds })
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
            migrations: Migrations::default(),
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
    /// [`ChangeHints`]); a broken listener is retried every
    /// `database.sync_interval_ms`. Without `database.listen`, none: the
    /// caller's poll alone finds changes.
    pub fn change_hints(&self, config: &DatabaseConfig) -> ChangeHints {
        ChangeHints::of(&self.backend, config.sync_interval, config.listen)
    }

    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Applies the embedded migrations of this database kind that are
    /// pending, one at a time and each to its end (a migration's time grows
    /// with the data it rewrites), saying in [`Database::migrations`] and
    /// the log which one runs and for how long; what does not grow with the
    /// data is bounded (see `store::migrations`).
    ///
    /// # Errors
    /// The database is unreachable or stopped answering, or a migration
    /// failed.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_until(Until::All).await.map(|_| ())
    }

    /// As [`Database::migrate`], the pending migrations that answering needs
    /// alone: those after the last of them touch the reveal log's tables
    /// only, and a replica runs them beside its answers (see
    /// `store::migrations`). Returns how many of those are left for
    /// [`Database::migrate`].
    ///
    /// # Errors
    /// As [`Database::migrate`].
    pub async fn migrate_for_answers(&self) -> Result<usize, StoreError> {
        self.migrate_until(Until::Answers).await
    }

    async fn migrate_until(&self, until: Until) -> Result<usize, StoreError> {
        match &self.backend {
            Backend::Sqlite(sqlite) => {
                let migrator = sqlx::migrate!("migrations/sqlite");
                migrations::run_sqlite(&sqlite.pool, (&migrator, until), &self.migrations).await
            }
            Backend::Postgres(pg) => {
                let migrator = sqlx::migrate!("migrations/postgres");
                migrations::run_postgres(pg, (&migrator, until), &self.migrations).await
            }
        }
    }

    /// As [`Database::migrate`], the whole run given up on the client after
    /// `bound` when one is given (`None`: as [`Database::migrate`]).
    ///
    /// # Errors
    /// As [`Database::migrate`], or the bound ran out.
    pub async fn migrate_within(&self, bound: Option<Duration>) -> Result<(), StoreError> {
        let Some(bound) = bound else {
            return self.migrate().await;
        };
        tokio::time::timeout(bound, self.migrate())
            .await
            .unwrap_or(Err(StoreError::TimedOut {
                operation: "the migrations",
                bound,
            }))
    }

    /// The migration that runs now, if one does (for `/readyz`).
    pub fn migrations(&self) -> &Migrations {
        &self.migrations
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

    /// The embedded migrations of this database kind, in order, each with
    /// whether this database has applied it (`phones-gateway migrate
    /// --status`). Reads only: a database no migration has touched has no
    /// `_sqlx_migrations` table, and nothing applied.
    ///
    /// # Errors
    /// The database is unreachable or the read failed.
    pub async fn migration_status(&self) -> Result<Vec<MigrationState>, StoreError> {
        let (migrator, applied): (sqlx::migrate::Migrator, Vec<i64>) = match &self.backend {
            Backend::Sqlite(sqlite) => {
                let exists: Option<String> = sqlx::query_scalar(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
                )
                .fetch_optional(&sqlite.pool)
                .await?;
                let applied = match exists {
                    Some(_) => {
                        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                            .fetch_all(&sqlite.pool)
                            .await?
                    }
                    None => Vec::new(),
                };
                (sqlx::migrate!("migrations/sqlite"), applied)
            }
            Backend::Postgres(Pg { pool, .. }) => {
                let exists: bool =
                    sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                        .fetch_one(pool)
                        .await?;
                let applied = if exists {
                    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                        .fetch_all(pool)
                        .await?
                } else {
                    Vec::new()
                };
                (sqlx::migrate!("migrations/postgres"), applied)
            }
        };
        Ok(migrator
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .map(|m| MigrationState {
                version: m.version,
                description: m.description.to_string(),
                applied: applied.contains(&m.version),
            })
            .collect())
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

/// One embedded migration, and whether the database has applied it
/// ([`Database::migration_status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationState {
    /// Its number, as its file is named (`0011_reveal_buckets.sql`: 11).
    pub version: i64,
    /// Its file name's words (`reveal buckets`).
    pub description: String,
    pub applied: bool,
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
/// pool. Its thread yields the core to requests ([`lower_writer_threads`]).
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
        .thread_name(writer_thread_name);
    Ok(SqlitePoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        // Each time the connection (and so its thread) is new.
        .after_connect(|_, _| {
            Box::pin(async {
                lower_writer_threads();
                Ok(())
            })
        })
        .connect_lazy_with(options))
}

/// The name of the reveal log's SQLite connection thread, by which
/// [`lower_writer_threads`] finds it: at most 15 bytes with its number,
/// Linux's limit for a thread name.
fn writer_thread_name(id: u64) -> String {
    format!("{WRITER}{id}")
}

const WRITER: &str = "reveal-writer";

/// Lowers every live thread named by [`writer_thread_name`] to
/// [`crate::runtime::BACKGROUND_NICE`]: the reveal log's writer is background
/// work (see [`crate::runtime`]'s module doc). The thread is sqlx's, made when
/// the connection opens, so it is found by its name in `/proc/self/task` once
/// its connection is open.
#[cfg(target_os = "linux")]
fn lower_writer_threads() {
    let tasks = match std::fs::read_dir("/proc/self/task") {
        Ok(tasks) => tasks,
        Err(error) => {
            tracing::warn!(%error, "reveals: cannot list threads; the writer keeps its priority");
            return;
        }
    };
    for task in tasks.flatten() {
        let is_writer = std::fs::read_to_string(task.path().join("comm"))
            .is_ok_and(|name| name.starts_with(WRITER));
        let tid = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok());
        if let (true, Some(tid)) = (is_writer, tid.and_then(rustix::process::Pid::from_raw)) {
            crate::runtime::lower_thread(tid);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_writer_threads() {}

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
/// three statements, one of which may rightly wait [`ACQUIRE_TIMEOUT`] (and
/// then ends the check). Milliseconds when the database answers; with the
/// start's retry pause and the other start-up calls, a start that met a
/// silent database is ready within 10 s of it answering (docs/status-sync.md,
/// "Every call and its bound").
pub const PROBE_BOUND: Duration = Duration::from_secs(6);

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
