//! The bounds on one upstream's calls in flight: the whole upstream's
//! (`upstreams.<name>.max_in_flight`, adaptive unless
//! `upstreams.<name>.adaptive_limit = false`) and each seller's
//! (`upstreams.<name>.max_in_flight_per_seller`).
//!
//! # The adaptive bound
//!
//! An upstream that answers 429, or 503 with `Retry-After`, refuses load; that
//! answer is no verdict on the seller (the source is undecided, docs/rules.md)
//! and the gateway should have sent less. So the bound on calls in flight is a
//! limit that moves between `min_in_flight` and `max_in_flight`, and the
//! gateway's own refusal ([`UpstreamError::Saturated`](super::UpstreamError),
//! which reveals nothing either) comes before the upstream's:
//!
//! - It starts at `max_in_flight`: an upstream that never refuses load and
//!   never slows down sees exactly the fixed bound of old.
//! - A load refusal cuts it to 0.9 x the calls in flight at that moment (not
//!   0.9 x the limit: a limit of 4096 with 40 calls in flight says nothing of
//!   what the upstream takes, so the first cut lands near its capacity).
//! - So does a latency climb: each answer's latency feeds two moving averages
//!   (about its last 8 calls, and about its last 256), and the short one above
//!   `latency_tolerance` x the long one cuts as a refusal does. A timeout
//!   teaches nothing (its latency is unknown). When latency falls back, the long
//!   average follows it down faster (Gradient2's decay), so a past slow spell
//!   does not hide the next one.
//! - At most one cut per round trip: a signal from a call that started before
//!   the last cut says nothing about the limit set since (TCP's once per
//!   window), so a burst of refusals of calls sent together cuts once.
//! - Every other answer grows it, when the calls in flight were at least half
//!   the limit as it started (an idle upstream's limit does not creep up to
//!   mean nothing): by 1/limit, about one place per round trip (additive
//!   increase), and by one place per answer (doubling per round trip) once a
//!   second has passed without a cut, so a capacity that went up is found in
//!   a few round trips rather than one place at a time.
//! - A call that ends any other way (a connection or a protocol failure, a
//!   non-refusing error status, its task cancelled) teaches nothing: the
//!   breaker deals with failures, and a cancelled call's latency is unknown.
//!
//! That is AIMD (Netflix concurrency-limits' `AIMDLimit`, TCP's window) on
//! load refusals with a Gradient2-like short/long latency ratio as the second
//! signal, made a cut rather than a gradual gradient so one rule serves both.
//! Netflix's `Gradient2Limit` and Envoy's adaptive concurrency filter (which
//! measures a minimum RTT in periodic windows at a pinned low limit) both need
//! latency to be the signal; an upstream here says "too much" with a status,
//! so refusals lead, and Envoy's pinned measurement windows would refuse
//! calls on a schedule for nothing. The crate `congestion-limiter` (0.1.0,
//! its only release) has AIMD and Gradient, but its release of a token is an
//! `async fn` behind a `tokio::sync::Mutex` (a [`Slot`] here reports on drop,
//! synchronously, wherever a call ends) and it brings `async-trait` and the
//! unmaintained `conv`; this is a small module of our own with its tests.
//!
//! Its cost is on the cold path only (a call about to go out): taking a place
//! is one atomic add and one load, as for the fixed bound, and a call's end
//! takes one uncontended `std::sync::Mutex` for a few float operations. The hit
//! path never makes a call and never touches it. The limit now is the gauge
//! `phones_gateway_upstream_limit{upstream}`.
//!
//! # The bound per seller
//!
//! Why a bound per seller: the upstream's own bound is shared by every seller,
//! and one caller can fill it alone. A batch of items for one seller, each with
//! another `phone`, makes one call-tracking call per item (each phone is a key of
//! its own, nothing coalesces), and a slow upstream keeps them all in flight; every
//! other seller's call is then refused. A refusal no longer reveals a lower source
//! (the source is undecided, docs/rules.md), but it still refuses other sellers
//! because of one caller. With a bound per seller, one seller holds at most its
//! share of the upstream's places and the rest stay for the others. It applies to
//! the three upstreams alike: the same flood with random ad ids instead of phones
//! fills the real-phone and anonymous bounds the same way.
//!
//! Its default (0) is sized to need, per upstream (`config::seller_need`): 16
//! calls at once to the real phone and the anonymous upstreams, 8 to call
//! tracking, at most an eighth of the upstream's bound (at least one call), so
//! that eight sellers at once are still needed to fill a small bound. A seller's
//! calls in flight are its distinct cold keys (calls for one key coalesce, a key
//! answered stays cached): measured on the recorded stream
//! (`benches/load/seller_need.py`, docs/adaptive-limit.md), no seller, the
//! sale's included, ever needed more than 3 of the real phone, 2 of the
//! anonymous and 1 of call tracking at once, at 100,000 requests/s and 300 ms a
//! call. The defaults leave five times that and more (a seller's page of ads
//! fetched together) and never bind on that stream, while a flood of 100 random
//! phones or ads for one seller is held to 8 or 16 calls. The former default,
//! an eighth of the bound alone, left one seller 512 calls at once under the
//! default bound (4096).
//!
//! The seller's count is exact (a sharded map of sellers with calls in flight,
//! dashmap over foldhash), not a hashed table of counters, where a seller hashed
//! beside a flooding one would share its bound. It is taken on the cold path only
//! (a call about to be made), once per call and once more when the call ends, and
//! a seller's entry is removed when its last call ends, so the map holds only
//! sellers with calls in flight. Both places are guards released on drop, so a
//! call that ends any way (answered, timed out, its task cancelled or panicking)
//! gives them back.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::time::Instant;

