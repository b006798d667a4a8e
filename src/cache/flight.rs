//! Coalescing: one fetch per key and generation ([`Flight`]), registered
//! until it ends however it ends ([`Registered`]).

use std::future::Future;
use std::sync::{Arc, OnceLock, PoisonError};

use foldhash::HashMap;
use tokio::sync::Notify;

use super::{CacheKey, FetchResult, Inner, PhoneCache, Via};
use crate::upstream::UpstreamError;

/// One fetch under way: its result once it has ended, and the callers waiting
/// for it (why not a shared task handle: docs/performance.md, "The cold path
/// against the Go design").
pub(super) struct Flight {
    result: OnceLock<FetchResult>,
    ended: Notify,
}

impl Flight {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Flight {
            result: OnceLock::new(),
            ended: Notify::new(),
        })
    }

    /// The fetch's result once it has ended, however it ended: the same for all.
    pub(super) async fn result(&self) -> FetchResult {
        loop {
            let ended = self.ended.notified();
            let mut ended = std::pin::pin!(ended);
            // Registered before the result is looked at, so an end between the
            // two still wakes this caller.
            ended.as_mut().enable();
            if let Some(result) = self.result.get() {
                return result.clone();
            }
            ended.await;
        }
    }

    fn end(&self, result: FetchResult) {
        // The first result stands: the answer, before the guard's fallback.
        let _ = self.result.set(result);
        self.ended.notify_waiters();
    }
}

impl PhoneCache {
    /// The fetch of `key` at `generation` under way, joined (`Coalesced`), or
    /// `fetch` started in a task of its own and registered (`Miss`).
    pub(super) fn join_or_start<F, Fut>(
        &self,
        key: CacheKey,
        generation: u32,
        fetch: F,
    ) -> (Arc<Flight>, Via)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = FetchResult> + Send + 'static,
    {
        let mut inflight = self.inner.lock_inflight();
        if let Some(flight) = inflight.get(&(key, generation)) {
            return (flight.clone(), Via::Coalesced);
        }
        let upstream_call = fetch();
        let flight = Flight::new();
        let registered = Registered {
            inner: Arc::clone(&self.inner),
            key: (key, generation),
            flight: flight.clone(),
        };
        // The task takes the inflight lock to remove itself, and we hold it until
        // the entry is inserted below, so it can never remove before we insert.
        // Detached: its callers wait on the flight, not on the task.
        drop(tokio::spawn(tracing::Instrument::in_current_span(
            async move {
                let result = upstream_call.await;
                if let Ok(phone) = &result {
                    registered.inner.store(key, generation, *phone);
                }
                registered.flight.end(result);
                drop(registered);
            },
        )));
        inflight.insert((key, generation), flight.clone());
        (flight, Via::Miss)
    }
}

/// A fetch's place in the in-flight registry, given up however the fetch ends
/// (else later requests for the key would join a dead fetch). Without an answer
/// its callers get [`UpstreamError::Panicked`] (unwinding) or
/// [`UpstreamError::Cancelled`]: undecided (docs/rules.md), reaching no breaker.
struct Registered {
    inner: Arc<Inner>,
    key: (CacheKey, u32),
    flight: Arc<Flight>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.inner.lock_inflight().remove(&self.key);
        let error = if std::thread::panicking() {
            UpstreamError::Panicked
        } else {
            UpstreamError::Cancelled
        };
        self.flight.end(Err(error));
    }
}

impl Inner {
    pub(super) fn lock_inflight(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(CacheKey, u32), Arc<Flight>>> {
        // The map stays consistent even if a holder panicked: every operation on it
        // is a single insert, get or remove.
        self.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
