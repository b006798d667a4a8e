//! The status-feed puller (SPEC 7): one replica at a time polls the call-tracking
//! feed and stores what it gets through the same write path as the webhook, with
//! the feed cursor in the same transaction as the changes it brought.
//!
//! Leadership with PostgreSQL is `pg_try_advisory_lock` held on a dedicated
//! connection outside the pool: a pooled connection can be recycled silently,
//! which would hand the lock to nobody (or to two leaders). The leader checks its
//! connection before every poll; if it is gone, so is the lock, and it stops
//! polling until it wins the lock again. With SQLite the one replica leads.

use std::time::Duration;

use sqlx::{Connection, PgConnection};

use super::StatusService;
use crate::ids::UserId;
use crate::status::MAX_VERSION;
use crate::store::Store;
use crate::upstream::{StatusItem, Upstreams};

/// Runs until the task is aborted.
pub async fn run(
    service: StatusService,
    upstreams: std::sync::Arc<Upstreams>,
    interval: Duration,
    limit: u32,
) {
    match service.store().clone() {
        Store::Sqlite(_) => {
            service.set_feed_leader(true);
            loop {
                poll(&service, &upstreams, limit).await;
                tokio::time::sleep(interval).await;
            }
        }
        Store::Postgres(pool) => loop {
            let options = pool.connect_options().as_ref().clone();
            match PgConnection::connect_with(&options).await {
                Ok(mut connection) => {
                    lead_while_locked(&service, &upstreams, &mut connection, interval, limit).await;
                }
                Err(error) => tracing::warn!(%error, "status feed: cannot connect for leadership"),
            }
            service.set_feed_leader(false);
            tokio::time::sleep(interval).await;
        },
    }
}

/// Tries for the lock every interval; while held, polls. Returns when the
/// connection fails (the lock went with it).
async fn lead_while_locked(
    service: &StatusService,
    upstreams: &Upstreams,
    connection: &mut PgConnection,
    interval: Duration,
    limit: u32,
) {
    loop {
        let locked: Result<bool, _> = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(crate::store::FEED_LOCK)
            .fetch_one(&mut *connection)
            .await;
        match locked {
            Ok(true) => break,
            Ok(false) => tokio::time::sleep(interval).await,
            Err(error) => {
                tracing::warn!(%error, "status feed: leadership connection lost");
                return;
            }
        }
    }
    tracing::info!("status feed: this replica is the leader");
    service.set_feed_leader(true);
    loop {
        poll(service, upstreams, limit).await;
        tokio::time::sleep(interval).await;
        if let Err(error) = connection.ping().await {
            tracing::warn!(%error, "status feed: leadership connection lost; no longer leader");
            service.set_feed_leader(false);
            return;
        }
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
        let valid: Vec<StatusItem> = page
            .items
            .iter()
            .copied()
            .filter(|i| UserId::new(i.user_id).is_ok() && (1..=MAX_VERSION).contains(&i.version))
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
