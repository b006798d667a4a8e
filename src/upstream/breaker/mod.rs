//! A circuit breaker per upstream: after a run of failures, or a high failure
//! ratio within a window, the upstream is not called for `open_ms`; then it is
//! half-open, one probe per seller for up to `breaker.min_sellers` sellers.
//! What it counts: docs/rules.md, "What a breaker counts". A call that panics or
//! is dropped is recorded on its way out, so it frees its probe's place.
//! Distinct sellers and requests are kept in fixed-size sets per window (at most
//! [`MAX_MIN_SELLERS`] ids, no allocation, under the state's lock).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::Ticket;
use super::ending::{Ending, Health};
use super::error::UpstreamError;
use crate::config::BreakerConfig;

/// The largest `breaker.min_sellers` and `breaker.min_requests` (validated at
/// start).
pub(crate) const MAX_MIN_SELLERS: usize = 32;

#[derive(Debug, Clone, Copy)]
struct Ids {
    ids: [u64; MAX_MIN_SELLERS],
    len: usize,
}

impl Ids {
    const EMPTY: Ids = Ids {
        ids: [0; MAX_MIN_SELLERS],
        len: 0,
    };

    fn contains(&self, id: u64) -> bool {
        self.ids[..self.len].contains(&id)
    }

    fn add(&mut self, id: u64) {
        if self.len < MAX_MIN_SELLERS && !self.contains(id) {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(at) = self.ids[..self.len].iter().position(|&x| x == id) {
            self.ids[at] = self.ids[self.len - 1];
            self.len -= 1;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Closed,
    Open { until: Instant },
    HalfOpen { since: Instant },
}

/// Whom failures were about, and in which requests.
#[derive(Debug, Clone, Copy)]
pub(super) struct Failed {
    sellers: Ids,
    requests: Ids,
}

impl Failed {
    pub(super) const NONE: Failed = Failed {
        sellers: Ids::EMPTY,
        requests: Ids::EMPTY,
    };

    pub(super) fn add(&mut self, caller: Caller) {
        self.sellers.add(caller.seller);
        self.requests.add(caller.ticket.0);
    }

    /// Whether they span `spread`: (distinct sellers, distinct requests).
    pub(super) fn spans(&self, spread: Spread) -> bool {
        self.sellers.len >= spread.0 && self.requests.len >= spread.1
    }
}

/// Distinct sellers and requests failures must span (clamped).
pub(super) type Spread = (usize, usize);

#[derive(Debug)]
struct State {
    mode: Mode,
    consecutive_failures: u32,
    window_start: Instant,
    window_calls: u32,
    window_failures: u32,
    failed: Failed,
    /// Half-open: the sellers with a probe out.
    probing: Ids,
    /// Half-open: whom the failed probes were about.
    probes_failed: Failed,
    /// Half-open: a probe ended undecided, and none has decided since.
    probe_undecided: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allow {
    Closed,
    Probe,
    /// Not made: the breaker's being open is the upstream's verdict.
    No,
    /// Not made: a probe ended undecided, so this is undecided too.
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The seller (0: none, the status feed; seller ids are positive).
    pub(crate) seller: u64,
    /// [`Ticket::NONE`]: none.
    pub(crate) ticket: Ticket,
}

pub(crate) struct Breaker {
    name: &'static str,
    config: BreakerConfig,
    /// Also how many probes a half-open spell lets out at once.
    min_sellers: usize,
    min_requests: usize,
    state: Mutex<State>,
    open_gauge: metrics::Gauge,
}

impl Breaker {
    /// `min_sellers` and `min_requests` are clamped to 1..=`MAX_MIN_SELLERS`.
    pub(crate) fn new(
        name: &'static str,
        config: BreakerConfig,
        min_sellers: u32,
        min_requests: u32,
    ) -> Self {
        let clamp = |n: u32| {
            usize::try_from(n)
                .unwrap_or(MAX_MIN_SELLERS)
                .clamp(1, MAX_MIN_SELLERS)
        };
        Breaker {
            name,
            config,
            min_sellers: clamp(min_sellers),
            min_requests: clamp(min_requests),
            state: Mutex::new(State {
                mode: Mode::Closed,
                consecutive_failures: 0,
                window_start: Instant::now(),
                window_calls: 0,
                window_failures: 0,
                failed: Failed::NONE,
                probing: Ids::EMPTY,
                probes_failed: Failed::NONE,
                probe_undecided: false,
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

    /// Whether a call about `seller` (0: none) may go out now (tests).
    #[cfg(test)]
    fn allows(&self, seller: u64) -> bool {
        self.allow(seller) != Allow::No
    }

    /// Whether a call about `seller` (0: none) may go out now, and as what.
    pub(crate) fn allow(&self, seller: u64) -> Allow {
        if !self.config.enabled {
            return Allow::Closed;
        }
        let now = Instant::now();
        let mut state = self.lock();
        let probe = match state.mode {
            Mode::Closed => return Allow::Closed,
            Mode::Open { until } if now < until => return Allow::No,
            Mode::Open { .. } => true,
            // Probes that never reported are replaced after `open_ms`.
            Mode::HalfOpen { since } => now >= since + self.open_for(),
        };
        if probe {
            state.mode = Mode::HalfOpen { since: now };
            state.probing = Ids::EMPTY;
            state.probes_failed = Failed::NONE;
        }
        if state.probing.contains(seller) || state.probing.len >= self.min_sellers {
            return if state.probe_undecided {
                Allow::Wait
            } else {
                Allow::No
            };
        }
        state.probing.add(seller);
        Allow::Probe
    }

    /// Reports how an allowed call ended: only a health sign counts, but any
    /// end frees its seller's probe.
    pub(crate) fn record<T>(&self, result: &Result<T, UpstreamError>, caller: Caller) {
        if !self.config.enabled {
            return;
        }
        let row = match result {
            Ok(_) => Ending::Answered,
            Err(error) => Ending::Failed(error),
        }
        .row();
        let healthy = match row.health {
            Health::Up => Some(true),
            Health::Down => Some(false),
            Health::Silent => None,
        };
        let undecided = row.failure.is_some_and(|failure| !failure.is_verdict());
        let now = Instant::now();
        let mut state = self.lock();
        match state.mode {
            Mode::Open { .. } => {}
            Mode::HalfOpen { .. } => {
                state.probing.remove(caller.seller);
                match healthy {
                    Some(true) => self.close(&mut state),
                    Some(false) => {
                        state.probes_failed.add(caller);
                        if state.probes_failed.spans(self.spread()) {
                            self.open(&mut state, now);
                        }
                    }
                    None => state.probe_undecided |= undecided,
                }
            }
            Mode::Closed => {
                if let Some(healthy) = healthy {
                    self.count(&mut state, healthy, caller, now);
                }
            }
        }
    }

    /// Gives back the probe's place of a call not sent after all.
    pub(crate) fn release(&self, seller: u64) {
        let mut state = self.lock();
        if matches!(state.mode, Mode::HalfOpen { .. }) {
            state.probing.remove(seller);
        }
    }

    /// Half-open, with a probe that ended undecided and none decided since.
    pub(crate) fn probes_undecided(&self) -> bool {
        let state = self.lock();
        matches!(state.mode, Mode::HalfOpen { .. }) && state.probe_undecided
    }

    /// The spread failures must have to open it; the back-off asks the same.
    pub(super) fn spread(&self) -> Spread {
        (self.min_sellers, self.min_requests)
    }

    fn count(&self, state: &mut State, healthy: bool, caller: Caller, now: Instant) {
        if now >= state.window_start + self.config.window {
            state.window_start = now;
            state.window_calls = 0;
            state.window_failures = 0;
            state.failed = Failed::NONE;
        }
        state.window_calls += 1;
        if healthy {
            state.consecutive_failures = 0;
            return;
        }
        state.consecutive_failures += 1;
        state.window_failures += 1;
        state.failed.add(caller);
        let tripped = state.consecutive_failures >= self.config.consecutive_failures
            || (state.window_calls >= self.config.min_calls
                && f64::from(state.window_failures)
                    >= self.config.failure_ratio * f64::from(state.window_calls));
        if tripped && state.failed.spans(self.spread()) {
            self.open(state, now);
        }
    }

    fn open(&self, state: &mut State, now: Instant) {
        state.probe_undecided = false;
        state.mode = Mode::Open {
            until: now + self.open_for(),
        };
        self.open_gauge.set(1.0);
        tracing::warn!(upstream = self.name, "circuit opened");
    }

    fn close(&self, state: &mut State) {
        state.mode = Mode::Closed;
        state.consecutive_failures = 0;
        state.window_calls = 0;
        state.window_failures = 0;
        state.failed = Failed::NONE;
        state.probing = Ids::EMPTY;
        state.probe_undecided = false;
        self.open_gauge.set(0.0);
        tracing::info!(upstream = self.name, "circuit closed");
    }
}

#[cfg(test)]
mod tests;
