//! Change hints on PostgreSQL: a listener of its own, each (re)connection a hint.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use crate::store::error::StoreError;
use crate::store::pool::{ACQUIRE_TIMEOUT, Pg, target};

/// A failing listener is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

pub(super) struct Listening {
    /// Where it listens, for the log (host:port, never a password).
    target: String,
    warned: Option<tokio::time::Instant>,
    /// One connection to PostgreSQL itself: LISTEN through a transaction-mode
    /// pooler would leave notifications to other clients.
    pool: PgPool,
    listener: Option<PgListener>,
    retry: Duration,
    channel: &'static str,
}

impl Listening {
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
                // The connection dropped; the next try_recv reconnects, and the
                // notifications in between are lost: a hint too.
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

    /// Connects and listens within twice [`ACQUIRE_TIMEOUT`]: a database that
    /// accepts and then says nothing is retried.
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
