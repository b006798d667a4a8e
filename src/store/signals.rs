//! What the database offers the status loops beyond reads and writes, so that they
//! never touch a database driver themselves: *change hints* (the change log may
//! have grown: catch up now rather than at the next poll), for the sync loop, and
//! *feed leadership* (this replica alone polls the status feed), for the feed loop.
//!
//! PostgreSQL: hints are `LISTEN calltracking_status` notifications, plus one
//! after every (re)connection of the listener, since notifications sent while it
//! was away are lost. Leadership is `pg_try_advisory_lock` held on a dedicated
//! connection outside the pool: a pooled connection can be recycled silently,
//! which would hand the lock to nobody, or to two leaders. SQLite serves one
//! replica: it has no hints (the local writer catches up itself) and always leads.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};

use super::StoreError;
use super::database::{Backend, Pg};
use super::status::CHANNEL;

/// Advisory lock key of the status-feed leader.
const FEED_LOCK: i64 = 0x6374_6665_6564_6c64;

/// A failing listener is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A source of change hints; see the module doc.
pub struct ChangeHints {
    postgres: Option<Listening>,
}

struct Listening {
    /// Where it listens, for the log (host:port, never a password).
    target: String,
    /// When a failure was last logged: one line per [`WARN_EVERY`] at most.
    warned: Option<tokio::time::Instant>,
    /// One connection to PostgreSQL itself (`database.direct_url` when set):
    /// LISTEN through a transaction-mode pooler would leave notifications on
    /// server connections that other clients are handed next.
    pool: PgPool,
    listener: Option<PgListener>,
    /// Pause between attempts to (re)connect the listener.
    retry: Duration,
}

impl ChangeHints {
    pub(super) fn of(backend: &Backend, retry: Duration, listen: bool) -> Self {
        ChangeHints {
            postgres: match backend {
                Backend::Postgres(Pg { direct, .. }) if listen => Some(Listening {
                    target: super::database::target(direct),
                    warned: None,
                    pool: PgPoolOptions::new()
                        .max_connections(1)
                        .acquire_timeout(super::database::ACQUIRE_TIMEOUT)
                        .connect_lazy_with((**direct).clone()),
                    listener: None,
                    retry,
                }),
                Backend::Postgres(_) | Backend::Sqlite(_) => None,
            },
        }
    }

    /// Completes at the next hint; with SQLite, or with listening off, never. Cancel-safe: a caller may
    /// race it against a poll timer and call it again.
    pub async fn next(&mut self) {
        match &mut self.postgres {
            Some(listening) => listening.next().await,
            None => std::future::pending().await,
        }
    }
}

impl Listening {
    async fn next(&mut self) {
        loop {
            let Some(listener) = &mut self.listener else {
                match self.connect().await {
                    Ok(listener) => {
                        if self.warned.take().is_some() {
                            tracing::info!(target = %self.target, "status sync: listening again");
                        }
                        self.listener = Some(listener);
                        // Whatever was committed while nobody listened.
                        return;
                    }
                    Err(error) => {
                        if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                            self.warned = Some(tokio::time::Instant::now());
                            tracing::warn!(%error, target = %self.target, "status sync: cannot listen; polling");
                        }
                        tokio::time::sleep(self.retry).await;
                        continue;
                    }
                }
            };
            match listener.try_recv().await {
                Ok(Some(_)) => return,
                // The connection dropped and the next try_recv reconnects: the
                // notifications in between are lost, so this is a hint too.
                Ok(None) => {
                    tracing::info!("status sync: listener reconnecting");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "status sync: listener failed");
                    self.listener = None;
                }
            }
        }
    }

    async fn connect(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(listener)
    }
}

/// The right to ask for feed leadership: the feed loop's handle, made by
/// [`super::Database::leadership`].
#[derive(Debug, Clone)]
pub struct Leadership {
    /// Where a session lock means something: PostgreSQL itself (never the
    /// pooler); `None` with SQLite.
    direct: Option<sqlx::postgres::PgConnectOptions>,
}

impl Leadership {
    pub(super) fn of(backend: &Backend) -> Self {
        Leadership {
            direct: match backend {
                Backend::Sqlite(_) => None,
                Backend::Postgres(Pg { direct, .. }) => Some((**direct).clone()),
            },
        }
    }

    /// Tries to become the leader: `None` when another replica leads.
    ///
    /// # Errors
    /// The database is unreachable.
    pub async fn try_take(&self) -> Result<Option<Leader>, StoreError> {
        let options = match &self.direct {
            None => return Ok(Some(Leader(Held::Sole))),
            // PostgreSQL itself: a session lock means nothing through a pooler.
            Some(direct) => direct,
        };
        let mut connection = PgConnection::connect_with(options).await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .persistent(false)
            .bind(FEED_LOCK)
            .fetch_one(&mut connection)
            .await?;
        if locked {
            return Ok(Some(Leader(Held::Locked(connection))));
        }
        // Not ours: give the connection back now, not at the next attempt.
        let _ = connection.close().await;
        Ok(None)
    }
}

/// This replica leads the status feed while it holds this.
pub struct Leader(Held);

enum Held {
    /// The one replica of an SQLite store.
    Sole,
    /// The connection holding the session advisory lock.
    Locked(PgConnection),
}

impl Leader {
    /// Whether leadership still holds: the lock lives as long as its connection.
    pub async fn still_held(&mut self) -> bool {
        match &mut self.0 {
            Held::Sole => true,
            Held::Locked(connection) => match connection.ping().await {
                Ok(()) => true,
                Err(error) => {
                    tracing::warn!(%error, "status feed: leadership connection lost");
                    false
                }
            },
        }
    }
}
