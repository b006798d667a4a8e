//! What the database offers the status loops beyond reads and writes, so that they
//! never touch a database driver themselves: *change hints* (the change log may
//! have grown: catch up now rather than at the next poll), for the sync loop, and
//! *feed leadership* (this replica alone polls the status feed), for the feed loop.
//!
//! PostgreSQL: hints are `LISTEN calltracking_status` notifications, plus one
//! after every (re)connection of the listener, since notifications sent while it
//! was away are lost. SQLite serves one replica: it has no hints (the local
//! writer catches up itself) and always leads.
//!
//! Leadership on PostgreSQL is a *lease*: a row of the `leases` table
//! (migration 0006) naming its holder, an epoch and when it expires, on the
//! database's clock. Taken with one conditional UPDATE (expired, or already
//! this replica's), which moves the epoch on; renewed with another (still this
//! replica's, same epoch, not expired); and every write the leader makes for
//! the feed (its pages and cursor) repeats the renewal's condition in its own
//! transaction, so that a leader that lost the lease, however late it wakes,
//! cannot write after its successor (the epoch is the fencing token). The
//! shape of Kubernetes `Lease` objects (holder, duration, renew time,
//! transitions) and of the leader tables of PostgreSQL job queues (river's
//! `river_leader`: elected_at, expires_at). It replaced a session advisory lock
//! on a connection of its own, which a frozen leader, or one cut off from the
//! database by a network that drops packets while the connection stays open,
//! kept for ever: PostgreSQL saw a session that was merely idle. A lease needs
//! no session, so it goes through the pool, pooler or not.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::time::Instant;

use super::StoreError;
use super::database::{Backend, Pg};
use super::status::CHANNEL;

/// The feed's row in the `leases` table (migration 0006 creates it, expired).
const FEED_LEASE: &str = "status_feed";

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

    /// Connects and listens, within [`ACQUIRE_TIMEOUT`] and as long again:
    /// a database that accepts the connection and then says nothing is
    /// retried like one that refuses it.
    ///
    /// [`ACQUIRE_TIMEOUT`]: super::ACQUIRE_TIMEOUT
    async fn connect(&self) -> Result<PgListener, StoreError> {
        let bound = super::ACQUIRE_TIMEOUT * 2;
        let connect = async {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen(CHANNEL).await?;
            Ok(listener)
        };
        tokio::time::timeout(bound, connect)
            .await
            .unwrap_or(Err(StoreError::TimedOut {
                operation: "listen",
                bound,
            }))
    }
}

/// The right to ask for feed leadership: the feed loop's handle, made by
/// [`super::Database::leadership`].
#[derive(Debug, Clone)]
pub struct Leadership {
    /// The pool the lease row is read and written through; `None` with
    /// SQLite (the one replica leads).
    postgres: Option<Pg>,
    /// How long a lease lasts after its last renewal.
    ttl: Duration,
    /// This replica, as the lease's holder: host, process and a random part,
    /// so that two replicas never share it, also after a restart.
    holder: String,
}

impl Leadership {
    pub(super) fn of(backend: &Backend, ttl: Duration) -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_default();
        let random = getrandom::u64().unwrap_or_else(|_| u64::from(std::process::id()));
        Leadership {
            postgres: match backend {
                Backend::Sqlite(_) => None,
                Backend::Postgres(pg) => Some(pg.clone()),
            },
            ttl,
            holder: format!("{host}/{}/{random:016x}", std::process::id()),
        }
    }

    /// How often a follower asks, and a leader renews at the least: a third
    /// of the lease, so a renewal can fail twice before the lease runs out.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Tries to become the leader: `None` when another replica leads. One
    /// statement, bounded by [`super::Bounds::short`].
    ///
    /// # Errors
    /// The database is unreachable or did not answer in time.
    pub async fn try_take(&self) -> Result<Option<Leader>, StoreError> {
        let Some(pg) = &self.postgres else {
            return Ok(Some(Leader {
                term: Term::Sole,
                valid_until: None,
            }));
        };
        let asked = Instant::now();
        let backend = Backend::Postgres(pg.clone());
        let epoch: Option<i64> = backend
            .until("take_lease", asked + pg.bounds.short(), async {
                let mut tx = pg.begin_short().await?;
                let epoch = sqlx::query_scalar(
                    "UPDATE leases SET holder = $2, epoch = epoch + 1, \
                     acquired_at = clock_timestamp(), renewed_at = clock_timestamp(), \
                     expires_at = clock_timestamp() + $3::int8 * interval '1 millisecond' \
                     WHERE name = $1 AND (expires_at <= clock_timestamp() OR holder = $2) \
                     RETURNING epoch",
                )
                .persistent(false)
                .bind(FEED_LEASE)
                .bind(&self.holder)
                .bind(millis(self.ttl))
                .fetch_optional(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(epoch)
            })
            .await?;
        Ok(epoch.map(|epoch| Leader {
            term: Term::Leased(Fence {
                holder: self.holder.clone(),
                epoch,
                ttl: self.ttl,
            }),
            // Measured from before the question: the database's clock set the
            // expiry later than that, so the lease ends no sooner than this.
            valid_until: Some(asked + self.ttl),
        }))
    }
}

