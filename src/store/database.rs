//! The opened database: connecting, migrations, the pooler check, closing,
//! and the store handles, each made from the one pool ([`Backend`]) it holds.

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

/// The one database the app opened; cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Database {
    backend: Backend,
    /// SQLite only: the reveal log's writer ([`connect_sqlite_log_writer`]).
    log_writer: Option<sqlx::SqlitePool>,
    migrations: Migrations,
}

impl Database {
    /// A migrated SQLite database in a fresh directory, for unit tests.
    #[cfg(test)]
    pub(crate) async fn scratch() -> (tempfile::TempDir, Database) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}/scratch.db", dir.path().display());
        let database = Database::connect(&url, 2).await.expect("a SQLite file");
        database.migrate().await.expect("the migrations");
        (dir, database)
    }

    /// Opens a pool. PostgreSQL connects lazily, so a database that is down at
    /// start delays readiness instead of failing the start.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Database, StoreError> {
        Database::connect_via(url, None, max_connections, Bounds::default()).await
    }

    /// Opens `[database]`; `direct_url`, when set, reaches PostgreSQL itself
    /// behind a transaction-mode pooler (see [`Pg`]).
    pub async fn open(config: &DatabaseConfig) -> Result<Database, StoreError> {
        let bounds = Bounds {
            statement: config.statement_timeout,
            lock: config.lock_timeout,
        };
        let url = config.url.expose();
        Database::connect_via(url, config.direct_url(), config.max_connections, bounds).await
    }

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

    pub fn status(&self) -> StatusStore {
        StatusStore::of(self.backend.clone())
    }

    pub fn reveals(&self) -> RevealStore {
        RevealStore::of(self.backend.clone(), self.log_writer.clone())
    }

    pub fn budgets(&self) -> BudgetStore {
        BudgetStore::of(self.backend.clone())
    }

    pub fn leadership(&self, ttl: Duration) -> Leadership {
        Leadership::of(&self.backend, ttl)
    }

    pub fn change_hints(&self, config: &DatabaseConfig) -> ChangeHints {
        ChangeHints::of(&self.backend, config.sync_interval, config.listen)
    }

    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Applies every pending embedded migration (see `store::migrations`).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_until(Until::All).await.map(|_| ())
    }

    /// As [`Database::migrate`], those answering needs; returns how many are left.
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

    /// As [`Database::migrate`], given up on the client after `bound` if any.
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

    pub fn migrations(&self) -> &Migrations {
        &self.migrations
    }

    /// Whether the session connection (`direct_url`, or `url` without it) is a
    /// transaction-mode pooler (see [`keeps_sessions`]).
    pub async fn lacks_session(&self) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(false),
            Backend::Postgres(pg) => keeps_sessions(&pg.direct).await.map(|keeps| !keeps),
        }
    }

    /// The embedded migrations, each with whether it is applied. Reads only.
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationState {
    /// Its number, as its file is named (`0011_reveal_buckets.sql`: 11).
    pub version: i64,
    pub description: String,
    pub applied: bool,
}

/// SQLite for one replica: WAL, `synchronous = FULL` (docs/status-sync.md,
/// "The set"); `lock` is its busy timeout.
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

/// The page cache of the reveal log's SQLite writer, in KiB, so a flush does not
/// spill dirty pages mid-transaction; RSS grows by at most this much.
pub(super) const SQLITE_LOG_CACHE_KIB: u32 = 32 * 1024;

/// WAL pages after which a commit on the reveal log's writer checkpoints
/// (SQLite's default: 1,000): a page rewritten by every flush is copied once.
pub(super) const SQLITE_LOG_CHECKPOINT_PAGES: u32 = 8_000;

/// The reveal log's writer on SQLite: one connection held open, so its page
/// cache stays warm between flushes, on a thread at background priority
/// ([`lower_writer_threads`]). Connects lazily: [`connect_sqlite`] made the file.
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

/// Named so that [`lower_writer_threads`] finds it: at most 15 bytes with its
/// number, Linux's limit for a thread name.
fn writer_thread_name(id: u64) -> String {
    format!("{WRITER}{id}")
}

const WRITER: &str = "reveal-writer";

/// Lowers every live writer thread to [`crate::runtime::BACKGROUND_NICE`]; the
/// thread is sqlx's, so it is found by its name.
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

fn connect_postgres(url: &str, max_connections: u32) -> Result<sqlx::PgPool, StoreError> {
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy_with(pg_options(url)?))
}
/// Whether a client connection to `options` keeps one server session, as
/// PostgreSQL itself does and a transaction-mode pooler does not. The probe:
/// docs/status-sync.md, "Behind a transaction-mode pooler".
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

/// The pooler check's bound, whole (docs/status-sync.md, "Every call and its bound").
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
