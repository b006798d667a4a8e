//! The call-tracking status set: in-memory reads ([`StatusSet`]), the write path
//! and catch-up ([`StatusService`]), and the [`sync`] and [`feed`] loops. How
//! replicas converge and what bounds each call: docs/status-sync.md.

pub mod feed;
mod listed;
mod set;
pub mod sync;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use listed::Listed;
pub use set::StatusSet;

use crate::cache::caches::Caches;
use crate::domain::{Applied, StatusChange, UserId, wall_clock};
use crate::store::{
    CHANGES_PAGE, Change, FLOOR_USER, Fence, SnapshotLoad, StatusStore, StatusStoreError,
    StoreError, Watermark,
};
use crate::telemetry::write_gauge;

/// Rows applied between two yields of a catch-up: a snapshot that changes
/// 100,000 sellers does not hold a worker thread for the whole page.
const ROWS_PER_YIELD: usize = 1024;

/// Owns the status set's consistency with the store: writes go to the store
/// first and are acknowledged after commit; memory learns every change through
/// [`StatusService::catch_up`], in change order. A local delta catches up
/// before it answers, so the writer reads its own write; a local snapshot is
/// applied from its ids ([`StatusService::finish_snapshot`]).
#[derive(Clone)]
pub struct StatusService {
    inner: Arc<Inner>,
}

struct Inner {
    set: Arc<StatusSet>,
    store: StatusStore,
    /// The replica's number caches, which forget what the change log says (a
    /// flip of call tracking drops the seller's call-tracking numbers: a released
    /// forwarding number may be another seller's now); `None` in tools and benches.
    caches: Option<Caches>,
    /// One local writer at a time: SQLite has one writer anyway, and PostgreSQL
    /// writers queue on the advisory lock; queueing here spares a connection.
    writer: tokio::sync::Mutex<()>,
    /// The change-log position applied to memory; the mutex runs catch-ups (and
    /// a local snapshot's apply) one at a time so rows apply in order.
    watermark: tokio::sync::Mutex<Watermark>,
    /// Unix time (ms) of the last successful catch-up, for the sync-lag gauge.
    last_sync_ms: AtomicI64,
    feed_leader: AtomicBool,
}

impl StatusService {
    /// A service with no caches to tell of invalidations and flips.
    pub fn new(store: StatusStore) -> Self {
        StatusService::build(store, Arc::default(), None)
    }

    /// A service that writes `set` (the one the resolver reads) and makes
    /// `caches` forget what the change log says to.
    pub fn with_caches(store: StatusStore, set: Arc<StatusSet>, caches: Caches) -> Self {
        StatusService::build(store, set, Some(caches))
    }

    fn build(store: StatusStore, set: Arc<StatusSet>, caches: Option<Caches>) -> Self {
        StatusService {
            inner: Arc::new(Inner {
                set,
                store,
                caches,
                writer: tokio::sync::Mutex::new(()),
                watermark: tokio::sync::Mutex::new((0, 0)),
                // Counted from creation until the first catch-up, so a replica
                // that cannot reach its database at start shows a growing lag.
                last_sync_ms: AtomicI64::new(unix_ms()),
                feed_leader: AtomicBool::new(false),
            }),
        }
    }

    pub fn set(&self) -> &Arc<StatusSet> {
        &self.inner.set
    }

    /// The status store (tests read the feed cursor through it).
    pub fn store(&self) -> &StatusStore {
        &self.inner.store
    }

    /// Whether the first catch-up (the load) finished; `/readyz` and requests wait for it.
    pub fn is_loaded(&self) -> bool {
        self.inner.set.is_loaded()
    }

    pub fn is_feed_leader(&self) -> bool {
        self.inner.feed_leader.load(Ordering::Acquire)
    }

    fn set_feed_leader(&self, leader: bool) {
        self.inner.feed_leader.store(leader, Ordering::Release);
        metrics::gauge!("phones_gateway_status_feed_leader").set(f64::from(u8::from(leader)));
    }

    /// Appends the status set's gauges to its app's `/metrics` text.
    pub fn render_gauges(&self, out: &mut String) {
        let set = self.set();
        let lag = self.sync_lag_ms() as f64 / 1000.0;
        for (name, value) in [
            ("phones_gateway_status_set_users", set.len() as f64),
            (
                "phones_gateway_status_set_enabled",
                set.enabled_count() as f64,
            ),
            ("phones_gateway_status_sync_lag_seconds", lag),
        ] {
            write_gauge(out, name, [(&[][..], value)]);
        }
    }

