//! Cold admission: while requests wait too long for the worker threads, only a
//! share of the requests that need an upstream call is let in; the rest are shed
//! at once (503 with `Retry-After`). The rule: docs/caching.md, "A cold replica";
//! why this signal: docs/design.md, "Cold admission". Admission is a stride
//! (every n-th miss): one atomic add per miss, nothing on the hit path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::runtime::lost::{LostTime, lateness};

pub const INTERVAL: Duration = Duration::from_millis(100);
/// All misses admitted, in fixed point.
const ALL: u32 = 1 << 16;
/// The least share of misses admitted (1/64), so cold keys keep filling.
const FLOOR: u32 = ALL / 64;

pub struct Admission {
    /// The share of misses admitted, out of [`ALL`].
    share: AtomicU32,
    /// Misses seen, for the stride.
    misses: AtomicU64,
    /// `server.max_queue_delay_ms`; zero: never shed.
    max_delay: Duration,
    shed: metrics::Counter,
    delay_gauge: metrics::Gauge,
    share_gauge: metrics::Gauge,
    lost: Arc<LostTime>,
}

impl Admission {
    /// Cold admission at `max_delay`, steered by the least lateness of `lost`.
    pub fn new(max_delay: Duration, lost: Arc<LostTime>) -> Self {
        Admission {
            share: AtomicU32::new(ALL),
            misses: AtomicU64::new(0),
            max_delay,
            shed: metrics::counter!("phones_gateway_shed_total", "reason" => "cold"),
            delay_gauge: metrics::gauge!("phones_gateway_queue_delay_seconds"),
            share_gauge: metrics::gauge!("phones_gateway_cold_admitted_ratio"),
            lost,
        }
    }

    /// Whether a request that needs an upstream call is let in now.
    pub fn admit(&self) -> bool {
        let share = u64::from(self.share.load(Ordering::Relaxed));
        if share >= u64::from(ALL) {
            return true;
        }
        // The n-th miss is admitted when the running total of shares reaches a
        // new whole (rounded up, so the first is): evenly spread.
        let n = self.misses.fetch_add(1, Ordering::Relaxed);
        let whole = |k: u64| (k * share + u64::from(ALL) - 1) >> 16;
        let admitted = whole(n + 1) != whole(n);
        if !admitted {
            self.shed.increment(1);
        }
        admitted
    }

    /// One control step, given the wait that stood over the last two intervals.
    fn adjust(&self, delay: Duration) {
        let share = self.share.load(Ordering::Relaxed);
        let next = if delay > self.max_delay {
            let factor = (self.max_delay.as_secs_f64() / delay.as_secs_f64()).clamp(0.1, 0.75);
            // In range: `share` is at most ALL and the factor below one.
            ((f64::from(share) * factor) as u32).max(FLOOR)
        } else if delay < self.max_delay / 2 {
            (share + ALL / 10).min(ALL)
        } else {
            share
        };
        self.share.store(next, Ordering::Relaxed);
        self.delay_gauge.set(delay.as_secs_f64());
        self.share_gauge.set(f64::from(next) / f64::from(ALL));
    }

