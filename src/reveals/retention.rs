//! Retention: reveals older than `reveals.retention_days` are deleted in the
//! background, a small batch per transaction, so no delete holds locks for long
//! or competes with the flush for more than a moment. The per-ad counts are kept.
//! Batch deletes rather than dropping daily partitions: they work the same on
//! both databases, and measured on PostgreSQL (see README) they remove a day of
//! a busy replica's reveals in seconds of background work.

use std::time::Duration;

use crate::store::{RevealStore, RevealStoreError};

/// Rows per delete.
pub const BATCH: i64 = 5_000;
/// How often retention looks for old rows.
pub const EVERY: Duration = Duration::from_secs(600);

/// Deletes what is older than `keep`, then again every [`EVERY`]. Runs until its
/// task is cancelled.
pub async fn run(store: RevealStore, keep: Duration) {
    loop {
        let cutoff = super::now_us() - i64::try_from(keep.as_micros()).unwrap_or(i64::MAX);
        match delete_before(&store, cutoff).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "reveals: retention deleted old rows"),
            Err(error) => tracing::warn!(%error, "reveals: retention failed; will retry"),
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Deletes every reveal before `cutoff_us`, [`BATCH`] rows a transaction.
///
/// # Errors
/// The database failed; what was deleted before stays deleted.
pub async fn delete_before(store: &RevealStore, cutoff_us: i64) -> Result<u64, RevealStoreError> {
    let mut total = 0;
    loop {
        let deleted = store.delete_reveals_before(cutoff_us, BATCH).await?;
        total += deleted;
        if deleted < BATCH as u64 {
            return Ok(total);
        }
        // Let the flush and other writers in between batches.
        tokio::task::yield_now().await;
    }
}