    /// Milliseconds since the last successful catch-up (or since creation, before one).
    pub fn sync_lag_ms(&self) -> i64 {
        (unix_ms() - self.inner.last_sync_ms.load(Ordering::Acquire)).max(0)
    }

    /// Loads the whole set (a catch-up from the start), then marks it loaded.
    pub async fn load(&self) -> Result<usize, StatusStoreError> {
        // Each page within a small call's bound, not a read's: a start whose
        // connection was lost silently then retries soon enough to be ready
        // within 10 s of the database answering (docs/status-sync.md).
        let count = self
            .catch_up_paged(Some(self.inner.store.short_bound()))
            .await?;
        self.inner.set.mark_loaded();
        Ok(count)
    }

    /// Applies every change after the watermark to memory; returns how many users
    /// it set. A status whose call tracking flipped drops the seller's call-tracking
    /// numbers first, then is set (no request sees it on with an old number cached).
    pub async fn catch_up(&self) -> Result<usize, StatusStoreError> {
        self.catch_up_paged(None).await
    }

    /// [`StatusService::catch_up`], each page also within `page_bound`.
    async fn catch_up_paged(
        &self,
        page_bound: Option<Duration>,
    ) -> Result<usize, StatusStoreError> {
        let mut watermark = self.inner.watermark.lock().await;
        self.catch_up_locked(&mut watermark, page_bound).await
    }

