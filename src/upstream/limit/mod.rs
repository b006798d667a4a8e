//! The bounds on one upstream's calls in flight: the whole upstream's
//! (`upstreams.<name>.max_in_flight`, adaptive unless
//! `upstreams.<name>.adaptive_limit = false`) and each seller's
//! (`upstreams.<name>.max_in_flight_per_seller`); see docs/adaptive-limit.md.
//! The seller's count is exact, so no seller shares a flooding one's bound.
//! Both places are guards released on drop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::time::Instant;

use crate::domain::UserId;

const CUT: f64 = 0.9;
/// The share of the limit that items of batches may hold, as a fraction.
const BATCH_SHARE: (usize, usize) = (3, 4);
/// Weight of a new latency in the short average (about its last 8 calls).
const SHORT: f64 = 1.0 / 8.0;
/// Weight of a new latency in the long average (about its last 256 calls).
const LONG: f64 = 1.0 / 256.0;
/// With no cut for this long, the limit grows one place per answer.
const PROBE_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
pub(super) struct Adapt {
    pub(super) min: usize,
    /// `latency_tolerance`.
    pub(super) tolerance: f64,
    /// The least short average that counts as a climb at all.
    pub(super) climb_floor: Duration,
}

impl Adapt {
    /// A third of the call's `timeout`: below it a latency "climb" may be the
    /// gateway's own queueing, not the upstream slowing down.
    pub(super) fn climb_floor(timeout: Duration) -> Duration {
        timeout / 3
    }
}

pub(super) struct Bound {
    in_flight: AtomicUsize,
    /// The most allowed now (the adaptive limit rounded down).
    limit: AtomicUsize,
    adaptive: Option<Mutex<Limit>>,
    gauge: metrics::Gauge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// An answer (any status but a load refusal): its latency is the call's.
    Answered,
    /// A load refusal, or a failure the back-off judged load: a cut.
    LoadRefused,
    /// Nothing to learn.
    Unknown,
}

struct Limit {
    min: f64,
    max: f64,
    tolerance: f64,
    /// [`Adapt::climb_floor`], in seconds.
    climb_floor: f64,
    limit: f64,
    /// Latency averages in seconds; `None` until the first answer.
    short: Option<f64>,
    long: Option<f64>,
    last_cut: Instant,
}

#[derive(Debug, Clone, Copy)]
enum Signal {
    Refused,
    Latency(Duration),
}

impl Limit {
    /// Learns from a call that started at `started` with `before` calls in
    /// flight and ends at `now` with `in_flight` (each itself included).
    fn learn(
        &mut self,
        signal: Signal,
        started: Instant,
        before: usize,
        in_flight: usize,
        now: Instant,
    ) -> f64 {
        match signal {
            Signal::Refused => self.cut(started, in_flight, now),
            Signal::Latency(latency) => {
                let latency = latency.as_secs_f64().max(1e-6);
                let short = self.short.map_or(latency, |s| s + SHORT * (latency - s));
                let mut long = self.long.map_or(latency, |l| l + LONG * (latency - l));
                if long > 2.0 * short {
                    // Latency fell back: the long average follows faster.
                    long = long * 0.95 + short * 0.05;
                }
                self.short = Some(short);
                self.long = Some(long);
                if short > self.tolerance * long && short > self.climb_floor {
                    self.cut(started, in_flight, now);
                } else if 2 * before >= self.limit as usize {
                    let step = if now.duration_since(self.last_cut) >= PROBE_AFTER {
                        1.0
                    } else {
                        1.0 / self.limit
                    };
                    self.limit = (self.limit + step).min(self.max);
                }
            }
        }
        self.limit
    }

    fn cut(&mut self, started: Instant, in_flight: usize, now: Instant) {
        if started < self.last_cut {
            return;
        }
        self.limit = (self.limit.min(in_flight as f64) * CUT).clamp(self.min, self.max);
        self.last_cut = now;
    }
}

