//! The sync loop: keeps memory converged with the store, catching up on a poll
//! (`database.sync_interval_ms`, for hints lost while the listener is away) and
//! on every change hint (docs/status-sync.md, "Replication between replicas").

use std::time::Duration;

use tokio::time::Instant;

use super::StatusService;
use crate::store::{ChangeHints, StatusStoreError};

/// A failing catch-up is logged at most this often (with how many failed).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Runs until its task is cancelled, catching up every `poll` and on every
/// hint (`app` makes the hints: none without `database.listen`).
pub async fn run(service: StatusService, mut hints: ChangeHints, poll: Duration) {
    let mut failing = Failing::default();
    loop {
        tokio::select! {
            () = hints.next() => {}
            () = tokio::time::sleep(poll) => {}
        }
        match service.catch_up().await {
            Ok(rows) => {
                failing.recovered();
                if rows > 0 {
                    tracing::debug!(rows, "status sync: caught up");
                }
            }
            Err(error) => failing.failed(&error),
        }
    }
}

/// Failed catch-ups since the last one that worked, for rate-limited logs.
#[derive(Default)]
struct Failing {
    count: u64,
    last_warned: Option<Instant>,
}

impl Failing {
    fn failed(&mut self, error: &StatusStoreError) {
        self.count += 1;
        if self.last_warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            self.last_warned = Some(Instant::now());
            tracing::warn!(%error, failed = self.count, "status sync: catch-up failed; will retry");
        }
    }

    fn recovered(&mut self) {
        if self.count > 0 {
            tracing::info!(failed = self.count, "status sync: caught up again");
        }
        *self = Failing::default();
    }
}