    /// Applies the change log after `watermark`, in change order. The
    /// watermark follows every row applied, before each yield: a catch-up
    /// given up (its caller's bound ran out) resumes at the row after the
    /// last it applied, not at the start of its page.
    async fn catch_up_locked(
        &self,
        watermark: &mut Watermark,
        page_bound: Option<Duration>,
    ) -> Result<usize, StatusStoreError> {
        let seen = watermark.0;
        let caches = self.inner.caches.as_ref();
        let mut total = 0;
        'pages: loop {
            let page = self.inner.store.changes_after(*watermark, CHANGES_PAGE);
            let rows = match page_bound {
                None => page.await?,
                Some(bound) => tokio::time::timeout(bound, page).await.map_err(|_| {
                    StatusStoreError::from(StoreError::TimedOut {
                        operation: "load_page",
                        bound,
                    })
                })??,
            };
            for chunk in rows.chunks(ROWS_PER_YIELD) {
                for row in chunk {
                    if let Change::Status { status, .. } = row.change
                        && row.user_id == FLOOR_USER
                        && row.seq > watermark.0
                    {
                        // The first row of a snapshot's change (the floor is
                        // user 0): applied from its listing if it left one.
                        // One that cannot be read is read as rows.
                        let bound = page_bound.unwrap_or(Duration::MAX);
                        let listing = self.inner.store.snapshot_listing(row.seq);
                        let listing = match tokio::time::timeout(bound, listing).await {
                            Ok(Ok(listing)) => listing,
                            Ok(Err(error)) => {
                                tracing::warn!(%error, "a snapshot's listing cannot be read; reading its rows");
                                None
                            }
                            Err(_) => {
                                tracing::warn!(
                                    ?bound,
                                    "a snapshot's listing was not read in time; reading its rows"
                                );
                                None
                            }
                        };
                        if let Some(set) = self.apply_listing(listing, status.version).await {
                            total += set;
                            *watermark = (row.seq, i64::MAX);
                            metrics::gauge!("phones_gateway_status_last_change_seq")
                                .set(row.seq as f64);
                            continue 'pages;
                        }
                    }
                    let user = UserId::new(row.user_id);
                    match row.change {
                        Change::Status { status, .. } if row.user_id == FLOOR_USER => {
                            self.inner.set.put_floor(status.version);
                        }
                        Change::Status { status, flip_seq } => {
                            let flipped = flip_seq > seen;
                            if let (Some(caches), Ok(user), true) = (caches, user, flipped) {
                                caches.invalidate_calltracking(user);
                            }
                            self.inner.set.put(row.user_id, status);
                            total += 1;
                        }
                        Change::Invalidated => {
                            if let (Some(caches), Ok(user)) = (caches, user) {
                                caches.invalidate(user);
                            }
                        }
                    }
                    *watermark = (row.seq, i64::try_from(row.user_id).unwrap_or(i64::MAX));
                }
                metrics::gauge!("phones_gateway_status_last_change_seq").set(watermark.0 as f64);
                tokio::task::yield_now().await;
            }
            if (rows.len() as i64) < CHANGES_PAGE {
                break;
            }
        }
        metrics::gauge!("phones_gateway_status_last_change_seq").set(watermark.0 as f64);
        self.inner.last_sync_ms.store(unix_ms(), Ordering::Release);
        Ok(total)
    }

    /// Applies a snapshot another replica stored, at `version`, from the
    /// `listing` it left (docs/status-sync.md, "The snapshot and its floor");
    /// how many users it set. `None` when there is no listing, or one that
    /// does not decode or is of another version: the caller reads the rows.
    async fn apply_listing(&self, listing: Option<(u64, Vec<u8>)>, version: u64) -> Option<usize> {
        let (stored_version, bytes) = listing?;
        if stored_version != version {
            return None;
        }
        let decoded = tokio::task::spawn_blocking(move || Listed::decode(&bytes)).await;
        let Ok(Some(listed)) = decoded else {
            tracing::warn!("a snapshot's listing does not decode; reading its rows");
            return None;
        };
        let caches = self.inner.caches.as_ref();
        Some(
            self.inner
                .set
                .apply_snapshot(&listed, version, |user| {
                    if let (Some(caches), Ok(user)) = (caches, UserId::new(user)) {
                        caches.invalidate_calltracking(user);
                    }
                })
                .await,
        )
    }

    /// Drops every cached number of `users` here at once, then records the
    /// invalidation for every other replica; a fetch of them under way is not
    /// written back. If recording fails, the others keep theirs: retry.
    pub async fn invalidate(&self, users: &[UserId]) -> Result<(), StatusStoreError> {
        let caches = self.inner.caches.as_ref();
        if let Some(caches) = caches {
            users.iter().for_each(|user| caches.invalidate(*user));
        }
        // The longest an entry fetched now may still be served (TTL plus
        // `max_stale`): an invalidation older than that can drop nothing.
        let longest_use = caches.map_or(Duration::ZERO, Caches::longest_use);
        let deadline = self.short_deadline();
        {
            let _writer = self.writer_until(deadline).await?;
            self.inner
                .store
                .record_invalidations(users, longest_use, deadline)
                .await?;
        }
        self.catch_up_after_write().await;
        Ok(())
    }

    /// When a small write (a delta, an invalidation), its wait for the
    /// writers' turn included, is given up ([`crate::store::Bounds::short`]).
    fn short_deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.inner.store.short_bound()
    }

    /// The local writers' turn for a small write, waited for until `deadline`.
    async fn writer_until(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, StatusStoreError> {
        tokio::time::timeout_at(deadline, self.inner.writer.lock())
            .await
            .map_err(|_| {
                StatusStoreError::from(StoreError::TimedOut {
                    operation: "waiting for the writers' turn",
                    bound: self.inner.store.short_bound(),
                })
            })
    }

    /// The local writers' turn, waited for at most one database call's bound:
    /// whoever holds it is itself bounded, so a queue behind a stuck database
    /// answers 503 rather than piling up.
    async fn writer(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, StatusStoreError> {
        let bound = self.inner.store.call_bound();
        tokio::time::timeout(bound, self.inner.writer.lock())
            .await
            .map_err(|_| {
                StatusStoreError::from(StoreError::TimedOut {
                    operation: "waiting for the writers' turn",
                    bound,
                })
            })
    }

    /// Applies a delta delivery (webhook, or a feed page with its cursor and
    /// the lease it was read under: see [`crate::store::Fence`]) within a
    /// small write's deadline, all or nothing.
    pub async fn apply_changes(
        &self,
        changes: &[StatusChange],
        feed: Option<(&str, Option<&Fence>)>,
    ) -> Result<Applied, StatusStoreError> {
        let deadline = self.short_deadline();
        let counts = {
            let _writer = self.writer_until(deadline).await?;
            self.inner
                .store
                .apply_changes(changes, feed, deadline)
                .await?
        };
        self.catch_up_after_write().await;
        Ok(counts)
    }

    /// Starts a full snapshot (see [`SnapshotLoad`]); finish it with
    /// [`StatusService::finish_snapshot`].
    pub async fn begin_snapshot(&self) -> Result<SnapshotLoad, StatusStoreError> {
        self.inner.store.begin_snapshot().await
    }

    /// Applies a loaded snapshot at `version` (`enabled`: the ids as the request
    /// parsed them) in the store and in memory before returning, in the writers'
    /// turn (docs/status-sync.md, "The snapshot and its floor"). The watermark is
    /// held throughout, so no catch-up runs in between; on error nothing applied.
    pub async fn finish_snapshot(
        &self,
        load: SnapshotLoad,
        version: u64,
        enabled: Vec<Vec<u64>>,
    ) -> Result<(), StatusStoreError> {
        // Built on the blocking pool while the store indexes the ids, with
        // its encoding where the store keeps one for the other replicas.
        let encode = self.inner.store.keeps_listings();
        let listing = tokio::task::spawn_blocking(move || {
            let listed = Listed::new(enabled);
            let encoded = encode.then(|| listed.encode());
            (listed, encoded)
        });
        let _writer = self.writer().await?;
        let prepared = load.prepare(version).await?;
        let (deadline, bound) = (prepared.deadline(), prepared.bound());
        let timed_out =
            |operation| StatusStoreError::from(StoreError::TimedOut { operation, bound });
        let mut watermark = tokio::time::timeout_at(deadline, self.inner.watermark.lock())
            .await
            .map_err(|_| timed_out("waiting for the change log"))?;
        tokio::time::timeout_at(deadline, self.catch_up_locked(&mut watermark, None))
            .await
            .map_err(|_| timed_out("catching up before a snapshot"))??;
        let listing = listing.await;
        let encoded = listing.as_ref().ok().and_then(|(_, e)| e.as_deref());
        let seq = prepared.seq();
        if !prepared.finish(encoded).await? {
            // It changed no row: memory, caught up, holds the stored state.
            return Ok(());
        }
        let listed = match listing {
            Ok((listed, _)) => listed,
            Err(error) => {
                // Only a panic (a bug) or a runtime shutting down: memory reads the
                // snapshot back through the change log before the answer.
                tracing::error!(%error, "a snapshot's listing failed; reading it back");
                if let Err(error) = self.catch_up_locked(&mut watermark, None).await {
                    tracing::warn!(%error, "reading a snapshot back failed; the sync loop will retry");
                }
                return Ok(());
            }
        };
        let caches = self.inner.caches.as_ref();
        let set = self
            .inner
            .set
            .apply_snapshot(&listed, version, |user| {
                if let (Some(caches), Ok(user)) = (caches, UserId::new(user)) {
                    caches.invalidate_calltracking(user);
                }
            })
            .await;
        *watermark = (seq, i64::MAX);
        metrics::gauge!("phones_gateway_status_last_change_seq").set(seq as f64);
        self.inner.last_sync_ms.store(unix_ms(), Ordering::Release);
        tracing::debug!(set, listed = listed.len(), "a snapshot applied to memory");
        Ok(())
    }

    /// A whole snapshot from ids in memory (benches, tools).
    pub async fn apply_snapshot(
        &self,
        version: u64,
        enabled: &[u64],
    ) -> Result<(), StatusStoreError> {
        let mut load = self.begin_snapshot().await?;
        let chunks: Vec<Vec<u64>> = enabled.chunks(100_000).map(<[u64]>::to_vec).collect();
        for chunk in &chunks {
            load.push(chunk).await?;
        }
        self.finish_snapshot(load, version, chunks).await
    }

    /// The change is durable; if memory cannot follow right now (within a
    /// small call's bound: the answer waits for it), the sync loop will.
    async fn catch_up_after_write(&self) {
        let bound = self.inner.store.short_bound();
        match tokio::time::timeout(bound, self.catch_up()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "catch-up after a write failed; the sync loop will retry");
            }
            Err(_) => tracing::warn!(
                ?bound,
                "catch-up after a write did not finish in time; the sync loop will retry"
            ),
        }
    }
}

/// The wall clock in milliseconds, as `last_sync_ms` holds it.
fn unix_ms() -> i64 {
    i64::try_from(wall_clock::since_epoch().as_millis()).unwrap_or(i64::MAX)
}
