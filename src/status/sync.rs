//! The sync loop: keeps this replica's memory converged with the store.
//!
//! It catches up on a short poll (`database.sync_interval_ms`) and on every
//! change hint the store gives (PostgreSQL notifications, and every reconnection
//! of the listener). Hints are only hints: they are lost while the listener is
//! away, which is why the poll exists. Either way the catch-up reads the change
//! log after the last row applied, so nothing is skipped.

use std::time::Duration;

use super::StatusService;

/// Runs until its task is cancelled. Without `listen`, the poll alone.
pub async fn run(service: StatusService, poll: Duration, listen: bool) {
    let mut hints = service.store().change_hints(poll, listen);
    loop {
        tokio::select! {
            () = hints.next() => {}
            () = tokio::time::sleep(poll) => {}
        }
        match service.catch_up().await {
            Ok(0) => {}
            Ok(rows) => tracing::debug!(rows, "status sync: caught up"),
            Err(error) => tracing::warn!(%error, "status sync: catch-up failed; will retry"),
        }
    }
}
