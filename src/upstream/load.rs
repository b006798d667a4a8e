//! Whether the gateway is sending an upstream calls faster than it has been:
//! load of the gateway's own making, which is no verdict on a seller.
//!
//! A failure under load that the gateway itself put on an upstream (one
//! caller's batch over many sellers, a burst of cold keys) says nothing of the
//! seller and little of the upstream's health; the same upstream answering
//! everyone at the usual rate would have been fine (docs/rules.md, "Whose
//! load"). So each upstream keeps its send rate, the calls actually sent (not
//! answered: in an outage the answer rate falls to zero, and so would a
//! baseline of answers):
//!
//! - the rate now, over the last [`BUCKET`] (a sliding estimate from two
//!   buckets, the current one and the share of the last still in the window);
//! - a baseline, a moving average over about 30 s of buckets, that stands
//!   still while the upstream is in trouble (a health failure in the last
//!   [`TROUBLE_HOLD`]): the send rate before the trouble began.
//!
//! A call is sent *hot* when the rate now is above [`FACTOR`] times the
//! baseline plus [`SLACK`] calls (so that a few calls a second are never
//! load), once the baseline has [`WARM_UP`] buckets of history. A health failure (a timeout, a 5xx, a refused or reset connection)
//! of a call sent hot is [`UpstreamError::Load`](super::UpstreamError::Load):
//! undecided, no breaker counts it, and the adaptive limit comes down as for a
//! load refusal. An upstream that stops answering everyone at the usual send
//! rate is not load: those failures stay its verdict. Until the baseline has
//! its history (from the first bucket with calls, [`WARM_UP`] buckets outside
//! trouble) nothing is hot: with no history the gateway cannot say it sends
//! more than the upstream has been answering.
//!
//! Its cost is on the cold path only: one uncontended mutex and a few float
//! operations per call sent.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The window of the rate now.
pub(super) const BUCKET: Duration = Duration::from_millis(250);
/// The weight of a bucket in the baseline: about the last 30 s (120 buckets).
const WEIGHT: f64 = 1.0 / 120.0;
/// How many times the baseline the rate now must be to be hot.
pub(super) const FACTOR: f64 = 2.0;
/// Calls per bucket above the baseline's multiple before anything is hot
/// (32 a second).
pub(super) const SLACK: f64 = 8.0;
/// Buckets of history (2 s) the baseline needs before anything is hot: one
/// bucket of a fresh upstream is too few to say what is usual.
pub(super) const WARM_UP: u32 = 8;
/// How long after a health failure the baseline stands still.
pub(super) const TROUBLE_HOLD: Duration = Duration::from_secs(10);

pub(super) struct SendRate {
    state: Mutex<State>,
}

struct State {
    bucket_start: Instant,
    /// Calls sent in the current bucket and in the one before it.
    this: u32,
    last: u32,
    /// Calls per bucket; `None` until the first bucket with calls outside
    /// trouble closes.
    baseline: Option<f64>,
    /// Buckets the baseline has taken in (at most [`WARM_UP`]).
    history: u32,
    /// The baseline stands still until then.
    trouble_until: Option<Instant>,
}