impl Bound {
    pub(super) fn new(max: usize, adapt: Option<Adapt>, gauge: metrics::Gauge) -> Self {
        let max = max.max(1);
        gauge.set(max as f64);
        Bound {
            in_flight: AtomicUsize::new(0),
            limit: AtomicUsize::new(max),
            adaptive: adapt.map(|adapt| {
                let top = max as f64;
                Mutex::new(Limit {
                    min: (adapt.min.max(1) as f64).min(top),
                    max: top,
                    tolerance: adapt.tolerance,
                    climb_floor: adapt.climb_floor.as_secs_f64(),
                    limit: top,
                    short: None,
                    long: None,
                    last_cut: Instant::now(),
                })
            }),
            gauge,
        }
    }

    pub(super) fn slot(&self) -> Option<Slot<'_>> {
        self.take(self.limit.load(Ordering::Acquire))
    }

    /// A place for an item of a batch: none past [`BATCH_SHARE`] of the
    /// limit, so that batches leave room for single lookups.
    pub(super) fn batch_slot(&self) -> Option<Slot<'_>> {
        let limit = self.limit.load(Ordering::Acquire);
        self.take((limit * BATCH_SHARE.0 / BATCH_SHARE.1).max(1))
    }

    fn take(&self, limit: usize) -> Option<Slot<'_>> {
        // Taken before it is checked, so two calls racing for the last place
        // cannot both have it; the loser gives it back.
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= limit {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot {
            bound: self,
            started: Instant::now(),
            before: before + 1,
        })
    }

    pub(super) fn limit(&self) -> usize {
        self.limit.load(Ordering::Acquire)
    }

    #[cfg(test)]
    fn learn(&self, signal: Signal, slot: &Slot<'_>) {
        self.learn_at(signal, slot, Instant::now());
    }

    fn learn_at(&self, signal: Signal, slot: &Slot<'_>, now: Instant) {
        let Some(adaptive) = &self.adaptive else {
            return;
        };
        let in_flight = self.in_flight.load(Ordering::Acquire);
        let mut limit = adaptive.lock().unwrap_or_else(PoisonError::into_inner);
        let new = limit.learn(signal, slot.started, slot.before, in_flight, now);
        // At least 1 (the floor is), so the upstream is never shut out.
        if self.limit.swap(new as usize, Ordering::AcqRel) != new as usize {
            self.gauge.set(new.floor());
        }
    }
}

/// A call in flight; dropping it frees its place. [`Slot::finish`] first
/// tells the adaptive limit how the call ended.
pub(super) struct Slot<'a> {
    bound: &'a Bound,
    started: Instant,
    /// Calls in flight when it was taken, itself included.
    before: usize,
}

impl Slot<'_> {
    pub(super) fn finish(self, end: End) {
        // A fixed bound learns nothing: no clock read.
        if self.bound.adaptive.is_none() {
            return;
        }
        let now = Instant::now();
        let signal = match end {
            End::LoadRefused => Signal::Refused,
            End::Answered => Signal::Latency(now.duration_since(self.started)),
            End::Unknown => return,
        };
        self.bound.learn_at(signal, &self, now);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.bound.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(super) struct PerSeller {
    in_flight: DashMap<UserId, u32, foldhash::fast::RandomState>,
    max: u32,
}

impl PerSeller {
    pub(super) fn new(max: usize) -> Self {
        PerSeller {
            in_flight: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            max: u32::try_from(max).unwrap_or(u32::MAX).max(1),
        }
    }

    pub(super) fn slot(&self, user: UserId) -> Option<SellerSlot<'_>> {
        let mut count = self.in_flight.entry(user).or_insert(0);
        // `max` is at least 1, so a count just inserted at 0 is always taken
        // below: no entry at 0 is left behind.
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(SellerSlot { bound: self, user })
    }

    #[cfg(test)]
    fn sellers(&self) -> usize {
        self.in_flight.len()
    }
}

/// One of a seller's calls in flight; dropping it frees its place.
pub(super) struct SellerSlot<'a> {
    bound: &'a PerSeller,
    user: UserId,
}

impl Drop for SellerSlot<'_> {
    fn drop(&mut self) {
        if let Entry::Occupied(mut count) = self.bound.in_flight.entry(self.user) {
            if *count.get() <= 1 {
                count.remove();
            } else {
                *count.get_mut() -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
