//! Retention: reveals older than `reveals.retention_days` are deleted in small
//! batches (no lock held long); per-ad counts are kept. "Older" is by the
//! database's clock, so a replica whose clock runs ahead deletes nothing recent.

use std::time::Duration;

use crate::config::RevealsConfig;
use crate::store::{RevealStore, RevealStoreError};

/// Rows per delete.
pub const BATCH: i64 = 5_000;
/// How often retention looks for old rows.
pub const EVERY: Duration = Duration::from_secs(600);

/// Deletes what is older than `reveals.retention_days` every [`EVERY`], until cancelled.
pub async fn run(config: RevealsConfig, store: RevealStore) {
    let keep = config.retention();
    loop {
        match delete_older_than(&store, keep).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "reveals: retention deleted old rows"),
            Err(error) => tracing::warn!(%error, "reveals: retention failed; will retry"),
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Deletes every reveal older than `keep` by the database's clock, [`BATCH`]
/// rows a transaction, until a batch finds none (not a short one: on SQLite a
/// batch is the oldest ids, a few of which may stay).
pub async fn delete_older_than(
    store: &RevealStore,
    keep: Duration,
) -> Result<u64, RevealStoreError> {
    let mut total = 0;
    loop {
        let deleted = store.delete_reveals_older_than(keep, BATCH).await?;
        total += deleted;
        if deleted == 0 {
            return Ok(total);
        }
        // Let the flush and other writers in between batches.
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AdId, CategoryId, Reveal, RevealQuery, RevealsOf, Source, UserId};

    const DAY_US: i64 = 86_400_000_000;

    /// A replica whose clock runs 400 days ahead keeps what the database's clock
    /// calls recent: rows of 1 and 29 days stay, rows of 31 and 400 days go.
    #[tokio::test]
    async fn a_replica_clock_far_ahead_deletes_nothing_recent() {
        let (_dir, database) = crate::store::Database::scratch().await;
        let store = database.reveals();
        // The machine's clock, which is also the database's.
        let now = crate::reveals::now_us();
        let reveals: Vec<Reveal> = [1u64, 29, 31, 400]
            .into_iter()
            .map(|days| Reveal {
                at_us: now - i64::try_from(days).unwrap() * DAY_US,
                viewer: None,
                user: UserId::new(42).unwrap(),
                ad: AdId::new(days).unwrap(),
                category: CategoryId::new(1).unwrap(),
                kind: Source::RealPhone,
                reason: None,
            })
            .collect();
        store.write_reveals(&reveals).await.unwrap();

        crate::reveals::test_clock::set_skew_us(400 * DAY_US);
        let deleted = delete_older_than(&store, Duration::from_secs(30 * 86_400)).await;
        crate::reveals::test_clock::set_skew_us(0);

        assert_eq!(deleted.unwrap(), 2);
        let query = RevealQuery::newest(RevealsOf::Seller(UserId::new(42).unwrap()), 100);
        let kept = store.read_reveals(&query).await.unwrap();
        let mut ads: Vec<u64> = kept.iter().map(|r| r.reveal.ad.get()).collect();
        ads.sort_unstable();
        assert_eq!(ads, [1, 29]);
    }
}
