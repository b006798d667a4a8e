//! The status-feed puller (docs/status-sync.md): one replica at a time polls the call-tracking
//! feed and stores what it gets through the same write path as the webhook, with
//! the feed cursor in the same transaction as the changes it brought.
//!
//! Which replica leads is the store's business ([`crate::store::Leadership`],
//! a lease, handed in by `app`): a follower asks for the lease every third of
//! its length (or every interval, when that is shorter); the leader renews it
//! before every poll and at least as often, and stops leading the moment a
//! renewal fails or does not answer in time, since it can no longer prove
//! that it leads. Within a poll it asks the feed for a page only while the
//! lease is still its own by the local clock (a leader woken from a freeze
//! finds it expired and asks nothing), and each page is stored under the
//! lease's fencing token, which the store checks in the page's transaction:
//! a page read under a lease that was lost meanwhile is not stored, so the
//! cursor never moves back behind a successor's.

use std::time::Duration;

use tokio::time::Instant;

use super::StatusService;
use crate::config::StatusFeedConfig;
use crate::domain::StatusChange;
use crate::store::{Leader, Leadership, StoreError};
use crate::upstream::Upstreams;

/// A failure to ask for the lease is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Polls as `[upstreams.calltracking.status_feed]` says while this replica
/// holds the lease; runs until its task is cancelled.
pub async fn run(
    config: StatusFeedConfig,
    service: StatusService,
    leadership: Leadership,
    upstreams: std::sync::Arc<Upstreams>,
) {
    let (interval, limit) = (config.interval, config.limit);
    let ask_every = leadership.renew_every().min(interval);
    let mut warned: Option<Instant> = None;
    loop {
        match leadership.try_take().await {
            Ok(Some(leader)) => {
                warned = None;
                lead(&service, &leadership, leader, &upstreams, interval, limit).await;
            }
            Ok(None) => {}
            Err(error) => {
                if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    warned = Some(Instant::now());
                    tracing::warn!(%error, "status feed: cannot ask for leadership");
                }
            }
        }
        tokio::time::sleep(ask_every).await;
    }
}

/// Polls every `interval` while the lease holds, renewing it before each
/// poll and at least every [`Leadership::renew_every`].
async fn lead(
    service: &StatusService,
    leadership: &Leadership,
    mut leader: Leader,
    upstreams: &Upstreams,
    interval: Duration,
    limit: u32,
) {
    tracing::info!(
        epoch = leader.fence().map(crate::store::Fence::epoch),
        "status feed: this replica is the leader"
    );
    service.set_feed_leader(true);
    let mut next_poll = Instant::now();
    loop {
        if Instant::now() >= next_poll {
            // No longer than the lease: past it, a renewal decides.
            let polled = match leader.valid_until() {
                Some(until) => {
                    tokio::time::timeout_at(until, poll(service, upstreams, limit, &leader))
                        .await
                        .unwrap_or(Polled::Expired)
                }
                None => poll(service, upstreams, limit, &leader).await,
            };
            next_poll = match polled {
                Polled::LeaseLost => break,
                // A catch-up longer than the lease goes on once renewed.
                Polled::Expired => Instant::now(),
                Polled::Done => Instant::now() + interval,
            };
        }
        // Renewed at the latest when the lease would end, at once after a poll
        // that outlasted it.
        let renew_at = Instant::now() + leadership.renew_every();
        let wake = next_poll.min(renew_at);
        tokio::time::sleep_until(leader.valid_until().map_or(wake, |until| wake.min(until))).await;
        // The gauge says what this replica can prove: past the lease by its
        // own clock, not the leader until a renewal says so again.
        if !leader.is_valid() {
            service.set_feed_leader(false);
        }
        if !leader.renew(leadership).await {
            break;
        }
        service.set_feed_leader(true);
    }
    tracing::warn!("status feed: no longer the leader");
    service.set_feed_leader(false);
}

#[derive(Debug, PartialEq, Eq)]
enum Polled {
    /// Caught up, or stopped by an error to be retried at the next poll.
    Done,
    /// Not caught up, but the lease ran out by the local clock: renew, then
    /// go on (a store write renews it in the database, not here).
    Expired,
    /// The lease is gone: stop leading.
    LeaseLost,
}

/// Reads pages from the stored cursor until the feed is caught up, while the
/// lease is this replica's.
async fn poll(
    service: &StatusService,
    upstreams: &Upstreams,
    limit: u32,
    leader: &Leader,
) -> Polled {
    let mut cursor = match service.store().feed_cursor().await {
        Ok(cursor) => cursor,
        Err(error) => {
            tracing::warn!(%error, "status feed: cannot read the cursor");
            return Polled::Done;
        }
    };
    loop {
        if !leader.is_valid() {
            return Polled::Expired;
        }
        let page = match upstreams.status_page(cursor.as_deref(), limit).await {
            Ok(page) => page,
            Err(error) => {
                tracing::warn!(%error, "status feed: poll failed");
                return Polled::Done;
            }
        };
        if page.items.is_empty() {
            return Polled::Done;
        }
        let valid: Vec<StatusChange> = page
            .items
            .iter()
            .filter_map(|item| item.parse().ok())
            .collect();
        if valid.len() < page.items.len() {
            tracing::warn!(
                skipped = page.items.len() - valid.len(),
                "status feed: invalid items skipped"
            );
        }
        let next = page.next_cursor.clone().or(cursor.clone());
        let feed = next.as_deref().map(|next| (next, leader.fence()));
        match service.apply_changes(&valid, feed).await {
            Ok(applied) => tracing::debug!(
                applied = applied.applied,
                ignored = applied.ignored,
                "status feed page stored"
            ),
            Err(error) if matches!(error.cause(), StoreError::LeaseLost(_)) => {
                tracing::warn!(%error, "status feed: page not stored");
                return Polled::LeaseLost;
            }
            Err(error) => {
                tracing::warn!(%error, "status feed: page not stored; will retry from the same cursor");
                return Polled::Done;
            }
        }
        if next == cursor {
            return Polled::Done;
        }
        cursor = next;
    }
}
