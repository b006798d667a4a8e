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
//! a sequence number of the gateway's own, never a header a caller sets; a
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

/// The failures of a window, or of a half-open spell's probes.
#[derive(Debug, Clone, Copy)]
struct Failed {
    sellers: Ids,
    requests: Ids,
}

impl Failed {
    const NONE: Failed = Failed {
        sellers: Ids::EMPTY,
        requests: Ids::EMPTY,
    };
}

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
    /// The request's sequence number (0: none).
    pub(crate) request: u64,
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
                        state.probes_failed.sellers.add(caller.seller);
                        state.probes_failed.requests.add(caller.request);
                        if self.spread(&state.probes_failed) {
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

    /// Whether failures span enough sellers and requests to speak for everyone.
    fn spread(&self, failed: &Failed) -> bool {
        failed.sellers.len >= self.min_sellers && failed.requests.len >= self.min_requests
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
        state.failed.sellers.add(caller.seller);
        state.failed.requests.add(caller.request);
        let tripped = state.consecutive_failures >= self.config.consecutive_failures
            || (state.window_calls >= self.config.min_calls
                && f64::from(state.window_failures)
                    >= self.config.failure_ratio * f64::from(state.window_calls));
        if tripped && self.spread(&state.failed) {
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
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            enabled: true,
            consecutive_failures: 3,
            failure_ratio: 0.5,
            min_calls: 10,
            min_sellers: 3,
            min_requests: 3,
            window: Duration::from_secs(10),
            open: Duration::from_secs(1),
        }
    }

    /// A breaker that needs no spread of sellers or requests (the status feed's).
    fn breaker() -> Breaker {
        Breaker::new("test", config(), 1, 1)
    }

    /// One that needs three sellers in three requests.
    fn spread() -> Breaker {
        Breaker::new("test", config(), 3, 3)
    }

    /// A call about `seller` in request `request`.
    fn by(seller: u64, request: u64) -> Caller {
        Caller { seller, request }
    }

    const FAILED: Result<(), UpstreamError> = Err(UpstreamError::Status(500));
    const ANSWERED: Result<(), UpstreamError> = Ok(());

    fn fail(b: &Breaker, seller: u64, request: u64) {
        b.record(&FAILED, by(seller, request));
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_of_failures_opens_then_a_probe_closes() {
        let b = breaker();
        for _ in 0..2 {
            assert!(b.allows(0));
            fail(&b, 0, 0);
        }
        assert!(b.allows(0));
        b.record(&ANSWERED, by(0, 0)); // the run is broken
        for _ in 0..3 {
            assert!(b.allows(0));
            fail(&b, 0, 0);
        }
        assert!(!b.allows(0), "open after 3 in a row");
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allows(0), "one probe");
        assert!(!b.allows(0), "only one probe at a time");
        b.record(&ANSWERED, by(0, 0));
        assert!(b.allows(0) && b.allows(0), "closed again");
    }

    /// Open for `open_ms` exactly: not a moment less, and a probe goes out
    /// at its end.
    #[tokio::test(start_paused = true)]
    async fn it_stays_open_for_open_ms_exactly() {
        let b = breaker();
        for _ in 0..3 {
            fail(&b, 0, 0);
        }
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!b.allows(0), "a probe before open_ms");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(b.allows(0), "no probe at open_ms");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_opens_again_and_a_lost_probe_is_replaced() {
        let b = breaker();
        for _ in 0..3 {
            fail(&b, 0, 0);
        }
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allows(0));
        fail(&b, 0, 0);
        assert!(!b.allows(0));
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allows(0), "probe");
        // The probe never reports; after open_ms another is let through.
        assert!(!b.allows(0));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!b.allows(0));
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(b.allows(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_high_failure_ratio_opens() {
        let b = breaker();
        for i in 0..10 {
            assert!(b.allows(0));
            b.record(if i % 2 == 0 { &ANSWERED } else { &FAILED }, by(0, 0));
        }
        assert!(!b.allows(0), "5 of 10 failed");
        // Below the ratio: 4 of 10, never 3 in a row.
        let b = breaker();
        for i in 0..10 {
            assert!(b.allows(0), "opened at {i} calls, 4 of 10 failing");
            b.record(if i % 3 == 0 { &FAILED } else { &ANSWERED }, by(0, 0));
        }
        assert!(b.allows(0), "4 of 10 failed");
    }

    #[tokio::test(start_paused = true)]
    async fn one_sellers_failures_do_not_open_it() {
        let b = spread();
        for request in 1..=50 {
            assert!(b.allows(7), "opened by one seller");
            fail(&b, 7, request);
        }
        // A second seller's failures: two sellers, still below three.
        for request in 51..=55 {
            fail(&b, 8, request);
        }
        assert!(b.allows(1), "opened by two sellers");
        fail(&b, 9, 56);
        assert!(!b.allows(1), "three sellers failing in a run opens it");
    }

    #[tokio::test(start_paused = true)]
    async fn one_requests_failures_do_not_open_it() {
        let b = spread();
        // One batch over fifty sellers: one request.
        for seller in 1..=50 {
            fail(&b, seller, 1);
        }
        fail(&b, 51, 2);
        assert!(b.allows(1), "opened by two requests");
        fail(&b, 52, 3);
        assert!(!b.allows(1), "three requests over three sellers open it");
    }

    #[tokio::test(start_paused = true)]
    async fn the_sellers_are_counted_per_window() {
        let b = spread();
        fail(&b, 1, 1);
        fail(&b, 2, 2);
        tokio::time::advance(Duration::from_secs(11)).await;
        // A new window: the first two sellers are forgotten.
        fail(&b, 3, 3);
        fail(&b, 3, 4);
        assert!(b.allows(1));
    }

    /// Only health signs count: a 4xx about one request, an answer that does
    /// not validate and every undecided outcome are not recorded at all,
    /// neither as failures nor as calls.
    #[tokio::test(start_paused = true)]
    async fn only_health_signs_are_recorded() {
        let b = spread();
        let told_nothing = [
            UpstreamError::Status(400),
            UpstreamError::Status(422),
            UpstreamError::Status(403),
            UpstreamError::Decode("invalid JSON body"),
            UpstreamError::LoadRefused(429),
            UpstreamError::LoadRefused(503),
            UpstreamError::Local("EMFILE".into()),
            UpstreamError::LocalTimeout,
            UpstreamError::LostTime,
            UpstreamError::Load,
            UpstreamError::Panicked,
            UpstreamError::Cancelled,
            UpstreamError::Request,
            UpstreamError::Saturated,
            UpstreamError::SellerSaturated,
            UpstreamError::CircuitOpen,
        ];
        for (i, error) in told_nothing.iter().cycle().take(160).enumerate() {
            let id = i as u64 + 1;
            b.record(&Err::<(), _>(error.clone()), by(id, id));
        }
        assert!(
            b.allows(1),
            "a 4xx, a bad answer or an undecided outcome opened it"
        );
        // Nor do they count as calls: three health failures in a row still
        // open it, each kind of them.
        for (id, error) in [
            UpstreamError::Timeout,
            UpstreamError::Connect("reset".into()),
            UpstreamError::Status(502),
        ]
        .into_iter()
        .enumerate()
        {
            let id = id as u64 + 1;
            b.record(&Err::<(), _>(error), by(id, id));
        }
        assert!(!b.allows(1));
    }

    fn opened() -> Breaker {
        let b = spread();
        for id in 1..=3 {
            fail(&b, id, id);
        }
        assert!(!b.allows(1));
        b
    }

    /// Half-open, it probes one call per seller for as many sellers as
    /// `min_sellers`, and opens again only when that many sellers' probes in
    /// that many requests failed: one seller's trouble does not.
    #[tokio::test(start_paused = true)]
    async fn half_open_probes_several_sellers_and_one_seller_cannot_reopen_it() {
        let b = opened();
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allows(10), "a probe for seller 10");
        assert!(!b.allows(10), "one probe per seller");
        assert!(b.allows(11) && b.allows(12), "three sellers' probes");
        assert!(!b.allows(13), "no more than min_sellers at once");
        // Seller 10's probe fails again and again: never re-opened by it.
        for request in 100..110 {
            fail(&b, 10, request);
            assert!(b.allows(10), "seller 10 may probe again");
        }
        assert!(!b.allows(13));
        // Two more sellers fail, in other requests: three sellers, open.
        fail(&b, 11, 200);
        fail(&b, 12, 201);
        assert!(!b.allows(13) && !b.allows(10), "open again");
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_one_answer_closes_and_a_probe_that_told_nothing_frees_its_place() {
        let b = opened();
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allows(10) && b.allows(11) && b.allows(12));
        b.record(&Err::<(), _>(UpstreamError::Status(422)), by(10, 1));
        // Its place is freed, and only its: the others' probes are still out.
        assert!(
            !b.allows(12) && !b.allows(11),
            "a second probe for a seller"
        );
        assert!(b.allows(13), "the 4xx probe's place is free");
        assert!(!b.allows(14));
        // One batch fails three sellers' probes: one request, not open.
        for seller in [11, 12, 13] {
            fail(&b, seller, 7);
        }
        assert!(b.allows(20), "one request's probes re-opened it");
        b.record(&ANSWERED, by(20, 8));
        assert!(
            b.allows(30) && b.allows(31) && b.allows(32) && b.allows(33),
            "closed"
        );
    }
}