    /// Steers admission every [`INTERVAL`] until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        if self.max_delay.is_zero() {
            return;
        }
        let mut before = Duration::ZERO;
        loop {
            let due = tokio::time::Instant::now() + INTERVAL;
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(due) => {}
            }
            // Its own wake stands in for the probe's when the probe did not wake.
            let least = self
                .lost
                .take_least()
                .unwrap_or_else(|| lateness(due, tokio::time::Instant::now()));
            self.adjust(least.min(before));
            before = least;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_millis(50);

    fn lost() -> Arc<LostTime> {
        let tolerance = Duration::from_millis(30);
        Arc::new(LostTime::new(tolerance, crate::runtime::lost::PROBE_PERIOD))
    }

    fn admitted_of(admission: &Admission, n: usize) -> usize {
        (0..n).filter(|_| admission.admit()).count()
    }

    #[test]
    fn all_misses_are_admitted_until_requests_wait_too_long() {
        let admission = Admission::new(LIMIT, lost());
        #[rustfmt::skip]
        let steps = [
            (20, 1000, "all under the limit"),
            (60, 750, "a quarter off just over"),
            (30, 750, "held between half and the limit"),
        ];
        for (wait, admitted, case) in steps {
            admission.adjust(Duration::from_millis(wait));
            assert_eq!(admitted_of(&admission, 1000), admitted, "{case}");
        }
    }

    #[test]
    fn a_swamped_replica_cuts_hard_at_once() {
        let admission = Admission::new(LIMIT, lost());
        admission.adjust(Duration::from_millis(500));
        let admitted = admitted_of(&admission, 1000);
        assert_eq!(admitted, 100, "limit/lateness, at most nine tenths off");
    }

    #[test]
    fn the_share_falls_to_a_floor_and_climbs_back_by_tenths() {
        let admission = Admission::new(LIMIT, lost());
        for _ in 0..100 {
            admission.adjust(Duration::from_secs(1));
        }
        assert_eq!(admission.share.load(Ordering::Relaxed), FLOOR);
        let admitted = admitted_of(&admission, 6400);
        assert_eq!(admitted, 100, "a trickle keeps filling the caches");
        for _ in 0..10 {
            admission.adjust(Duration::from_millis(1));
        }
        let share = admission.share.load(Ordering::Relaxed);
        assert_eq!(share, ALL, "all admitted within a second");
        assert_eq!(admitted_of(&admission, 1000), 1000);
    }

    /// At zero nothing is shed, however late the runtime ran.
    #[tokio::test(start_paused = true)]
    async fn at_zero_nothing_is_shed() {
        let lost = lost();
        let off = Arc::new(Admission::new(Duration::ZERO, lost.clone()));
        lost.woke(tokio::time::Instant::now(), Duration::from_millis(400));
        off.clone().watch(CancellationToken::new()).await;
        assert_eq!(admitted_of(&off, 1000), 1000, "nothing shed at zero");
    }

    /// A runtime that wakes every timer late (each step of its clock 60 ms
    /// with no task run between) has a wait that stands: the share is cut.
    #[tokio::test(start_paused = true)]
    async fn a_lateness_that_stands_cuts_the_share() {
        let stop = CancellationToken::new();
        let lost = lost();
        let probing = tokio::spawn(crate::runtime::lost::probe(lost.clone(), stop.clone()));
        let on = Arc::new(Admission::new(LIMIT, lost.clone()));
        let watching = tokio::spawn(on.clone().watch(stop.clone()));
        tokio::task::yield_now().await;
        let mut shares = Vec::new();
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(60)).await;
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            shares.push(on.share.load(Ordering::Relaxed));
        }
        assert_eq!(shares[0], ALL, "one late interval is no queue");
        let twice_cut = ALL * 3 / 4 * 3 / 4;
        assert!(shares[9] <= twice_cut, "cut and cut again: {shares:?}");
        stop.cancel();
        watching.await.unwrap();
        probing.await.unwrap();
    }

    /// One stall (the process paused 900 ms) followed by on-time wakes sheds
    /// nothing, at any point of a turn, with the probe running or not.
    #[tokio::test(start_paused = true)]
    async fn one_stall_sheds_nothing() {
        for probed in [true, false] {
            let stop = CancellationToken::new();
            let lost = lost();
            let probing = probed
                .then(|| tokio::spawn(crate::runtime::lost::probe(lost.clone(), stop.clone())));
            let on = Arc::new(Admission::new(LIMIT, lost.clone()));
            let watching = tokio::spawn(on.clone().watch(stop.clone()));
            for stall_at in [0, 3, 50, 97] {
                tokio::time::sleep(INTERVAL * 3 + Duration::from_millis(stall_at)).await;
                // The clock jumps while no task runs, as under SIGSTOP.
                tokio::time::advance(Duration::from_millis(900)).await;
                for _ in 0..(INTERVAL * 3).as_millis() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let share = on.share.load(Ordering::Relaxed);
                    let case = format!("a stall {stall_at} ms into a turn (probe: {probed})");
                    assert_eq!(share, ALL, "{case} cut the share");
                }
            }
            stop.cancel();
            watching.await.unwrap();
            if let Some(probing) = probing {
                probing.await.unwrap();
            }
        }
    }
}
