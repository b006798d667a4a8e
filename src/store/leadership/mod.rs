//! Feed leadership: this replica alone polls the status feed. The feed loop
//! asks for it through this handle and never touches a database driver
//! itself. SQLite serves one replica, which always leads, so this store has a
//! PostgreSQL side only.
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
//!
//! A leader that stops cleanly gives the lease back ([`Leader::release`]):
//! the row expires at once, under the same fence as every write (holder and
//! epoch), so the next replica takes the feed at its next ask instead of
//! waiting out the lease. The shape of client-go's leader election with
//! `ReleaseOnCancel`, which, on cancel, rewrites the lease it still holds so
//! that it has expired.

mod postgres;

use std::time::Duration;

use tokio::time::Instant;

use super::error::StoreError;
use super::pool::{Backend, Pg};

/// The right to ask for feed leadership: the feed loop's handle, made by
/// `Database::leadership`.
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
    /// statement, bounded by [`crate::store::Bounds::short`].
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
            .until(
                "take_lease",
                asked + pg.bounds.short(),
                postgres::take(pg, &self.holder, self.ttl),
            )
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
        postgres::check(tx, &self.holder, self.epoch, self.ttl).await
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
    /// did not finish within [`crate::store::Bounds::short`] (the caller stops
    /// leading at once: it cannot prove it still leads).
    pub async fn renew(&mut self, leadership: &Leadership) -> bool {
        let (Term::Leased(fence), Some(pg)) = (&self.term, &leadership.postgres) else {
            return true;
        };
        let asked = Instant::now();
        let backend = Backend::Postgres(pg.clone());
        let renewed = backend
            .until(
                "renew_lease",
                asked + pg.bounds.short(),
                postgres::renew(pg, &fence.holder, fence.epoch, fence.ttl),
            )
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

    /// Gives the lease back (a clean stop): it expires now if it is still
    /// this term's (same holder and epoch, not expired), so another replica
    /// takes it at its next ask; a term already lost changes nothing. One
    /// statement within [`crate::store::Bounds::short`]. True when it was
    /// given back (with SQLite there is nothing to give back: false).
    pub async fn release(self, leadership: &Leadership) -> bool {
        let (Term::Leased(fence), Some(pg)) = (&self.term, &leadership.postgres) else {
            return false;
        };
        let backend = Backend::Postgres(pg.clone());
        let released = backend
            .until(
                "release_lease",
                Instant::now() + pg.bounds.short(),
                postgres::release(pg, &fence.holder, fence.epoch),
            )
            .await;
        match released {
            Ok(true) => {
                tracing::info!(epoch = fence.epoch, "status feed: lease given back");
                true
            }
            Ok(false) => {
                tracing::info!(
                    epoch = fence.epoch,
                    "status feed: lease already lost; nothing to give back"
                );
                false
            }
            // It runs out by itself after its length, as after a crash.
            Err(error) => {
                tracing::warn!(%error, epoch = fence.epoch, "status feed: lease not given back");
                false
            }
        }
    }
}
