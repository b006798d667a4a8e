//! A circuit breaker per upstream: after a run of failures, or a high failure
//! ratio within a window, the upstream is not called for `open_ms`; calls fail at
//! once with `UpstreamError::CircuitOpen`, which the rules treat as any failure
//! (fail_closed / fall_through, stale-if-error). Then one probe call is let
//! through (half-open): success closes the circuit, failure opens it again. A
//! probe that never reports (its task was dropped) is replaced after `open_ms`.
//!
//! A 404 is an answer, not a failure. State changes are logged and exported as
//! `phones_gateway_circuit_open{upstream}` (1 while open or half-open).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::BreakerConfig;

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
}

pub(crate) struct Breaker {
    name: &'static str,
    config: BreakerConfig,
    state: Mutex<State>,
    open_gauge: metrics::Gauge,
}

impl Breaker {
    pub(crate) fn new(name: &'static str, config: BreakerConfig) -> Self {
        Breaker {
            name,
            config,
            state: Mutex::new(State {
                mode: Mode::Closed,
                consecutive_failures: 0,
                window_start: Instant::now(),
                window_calls: 0,
                window_failures: 0,
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

    /// Reports how an allowed call ended.
    pub(crate) fn record(&self, success: bool) {
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
        }
        state.window_calls += 1;
        if success {
            state.consecutive_failures = 0;
        } else {
            state.consecutive_failures += 1;
            state.window_failures += 1;
        }
        let trip = match state.mode {
            Mode::HalfOpen { .. } => !success,
            Mode::Closed => {
                !success
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
            self.open_gauge.set(0.0);
            tracing::info!(upstream = self.name, "circuit closed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(
            "test",
            BreakerConfig {
                enabled: true,
                consecutive_failures: 3,
                failure_ratio: 0.5,
                min_calls: 10,
                window: Duration::from_secs(10),
                open: Duration::from_secs(1),
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_of_failures_opens_then_a_probe_closes() {
        let b = breaker();
        for _ in 0..2 {
            assert!(b.allow());
            b.record(false);
        }
        assert!(b.allow());
        b.record(true); // the run is broken
        for _ in 0..3 {
            assert!(b.allow());
            b.record(false);
        }
        assert!(!b.allow(), "open after 3 in a row");
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allow(), "one probe");
        assert!(!b.allow(), "only one probe at a time");
        b.record(true);
        assert!(b.allow() && b.allow(), "closed again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_opens_again_and_a_lost_probe_is_replaced() {
        let b = breaker();
        for _ in 0..3 {
            b.record(false);
        }
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allow());
        b.record(false);
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
            b.record(i % 2 == 0);
        }
        assert!(!b.allow(), "5 of 10 failed");
    }
}
