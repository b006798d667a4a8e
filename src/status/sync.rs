//! The sync loop: keeps this replica's memory converged with the store.
//!
//! It catches up on a short poll (`database.sync_interval_ms`), and with
//! PostgreSQL also on every `calltracking_status` notification and after every
//! (re)connection of its listener. Notifications are only a hint: they are lost
//! while the listener is disconnected, which is why the poll exists and why every
//! reconnect is followed by a catch-up. Either way the catch-up reads the change
//! log after the last row applied, so nothing is skipped.

use std::time::Duration;

use sqlx::postgres::PgListener;

use super::StatusService;
use crate::store::Store;

/// Runs until the task is aborted.
pub async fn run(service: StatusService, poll: Duration) {
    match service.store().clone() {
        Store::Postgres(pool) => loop {
            match PgListener::connect_with(&pool).await {
                Ok(listener) => listen(&service, listener, poll).await,
                Err(error) => tracing::warn!(%error, "status sync: cannot listen; polling"),
            }
            catch_up(&service).await;
            tokio::time::sleep(poll).await;
        },
        Store::Sqlite(_) => loop {
            tokio::time::sleep(poll).await;
            catch_up(&service).await;
        },
    }
}

/// Catches up on notifications and on the poll; returns when the listener breaks.
async fn listen(service: &StatusService, mut listener: PgListener, poll: Duration) {
    if let Err(error) = listener.listen(crate::store::postgres_channel()).await {
        tracing::warn!(%error, "status sync: LISTEN failed");
        return;
    }
    // Anything committed while we were not listening.
    catch_up(service).await;
    loop {
        tokio::select! {
            notification = listener.try_recv() => match notification {
                Ok(Some(_)) => catch_up(service).await,
                // The connection dropped: notifications in between are lost; the
                // next try_recv reconnects, and we catch up right after.
                Ok(None) => {
                    tracing::info!("status sync: listener reconnecting");
                    catch_up(service).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "status sync: listener failed");
                    return;
                }
            },
            () = tokio::time::sleep(poll) => catch_up(service).await,
        }
    }
}

async fn catch_up(service: &StatusService) {
    match service.catch_up().await {
        Ok(0) => {}
        Ok(rows) => tracing::debug!(rows, "status sync: caught up"),
        Err(error) => tracing::warn!(%error, "status sync: catch-up failed; will retry"),
    }
}
