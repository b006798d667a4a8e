//! A circuit breaker per upstream: after a run of failures, or a high failure
//! ratio within a window, the upstream is not called for `open_ms`; calls fail at
//! once with `UpstreamError::CircuitOpen`, which the rules treat as the
//! upstream's verdict (fail_closed / fall_through, stale-if-error). Then one
//! probe call is let through (half-open): success closes the circuit, failure
//! opens it again. A probe that never reports (its task was dropped, or its
//! outcome was undecided) is replaced after `open_ms`.
//!
//! It counts verdicts only (docs/rules.md, "Verdict or undecided"): an answer,
//! or the upstream's own failure. An undecided outcome (a load refusal, the
//! gateway's own socket trouble, a bound on calls in flight) is not recorded at
//! all, neither as a failure nor as a call: it says nothing of the upstream's
//! health, and counting it as a success would dilute a failure ratio with calls
//! never made. A 404 is an answer, not a failure.
//!
//! One seller cannot open it for everyone: besides the run or the ratio, the
//! failures of the window must be about at least `breaker.min_sellers` distinct
//! sellers. Otherwise one caller could make a seller's calls fail (the upstream
//! answers 500 for that seller alone) and open the breaker, turning every other
//! seller's call tracking into `CircuitOpen`, a verdict, so that they fall
//! through to their real numbers. The distinct sellers are kept in a small
//! fixed-size set per window (no allocation, at most [`MAX_MIN_SELLERS`] ids,
//! compared linearly: it is touched on failures only, under the lock the state
//! already takes). Once open on many sellers' verdicts, a failed probe opens it
//! again whoever it was about: the upstream was failing for many, and the probe
//! is one call. The status feed has no seller: its breaker is made with a
//! minimum of one (its poller is its only caller, and no lookup goes through
//! its breaker), so it opens on the run or the ratio alone.
//!
//! State changes are logged and exported as
//! `phones_gateway_circuit_open{upstream}` (1 while open or half-open).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::error::{Class, UpstreamError};
use crate::config::BreakerConfig;
use crate::domain::UserId;

/// The largest `breaker.min_sellers` (validated at start): the size of the set
/// of distinct failed sellers a window keeps.
pub(crate) const MAX_MIN_SELLERS: usize = 32;

/// The distinct sellers of a window's failures, up to `MAX_MIN_SELLERS`; 0
/// stands for "no seller" (the status feed; seller ids are positive).
#[derive(Debug)]
struct Sellers {
    ids: [u64; MAX_MIN_SELLERS],
    len: usize,
}

impl Sellers {
    const EMPTY: Sellers = Sellers {
        ids: [0; MAX_MIN_SELLERS],
        len: 0,
    };

