//! A circuit breaker per upstream: after a run of failures, or a high failure
//! ratio within a window, the upstream is not called for `open_ms`; calls fail at
//! once with `UpstreamError::CircuitOpen`, which the rules treat as the
//! upstream's verdict (fail_closed / fall_through, stale-if-error). Then it is
//! half-open: probes are let through, one per seller for as many distinct
//! sellers as `breaker.min_sellers` at once; one answer closes it, and it opens
//! again only when the probes of that many sellers, in `breaker.min_requests`
//! requests, failed. Other calls meanwhile are `CircuitOpen`, until a probe
//! ends undecided (refused for load, say): from then until a probe decides,
//! they are `HalfOpen`, undecided too, since nothing has said whether the
//! upstream is back. A call that panics or whose task is dropped is recorded
//! as such on its way out (it tells nothing, and frees its probe's place);
//! probes that still never report are replaced after `open_ms`.
//!
//! What it counts: signs of the upstream's health only (docs/rules.md, "What a
//! breaker counts"). A failure is a 5xx that is not a load refusal, a refused
//! or reset connection, or a timeout the upstream owns (not the gateway's
//! lost time, not load the gateway put on it: `timer`, `backoff`); a success is
//! any answer the contract allows (200, 404). Nothing else is recorded at all,
//! neither as a failure nor as a call: a 4xx other than 404 and 429 is the
//! upstream's word on one request (that seller, that phone), an answer that
//! does not validate is about that answer, and an undecided outcome (a load
//! refusal, the gateway's own trouble, a bound on calls in flight) says
//! nothing of the upstream's health; counting any of them as a success would
//! dilute a failure ratio with calls that tell nothing either.
//!
//! Opening it for everyone takes failures across many sellers and many
//! requests: besides the run or the ratio, the failures of the window must be
//! about at least `breaker.min_sellers` distinct sellers and come from at
//! least `breaker.min_requests` distinct requests (the request's identity is
//! a ticket ([`Ticket`]), a sequence number of the gateway's own, never a header a caller sets; a
//! batch is one request). Otherwise one caller could make calls fail (an
//! upstream that answers 500 for a seller it dislikes, or one batch over many
//! sellers) and open the breaker, turning every other seller's call tracking
//! into `CircuitOpen`, a verdict, so that they fall through to their real
//! numbers. So does its half-open state, for the same reason: one seller's
//! trouble cannot re-open it for everyone. The distinct sellers and requests
//! are kept in small fixed-size sets per window (no allocation, at most
//! [`MAX_MIN_SELLERS`] ids each, compared linearly: touched on failures only,
//! under the lock the state already takes). The status feed has no seller and
//! no request: its breaker is made with minimums of one (its poller is its
//! only caller, and no lookup goes through its breaker), so it opens on the
//! run or the ratio alone and probes once at a time.
//!
//! The rule beside others': Envoy's outlier detection ejects a host on
//! consecutive 5xx or gateway errors (connect failures, timeouts) only, never
//! on 4xx; Google's SRE book has clients throttle themselves by the share of
//! requests the backend *accepted*, so that the client's own excess is not
//! read as the backend's failure. Here the gateway's own excess is told apart
//! before the breaker sees it (`backoff`, `timer`), and the spread over sellers
//! and requests stands in for "the backend fails for everyone".
//!
//! State changes are logged and exported as
//! `phones_gateway_circuit_open{upstream}` (1 while open or half-open).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::Ticket;
use super::ending::{Ending, Health};
use super::error::UpstreamError;
use crate::config::BreakerConfig;

/// The largest `breaker.min_sellers` and `breaker.min_requests` (validated at
/// start): the size of the sets of distinct ids a window keeps.
pub(crate) const MAX_MIN_SELLERS: usize = 32;

/// Distinct ids (sellers, or requests), up to `MAX_MIN_SELLERS`.
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

/// Whom failures were about, and in which requests: a window's, a half-open
/// spell's probes', or the back-off's verdicts (`backoff`), each spread over
/// many sellers and requests before it says "failing for everyone".
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

/// How many distinct sellers and requests failures must span to be the
/// upstream's trouble for everyone (`breaker.min_sellers`,
/// `breaker.min_requests`, clamped).
pub(super) type Spread = (usize, usize);

#[derive(Debug)]
struct State {
    mode: Mode,
    consecutive_failures: u32,
    window_start: Instant,
    window_calls: u32,
    window_failures: u32,
    /// Whom the window's failures were about, and in which requests.
    failed: Failed,
    /// Half-open: the sellers with a probe out.
    probing: Ids,
    /// Half-open: whom the failed probes were about.
    probes_failed: Failed,
    /// Half-open: a probe ended undecided, and none has decided since.
    probe_undecided: bool,
}

/// What the breaker lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allow {
    /// Closed: the call goes out.
    Closed,
    /// Half-open: the call goes out as a probe for its seller.
    Probe,
    /// Open, or half-open with its probes out: the call is not made, and
    /// the breaker's being open is the upstream's verdict.
    No,
    /// Half-open with its probes out, one of them having ended undecided:
    /// the call is not made, and nothing has said yet whether the upstream
    /// is back, so it is undecided too.
    Wait,
}

/// What a call about a seller, in a request, is in the breaker's eyes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The seller (0: none, the status feed; seller ids are positive).
    pub(crate) seller: u64,
    /// The request's ticket ([`Ticket::NONE`]: none).
    pub(crate) ticket: Ticket,
}

pub(crate) struct Breaker {
    name: &'static str,
    config: BreakerConfig,
    /// Distinct sellers a window's failures must span to open it, and how
    /// many probes a half-open spell lets out at once.
    min_sellers: usize,
    /// Distinct requests a window's failures must come from to open it.
    min_requests: usize,
    state: Mutex<State>,
    open_gauge: metrics::Gauge,
}

impl Breaker {
    /// A breaker for upstream `name` that opens only when a window's failures
    /// were about `min_sellers` distinct sellers in `min_requests` distinct
    /// requests (each clamped to 1..=`MAX_MIN_SELLERS`).
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

    /// Whether a call about `seller` (0: none) may go out now, and as what:
    /// closed, any call; half-open, a probe.
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

    /// Reports how an allowed call about `caller` ended: a health sign counts,
    /// anything else is not recorded (the module's doc says why), but frees
    /// its seller's probe.
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

    /// Gives back the probe's place of a call about `seller` that was not
    /// sent after all; nothing is recorded.
    pub(crate) fn release(&self, seller: u64) {
        let mut state = self.lock();
        if matches!(state.mode, Mode::HalfOpen { .. }) {
            state.probing.remove(seller);
        }
    }

    /// Half-open, with a probe that ended undecided and none that decided
    /// since.
    pub(crate) fn probes_undecided(&self) -> bool {
        let state = self.lock();
        matches!(state.mode, Mode::HalfOpen { .. }) && state.probe_undecided
    }

    /// Whether failures span enough sellers and requests to speak for everyone.
    /// The spread failures must have to open it; the back-off asks the same.
    pub(super) fn spread(&self) -> Spread {
        (self.min_sellers, self.min_requests)
    }

    /// Counts one health sign in the closed state.
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