/// This replica leads the status feed while it holds this and
/// [`Leader::is_valid`] says so.
pub struct Leader {
    term: Term,
    /// When the lease ends at the earliest unless renewed (local clock);
    /// `None`: never (SQLite).
    valid_until: Option<Instant>,
}

enum Term {
    /// The one replica of an SQLite store.
    Sole,
    /// A term of the PostgreSQL lease.
    Leased(Fence),
}

/// What a feed write must show to be taken: the lease's holder and epoch
/// (the fencing token), checked in the write's own transaction.
#[derive(Debug, Clone)]
pub struct Fence {
    holder: String,
    epoch: i64,
    ttl: Duration,
}

impl Fence {
    /// The epoch of the term (logs, tests).
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Checks, in `tx`, that the lease is still this term's and not expired,
    /// and renews it: the row stays locked until `tx` ends, so no other
    /// replica can take the lease before this write commits or rolls back.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when it is not; the database's own errors.
    pub(super) async fn check(&self, tx: &mut sqlx::PgConnection) -> Result<(), StoreError> {
        let renewed = sqlx::query(
            "UPDATE leases SET renewed_at = clock_timestamp(), \
             expires_at = clock_timestamp() + $4::int8 * interval '1 millisecond' \
             WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > clock_timestamp()",
        )
        .persistent(false)
        .bind(FEED_LEASE)
        .bind(&self.holder)
        .bind(self.epoch)
        .bind(millis(self.ttl))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if renewed == 1 {
            Ok(())
        } else {
            Err(StoreError::LeaseLost(FEED_LEASE))
        }
    }
}

impl Leader {
    /// Whether the lease is still this replica's by the local clock: false
    /// from the moment it may have expired (a leader that was frozen finds
    /// it false when it wakes, before it asks the feed anything).
    pub fn is_valid(&self) -> bool {
        self.valid_until.is_none_or(|until| Instant::now() < until)
    }

    /// When the lease ends at the earliest unless renewed; `None`: never.
    pub fn valid_until(&self) -> Option<Instant> {
        self.valid_until
    }

    /// The fencing token every feed write carries; `None` with SQLite.
    pub fn fence(&self) -> Option<&Fence> {
        match &self.term {
            Term::Sole => None,
            Term::Leased(fence) => Some(fence),
        }
    }

    /// Renews the lease: false when it is lost, or when the renewal failed or
    /// did not finish within [`super::Bounds::short`] (the caller stops
    /// leading at once: it cannot prove it still leads).
    pub async fn renew(&mut self, leadership: &Leadership) -> bool {
        let (Term::Leased(fence), Some(pg)) = (&self.term, &leadership.postgres) else {
            return true;
        };
        let asked = Instant::now();
        let backend = Backend::Postgres(pg.clone());
        let renewed = backend
            .until("renew_lease", asked + pg.bounds.short(), async {
                let mut tx = pg.begin_short().await?;
                fence.check(&mut tx).await?;
                tx.commit().await?;
                Ok(())
            })
            .await;
        match renewed {
            // Still this term's (no take happened: it would have moved the
            // epoch on), also if it arrives late by the local clock.
            Ok(()) => {
                self.valid_until = Some(asked + fence.ttl);
                true
            }
            Err(error) => {
                tracing::warn!(%error, epoch = fence.epoch, "status feed: lease not renewed");
                self.valid_until = Some(asked);
                false
            }
        }
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