    fn add(&mut self, id: u64) {
        let seen = &self.ids[..self.len];
        if self.len < MAX_MIN_SELLERS && !seen.contains(&id) {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Closed,
    Open { until: Instant },
    HalfOpen { probe_started: Instant },
}

#[derive(Debug)]
struct State {
    mode: Mode,
    consecutive_failures: u32,
    window_start: Instant,
    window_calls: u32,
    window_failures: u32,
    /// The distinct sellers the window's failures were about.
    failed_sellers: Sellers,
}

pub(crate) struct Breaker {
    name: &'static str,
    config: BreakerConfig,
    /// Distinct sellers a window's failures must span to open it.
    min_sellers: usize,
    state: Mutex<State>,
    open_gauge: metrics::Gauge,
}

impl Breaker {
    /// A breaker for upstream `name` that opens only when a window's failures
    /// were about `min_sellers` distinct sellers (clamped to 1..=`MAX_MIN_SELLERS`).
    pub(crate) fn new(name: &'static str, config: BreakerConfig, min_sellers: u32) -> Self {
        Breaker {
            name,
            config,
            min_sellers: usize::try_from(min_sellers)
                .unwrap_or(MAX_MIN_SELLERS)
                .clamp(1, MAX_MIN_SELLERS),
            state: Mutex::new(State {
                mode: Mode::Closed,
                consecutive_failures: 0,
                window_start: Instant::now(),
                window_calls: 0,
                window_failures: 0,
                failed_sellers: Sellers::EMPTY,
            }),
            open_gauge: metrics::gauge!("phones_gateway_circuit_open", "upstream" => name),
        }
    }

    fn open_for(&self) -> Duration {
        self.config.open
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the state valid; a panicked holder changes nothing.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a call may go out now.
    pub(crate) fn allow(&self) -> bool {
        if !self.config.enabled {
            return true;
        }
        let now = Instant::now();
        let mut state = self.lock();
        match state.mode {
            Mode::Closed => true,
            Mode::Open { until } if now >= until => {
                state.mode = Mode::HalfOpen { probe_started: now };
                true
            }
            Mode::Open { .. } => false,
            Mode::HalfOpen { probe_started } if now >= probe_started + self.open_for() => {
                state.mode = Mode::HalfOpen { probe_started: now };
                true
            }
            Mode::HalfOpen { .. } => false,
        }
    }

    /// Reports how an allowed call about `seller` ended: a verdict counts, an
    /// undecided outcome is not recorded (the module's doc says why).
    pub(crate) fn record<T>(&self, result: &Result<T, UpstreamError>, seller: Option<UserId>) {
        let success = match result {
            Ok(_) => true,
            Err(error) => match error.class() {
                Class::Verdict => false,
                Class::Undecided => return,
            },
        };
        self.count(success, seller.map_or(0, UserId::get));
    }

    /// Counts one verdict about the seller `id` (0: none).
    fn count(&self, success: bool, id: u64) {
        if !self.config.enabled {
            return;
        }
        let now = Instant::now();
        let mut state = self.lock();
        let window = self.config.window;
        if now >= state.window_start + window {
            state.window_start = now;
            state.window_calls = 0;
            state.window_failures = 0;
            state.failed_sellers = Sellers::EMPTY;
        }
        state.window_calls += 1;
        if success {
            state.consecutive_failures = 0;
        } else {
            state.consecutive_failures += 1;
            state.window_failures += 1;
            state.failed_sellers.add(id);
        }
        let many_sellers = state.failed_sellers.len >= self.min_sellers;
        let trip = match state.mode {
            Mode::HalfOpen { .. } => !success,
            Mode::Closed => {
                !success
                    && many_sellers
                    && (state.consecutive_failures >= self.config.consecutive_failures
                        || (state.window_calls >= self.config.min_calls
                            && f64::from(state.window_failures)
                                >= self.config.failure_ratio * f64::from(state.window_calls)))
            }
            Mode::Open { .. } => false,
        };
        if trip {
            state.mode = Mode::Open {
                until: now + self.open_for(),
            };
            self.open_gauge.set(1.0);
            tracing::warn!(upstream = self.name, "circuit opened");
        } else if success && matches!(state.mode, Mode::HalfOpen { .. }) {
            state.mode = Mode::Closed;
            state.window_calls = 0;
            state.window_failures = 0;
            state.failed_sellers = Sellers::EMPTY;
            self.open_gauge.set(0.0);
            tracing::info!(upstream = self.name, "circuit closed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            enabled: true,
            consecutive_failures: 3,
            failure_ratio: 0.5,
            min_calls: 10,
            min_sellers: 3,
            window: Duration::from_secs(10),
            open: Duration::from_secs(1),
        }
    }

    /// A breaker that needs no spread of sellers (the status feed's).
    fn breaker() -> Breaker {
        Breaker::new("test", config(), 1)
    }

    fn seller(id: u64) -> Option<UserId> {
        UserId::new(id).ok()
    }

    const FAILED: Result<(), UpstreamError> = Err(UpstreamError::Status(500));

    #[tokio::test(start_paused = true)]
    async fn a_run_of_failures_opens_then_a_probe_closes() {
        let b = breaker();
        for _ in 0..2 {
            assert!(b.allow());
            b.count(false, 1);
        }
        assert!(b.allow());
        b.count(true, 1); // the run is broken
        for _ in 0..3 {
            assert!(b.allow());
            b.count(false, 1);
        }
        assert!(!b.allow(), "open after 3 in a row");
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allow(), "one probe");
        assert!(!b.allow(), "only one probe at a time");
        b.count(true, 1);
        assert!(b.allow() && b.allow(), "closed again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_opens_again_and_a_lost_probe_is_replaced() {
        let b = breaker();
        for _ in 0..3 {
            b.count(false, 1);
        }
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allow());
        b.count(false, 1);
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allow(), "probe");
        // The probe never reports; after open_ms another is let through.
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allow());
    }

    #[tokio::test(start_paused = true)]
    async fn a_high_failure_ratio_opens() {
        let b = breaker();
        for i in 0..10 {
            assert!(b.allow());
            b.count(i % 2 == 0, 1);
        }
        assert!(!b.allow(), "5 of 10 failed");
    }

    #[tokio::test(start_paused = true)]
    async fn one_sellers_failures_do_not_open_it() {
        let b = Breaker::new("test", config(), 3);
        for _ in 0..50 {
            assert!(b.allow(), "opened by one seller");
            b.record(&FAILED, seller(7));
        }
        // A second seller's failures: two sellers, still below three.
        for _ in 0..5 {
            b.record(&FAILED, seller(8));
        }
        assert!(b.allow(), "opened by two sellers");
        b.record(&FAILED, seller(9));
        assert!(!b.allow(), "three sellers failing in a run opens it");
    }

    #[tokio::test(start_paused = true)]
    async fn the_sellers_are_counted_per_window() {
        let b = Breaker::new("test", config(), 3);
        b.record(&FAILED, seller(1));
        b.record(&FAILED, seller(2));
        tokio::time::advance(Duration::from_secs(11)).await;
        // A new window: the first two sellers are forgotten.
        b.record(&FAILED, seller(3));
        b.record(&FAILED, seller(3));
        assert!(b.allow());
    }

    #[tokio::test(start_paused = true)]
    async fn undecided_outcomes_are_not_recorded() {
        let b = breaker();
        let undecided = [
            UpstreamError::LoadRefused(429),
            UpstreamError::LoadRefused(503),
            UpstreamError::Local("EMFILE".into()),
            UpstreamError::LocalTimeout,
            UpstreamError::Panicked,
            UpstreamError::Cancelled,
            UpstreamError::Request,
            UpstreamError::Saturated,
            UpstreamError::SellerSaturated,
        ];
        for (i, error) in undecided.iter().cycle().take(100).enumerate() {
            let result: Result<(), _> = Err(error.clone());
            b.record(&result, seller(i as u64 + 1));
        }
        assert!(b.allow(), "undecided outcomes opened it");
        // Nor do they count as calls: three verdicts in a row still open it.
        for id in 1..=3 {
            b.record(&Err::<(), _>(UpstreamError::Timeout), seller(id));
        }
        assert!(!b.allow());
    }
}
