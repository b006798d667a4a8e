//! The status-feed puller: one replica at a time (the store's lease,
//! [`crate::store::Leadership`]; docs/status-sync.md, "Leadership") polls the
//! call-tracking feed and stores what it gets through the webhook's write path,
//! the cursor in the same transaction. A clean stop gives the lease back at the
//! next page boundary, so the next replica takes the feed without a lease's wait.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::StatusService;
use crate::config::StatusFeedConfig;
use crate::domain::StatusChange;
use crate::store::{Leader, Leadership, StoreError};
use crate::upstream::Upstreams;

/// A failure to ask for the lease is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Polls as `[upstreams.calltracking.status_feed]` says while this replica holds
/// the lease; returns once `stop` is cancelled, the lease given back.
pub async fn run(
    config: StatusFeedConfig,
    service: StatusService,
    leadership: Leadership,
    upstreams: std::sync::Arc<Upstreams>,
    stop: CancellationToken,
) {
    let (interval, limit) = (config.interval, config.limit);
    let ask_every = leadership.renew_every().min(interval);
    let mut warned: Option<Instant> = None;
    let leading = Leading {
        service: &service,
        leadership: &leadership,
        upstreams: &upstreams,
        interval,
        limit,
        stop: &stop,
    };
    while !stop.is_cancelled() {
        // Not cut short by the stop (it is bounded): a lease taken meanwhile
        // is given back below rather than left to run out.
        match leadership.try_take().await {
            Ok(Some(leader)) => {
                warned = None;
                leading.lead(leader).await;
            }
            Ok(None) => {}
            Err(error) => {
                if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    warned = Some(Instant::now());
                    tracing::warn!(%error, "status feed: cannot ask for leadership");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(ask_every) => {}
            () = stop.cancelled() => {}
        }
    }
}

struct Leading<'a> {
    service: &'a StatusService,
    leadership: &'a Leadership,
    upstreams: &'a Upstreams,
    interval: Duration,
    limit: u32,
    stop: &'a CancellationToken,
}

impl Leading<'_> {
    /// Leads while the lease holds (see [`Leading::hold`]); on a stop, gives it back.
    async fn lead(&self, mut leader: Leader) {
        let stopped = self.hold(&mut leader).await;
        self.service.set_feed_leader(false);
        if stopped {
            leader.release(self.leadership).await;
        } else {
            tracing::warn!("status feed: no longer the leader");
        }
    }

    /// Polls every `interval` while the lease holds, renewing it before each poll
    /// and at least every [`Leadership::renew_every`]. True when it ended for the
    /// stop (the lease may still be ours), false when the lease was lost.
    async fn hold(&self, leader: &mut Leader) -> bool {
        let (service, leadership, upstreams) = (self.service, self.leadership, self.upstreams);
        let (interval, limit, stop) = (self.interval, self.limit, self.stop);
        if stop.is_cancelled() {
            return true;
        }
        tracing::info!(
            epoch = leader.fence().map(crate::store::Fence::epoch),
            "status feed: this replica is the leader"
        );
        service.set_feed_leader(true);
        let mut next_poll = Instant::now();
        loop {
            if Instant::now() >= next_poll {
                // No longer than the lease: past it, a renewal decides.
                let polling = poll(service, upstreams, limit, leader, stop);
                let polled = match leader.valid_until() {
                    Some(until) => tokio::time::timeout_at(until, polling)
                        .await
                        .unwrap_or(Polled::Expired),
                    None => polling.await,
                };
                next_poll = match polled {
                    Polled::LeaseLost => return false,
                    Polled::Stopped => return true,
                    // A catch-up longer than the lease goes on once renewed.
                    Polled::Expired => Instant::now(),
                    Polled::Done => Instant::now() + interval,
                };
            }
            // Renewed at the latest when the lease would end, at once after a
            // poll that outlasted it.
            let renew_at = Instant::now() + leadership.renew_every();
            let wake = next_poll.min(renew_at);
            let wake = leader.valid_until().map_or(wake, |until| wake.min(until));
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = stop.cancelled() => return true,
            }
            // The gauge says what this replica can prove: past the lease by
            // its own clock, not the leader until a renewal says so again.
            if !leader.is_valid() {
                service.set_feed_leader(false);
            }
            if !leader.renew(leadership).await {
                return false;
            }
            service.set_feed_leader(true);
        }
    }
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
    /// The app is stopping: the page under way was stored (or refused), no other asked.
    Stopped,
}

/// Reads pages from the stored cursor until caught up, while the lease is ours.
async fn poll(
    service: &StatusService,
    upstreams: &Upstreams,
    limit: u32,
    leader: &Leader,
    stop: &CancellationToken,
) -> Polled {
    let mut cursor = match service.store().feed_cursor().await {
        Ok(cursor) => cursor,
        Err(error) => {
            tracing::warn!(%error, "status feed: cannot read the cursor");
            return Polled::Done;
        }
    };
    loop {
        if stop.is_cancelled() {
            return Polled::Stopped;
        }
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