use crate::domain::UserId;

/// The multiplicative cut, of the calls in flight at a load refusal.
const CUT: f64 = 0.9;
/// Weight of a new latency in the short average (about its last 8 calls).
const SHORT: f64 = 1.0 / 8.0;
/// Weight of a new latency in the long average (about its last 256 calls).
const LONG: f64 = 1.0 / 256.0;
/// With no cut for this long, the limit grows one place per answer.
const PROBE_AFTER: Duration = Duration::from_secs(1);

/// How the adaptive bound is tuned (`upstreams.<name>`'s keys).
#[derive(Debug, Clone, Copy)]
pub(super) struct Adapt {
    /// The floor (`min_in_flight`).
    pub(super) min: usize,
    /// The short latency average over the long one that counts as a climb
    /// (`latency_tolerance`).
    pub(super) tolerance: f64,
    /// The least short average that counts as a climb at all: a third of the
    /// call's timeout ([`Adapt::climb_floor`]).
    pub(super) climb_floor: Duration,
}

impl Adapt {
    /// A third of the call's `timeout`: below it a latency "climb" may be the
    /// gateway's own queueing, not the upstream slowing down. Measured with
    /// the simulator at 0 ms (`benches/load/harness.py --cold`, a saturating
    /// closed loop of new sellers, other builds on the two cores): calls that
    /// take 0.1 ms idle took from a few to tens of milliseconds while the
    /// gateway's own cores were busy. Without a floor the real-phone limit
    /// fell to 7 and four requests in five were refused as undecided; with a
    /// tenth of the timeout (30 ms), one in eight still was.
    pub(super) fn climb_floor(timeout: Duration) -> Duration {
        timeout / 3
    }
}

/// Calls in flight to one upstream, and the most allowed at once: fixed, or
/// adaptive between a floor and `max`.
pub(super) struct Bound {
    in_flight: AtomicUsize,
    /// The most allowed now (the adaptive limit rounded down).
    limit: AtomicUsize,
    adaptive: Option<Mutex<Limit>>,
    gauge: metrics::Gauge,
}

/// What a call's end teaches the adaptive limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// An answer (any status but a load refusal, even one that does not
    /// parse): its latency is the call's.
    Answered,
    /// The upstream refused load (429, or 503 with `Retry-After`), or the
    /// back-off judged a failure load: a cut.
    LoadRefused,
    /// Nothing to learn: a timeout, a connection failure, or no call made (an
    /// open breaker).
    Unknown,
}

/// The adaptive limit's state.
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

/// What one call's end was, as the limit reads it.
#[derive(Debug, Clone, Copy)]
enum Signal {
    Refused,
    Latency(Duration),
}

impl Limit {
    /// Learns from a call that started at `started` with `before` calls in
    /// flight (itself included), ending at `now` with `in_flight` in flight
    /// (itself included); returns the new limit.
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
    /// A bound of `max` calls, adaptive between `adapt.min` and `max` when
    /// `adapt` is given; `gauge` shows the limit now.
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

    /// A place among the calls in flight, or `None` when all are taken.
    pub(super) fn slot(&self) -> Option<Slot<'_>> {
        // Taken before it is checked, so two calls racing for the last place
        // cannot both have it; the loser gives it back.
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= self.limit.load(Ordering::Acquire) {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot {
            bound: self,
            started: Instant::now(),
            before: before + 1,
        })
    }

    /// The most calls allowed in flight now.
    pub(super) fn limit(&self) -> usize {
        self.limit.load(Ordering::Acquire)
    }

    /// [`Bound::learn_at`] now.
    #[cfg(test)]
    fn learn(&self, signal: Signal, slot: &Slot<'_>) {
        self.learn_at(signal, slot, Instant::now());
    }

    /// What the adaptive limit learns from one call's end, at `now`.
    fn learn_at(&self, signal: Signal, slot: &Slot<'_>, now: Instant) {
        let Some(adaptive) = &self.adaptive else {
            return;
        };
        let in_flight = self.in_flight.load(Ordering::Acquire);
        let mut limit = adaptive.lock().unwrap_or_else(PoisonError::into_inner);
        let new = limit.learn(signal, slot.started, slot.before, in_flight, now);
        // At least 1 (the floor is), so the upstream is never shut out. The
        // gauge is set only when the limit moves.
        if self.limit.swap(new as usize, Ordering::AcqRel) != new as usize {
            self.gauge.set(new.floor());
        }
    }
}

/// A call in flight; dropping it (answered, timed out or cancelled) frees its
/// place. [`Slot::finish`] first tells the adaptive limit how the call ended.
pub(super) struct Slot<'a> {
    bound: &'a Bound,
    started: Instant,
    /// Calls in flight when it was taken, itself included.
    before: usize,
}

impl Slot<'_> {
    /// The call ended as `end`; frees the place.
    pub(super) fn finish(self, end: End) {
        // A fixed bound learns nothing: no clock read. An adaptive one reads
        // the clock once, for the latency and for its own timing (a read is
        // about a hundred instructions of a call end's 420, callgrind).
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

/// Calls in flight to one upstream per seller, and the most one seller may have.
pub(super) struct PerSeller {
    /// Sellers with calls in flight and how many; a seller without is absent.
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

    /// A place among `user`'s calls in flight, or `None` when all are taken.
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

    /// Sellers with calls in flight (tests).
    #[cfg(test)]
    fn sellers(&self) -> usize {
        self.in_flight.len()
    }
}

/// One of a seller's calls in flight; dropping it frees its place, and the
/// seller's entry with its last one.
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
