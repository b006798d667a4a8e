//! Change hints on PostgreSQL: a listener on a connection of its own to
//! PostgreSQL itself, reconnected after a failure, each (re)connection a hint.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use crate::store::error::StoreError;
use crate::store::pool::{ACQUIRE_TIMEOUT, Pg, target};

/// A failing listener is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

pub(super) struct Listening {
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
    /// The channel it listens on.
    channel: &'static str,
}

impl Listening {
    /// Listens on `channel` through PostgreSQL itself (`direct`), lazily:
    /// the first [`Listening::next`] connects.
    pub(super) fn new(pg: &Pg, channel: &'static str, retry: Duration) -> Self {
        Listening {
            target: target(&pg.direct),
            warned: None,
            pool: PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_lazy_with((*pg.direct).clone()),
            listener: None,
            retry,
            channel,
        }
    }

    /// Completes at the next hint (see `ChangeHints::next`).
    pub(super) async fn next(&mut self) {
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
    async fn connect(&self) -> Result<PgListener, StoreError> {
        let bound = ACQUIRE_TIMEOUT * 2;
        let connect = async {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen(self.channel).await?;
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
