//! The status-feed puller (docs/status-sync.md): one replica at a time polls the call-tracking
//! feed and stores what it gets through the same write path as the webhook, with
//! the feed cursor in the same transaction as the changes it brought.
//!
//! Which replica leads is the store's business ([`crate::store::Leadership`],
//! handed in by `app`): this loop asks for leadership every interval, and while
//! it holds it, polls, checking before each poll that it still does.

use std::time::Duration;

use super::StatusService;
use crate::domain::StatusChange;
use crate::store::Leadership;
use crate::upstream::Upstreams;

/// Runs until its task is cancelled.
pub async fn run(
    service: StatusService,
    leadership: Leadership,
    upstreams: std::sync::Arc<Upstreams>,
    interval: Duration,
    limit: u32,
) {
    loop {
        match leadership.try_take().await {
            Ok(Some(mut leader)) => {
                tracing::info!("status feed: this replica is the leader");
                service.set_feed_leader(true);
                loop {
                    poll(&service, &upstreams, limit).await;
                    tokio::time::sleep(interval).await;
                    if !leader.still_held().await {
                        break;
                    }
                }
                tracing::warn!("status feed: no longer the leader");
                service.set_feed_leader(false);
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "status feed: cannot ask for leadership"),
        }
        tokio::time::sleep(interval).await;
    }
}

/// Reads pages from the stored cursor until the feed is caught up.
async fn poll(service: &StatusService, upstreams: &Upstreams, limit: u32) {
    let mut cursor = match service.store().feed_cursor().await {
        Ok(cursor) => cursor,
        Err(error) => {
            tracing::warn!(%error, "status feed: cannot read the cursor");
            return;
        }
    };
    loop {
        let page = match upstreams.status_page(cursor.as_deref(), limit).await {
            Ok(page) => page,
            Err(error) => {
                tracing::warn!(%error, "status feed: poll failed");
                return;
            }
        };
        if page.items.is_empty() {
            return;
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
        match service.apply_changes(&valid, next.as_deref()).await {
            Ok(applied) => tracing::debug!(
                applied = applied.applied,
                ignored = applied.ignored,
                "status feed page stored"
            ),
            Err(error) => {
                tracing::warn!(%error, "status feed: page not stored; will retry from the same cursor");
                return;
            }
        }
        if next == cursor {
            return;
        }
        cursor = next;
    }
}