impl SendRate {
    pub(super) fn new() -> Self {
        SendRate {
            state: Mutex::new(State {
                bucket_start: Instant::now(),
                this: 0,
                last: 0,
                baseline: None,
                history: 0,
                trouble_until: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Each update leaves the state valid (counters and floats); a
        // panicked holder changes nothing.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a call sent at `now`; whether it was sent hot.
    pub(super) fn sent(&self, now: Instant) -> bool {
        let mut state = self.lock();
        state.roll(now);
        state.this = state.this.saturating_add(1);
        let into = now
            .saturating_duration_since(state.bucket_start)
            .as_secs_f64()
            / BUCKET.as_secs_f64();
        let recent = f64::from(state.this) + f64::from(state.last) * (1.0 - into.min(1.0));
        state.history >= WARM_UP
            && state
                .baseline
                .is_some_and(|baseline| recent > FACTOR * baseline + SLACK)
    }

    /// A health failure at `now`: the baseline stands still for a while.
    pub(super) fn trouble(&self, now: Instant) {
        let mut state = self.lock();
        state.roll(now);
        state.trouble_until = Some(now + TROUBLE_HOLD);
    }

    /// The baseline, in calls a second (tests, docs).
    #[cfg(test)]
    fn baseline(&self) -> Option<f64> {
        self.lock()
            .baseline
            .map(|calls| calls / BUCKET.as_secs_f64())
    }
}

impl State {
    /// Closes the buckets that ended before `now`.
    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.bucket_start);
        let buckets = elapsed.as_nanos() / BUCKET.as_nanos();
        if buckets == 0 {
            return;
        }
        let steady = self.trouble_until.is_none_or(|until| now >= until);
        if steady {
            self.trouble_until = None;
            let closed = f64::from(self.this);
            let empty = i32::try_from(buckets - 1).unwrap_or(i32::MAX);
            self.baseline = match self.baseline {
                // Idle since start: no history yet.
                None if self.this == 0 => None,
                None => Some(closed),
                Some(baseline) => {
                    Some((baseline + WEIGHT * (closed - baseline)) * (1.0 - WEIGHT).powi(empty))
                }
            };
            if self.baseline.is_some() {
                let taken = u32::try_from(buckets).unwrap_or(u32::MAX);
                self.history = self.history.saturating_add(taken).min(WARM_UP);
            }
        }
        self.last = if buckets == 1 { self.this } else { 0 };
        self.this = 0;
        // At most u32::MAX buckets of 250 ms (34 years) in one step.
        let whole = u32::try_from(buckets).unwrap_or(u32::MAX);
        self.bucket_start += BUCKET * whole;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `per_bucket` calls evenly spread over each of `buckets` buckets;
    /// whether any was hot.
    async fn send(rate: &SendRate, per_bucket: u32, buckets: u32) -> bool {
        let mut hot = false;
        for _ in 0..buckets {
            for _ in 0..per_bucket {
                hot |= rate.sent(Instant::now());
                tokio::time::advance(BUCKET / per_bucket.max(1)).await;
            }
        }
        hot
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_hot_before_a_baseline() {
        let rate = SendRate::new();
        // Idle buckets since start make no baseline of nothing.
        tokio::time::advance(BUCKET * 10).await;
        for _ in 0..100 {
            assert!(!rate.sent(Instant::now()));
        }
        // Trouble from the first call: still none, so the calls of an
        // upstream down from the start are its verdicts.
        rate.trouble(Instant::now());
        tokio::time::advance(BUCKET * 3).await;
        for _ in 0..100 {
            assert!(!rate.sent(Instant::now()));
        }
        assert_eq!(rate.baseline(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_right_after_the_first_calls_is_not_hot() {
        let rate = SendRate::new();
        // One call, then a bucket of ten, then thirty at once: a baseline of a
        // few buckets says nothing yet.
        assert!(!send(&rate, 1, 1).await);
        assert!(!send(&rate, 10, 1).await);
        assert!(!(0..30).any(|_| rate.sent(Instant::now())));
        // Two seconds of ten a bucket later, thirty at once is.
        assert!(!send(&rate, 10, 8).await);
        assert!((0..30).any(|_| rate.sent(Instant::now())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_above_twice_the_baseline_is_hot_and_the_usual_rate_is_not() {
        let rate = SendRate::new();
        // 10 calls a bucket (40 a second) for 30 s.
        assert!(!send(&rate, 10, 120).await);
        let baseline = rate.baseline().unwrap();
        assert!((39.0..=41.0).contains(&baseline), "{baseline}");
        // Up to twice the usual rate: not hot.
        assert!(!send(&rate, 20, 2).await);
        assert!(!send(&rate, 10, 8).await);
        // A burst at once, on top of the last bucket's usual 10: hot from the
        // 19th, the 29th call of the last 250 ms (above 2 x 10 + 8).
        let burst: Vec<bool> = (0..30).map(|_| rate.sent(Instant::now())).collect();
        assert!(!burst[..18].iter().any(|&hot| hot), "{burst:?}");
        assert!(burst[18..].iter().all(|&hot| hot), "{burst:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_baseline_stands_still_in_trouble_and_follows_after() {
        let rate = SendRate::new();
        assert!(!send(&rate, 10, 120).await);
        // Trouble, and ten times the calls: the baseline stays at 40 a second
        // and the flood is hot.
        for _ in 0..20 {
            rate.trouble(Instant::now());
            assert!(send(&rate, 100, 1).await);
        }
        assert!(rate.sent(Instant::now()), "still hot at the flood's rate");
        let frozen = rate.baseline().unwrap();
        assert!((39.0..=41.0).contains(&frozen), "{frozen}");
        // Past the hold the baseline follows the new rate.
        tokio::time::advance(TROUBLE_HOLD).await;
        send(&rate, 100, 240).await;
        let followed = rate.baseline().unwrap();
        assert!(followed > 300.0, "{followed}");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_buckets_bring_the_baseline_down() {
        let rate = SendRate::new();
        send(&rate, 10, 120).await;
        // A minute idle: the baseline decays toward nothing.
        tokio::time::advance(Duration::from_secs(60)).await;
        rate.sent(Instant::now());
        let decayed = rate.baseline().unwrap();
        assert!(decayed < 40.0 * 0.2, "{decayed}");
    }
}
