//! Feed leadership: this replica alone polls the status feed; a lease row on
//! PostgreSQL, SQLite's one replica always leads (docs/status-sync.md, "Leadership").

mod postgres;

use std::time::Duration;

use tokio::time::Instant;

use super::error::StoreError;
use super::pool::{Backend, Pg};

/// The right to ask for feed leadership.
#[derive(Debug, Clone)]
pub struct Leadership {
    /// `None` with SQLite (the one replica leads).
    postgres: Option<Pg>,
    ttl: Duration,
    /// Host, process and a random part: never shared, also after a restart.
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

    /// How often a follower asks, and a leader renews at the least: a third of
    /// the lease, so a renewal can fail twice before it runs out.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Tries to become the leader: `None` when another replica leads.
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

/// This replica leads the feed while it holds this and [`Leader::is_valid`].
pub struct Leader {
    term: Term,
    /// When the lease ends at the earliest unless renewed (local clock).
    valid_until: Option<Instant>,
}

enum Term {
    Sole,
    Leased(Fence),
}

/// What a feed write must show: holder and epoch (the fencing token).
#[derive(Debug, Clone)]
pub struct Fence {
    holder: String,
    epoch: i64,
    ttl: Duration,
}

impl Fence {
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// Checks in `tx` that the lease is still this term's and renews it; the row
    /// stays locked until `tx` ends, so no one takes it before this write ends.
    pub(super) async fn check(&self, tx: &mut sqlx::PgConnection) -> Result<(), StoreError> {
        postgres::check(tx, &self.holder, self.epoch, self.ttl).await
    }
}

impl Leader {
    /// Whether the lease is still this replica's by the local clock: false once
    /// it may have expired, so a leader that was frozen asks the feed nothing.
    pub fn is_valid(&self) -> bool {
        self.valid_until.is_none_or(|until| Instant::now() < until)
    }

    pub fn valid_until(&self) -> Option<Instant> {
        self.valid_until
    }

    pub fn fence(&self) -> Option<&Fence> {
        match &self.term {
            Term::Sole => None,
            Term::Leased(fence) => Some(fence),
        }
    }

    /// Renews the lease: false when it is lost or the renewal failed or timed
    /// out (the caller stops leading at once: it cannot prove it leads).
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

    /// Gives the lease back (a clean stop) if still this term's; true if given.
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
