//! Cold admission: while the worker threads are saturated, only a share of the
//! requests that need an upstream call is let in; the rest are shed at once
//! (503 with `Retry-After`, `phones_gateway_shed_total{reason="cold"}`).
//!
//! Why this signal and this action. A fresh replica put under a sale day's load
//! misses on nearly every key, and a miss costs several times a hit's CPU (it
//! makes one to three upstream calls). Past what the cores can do, requests wait
//! in socket buffers and in the run queue, unseen by `server.max_in_flight`
//! (which bounds requests in flight, not how long they waited), and every answer
//! comes late. We chose, after reading how others decide:
//! - Envoy's overload manager watches resources (heap, connections) and
//!   triggers actions at thresholds: the action here is of that kind (shed a
//!   class of work), the resource is CPU.
//! - Netflix's concurrency-limits adapts a limit from latency (Vegas/gradient):
//!   it needs a stable no-load latency, which a cold path with upstream calls of
//!   varying speed does not have, and it sheds hits and misses alike.
//! - Event-loop lag shedding (Node's toobusy) measures how late a timer fires:
//!   with one worker thread and tokio's timer checked only between tasks, the
//!   lag at saturation is a millisecond or two, too close to noise to act on.
//!
//! So the signal is the share of time the runtime's workers spent running tasks
//! (tokio's `worker_total_busy_duration`), sampled every [`INTERVAL`], and the
//! action sheds only the expensive class, misses: a hit costs little more than
//! a shed, so hits keep being answered, and the misses let in fill the caches as
//! fast as the CPU allows, so the share of hits, and then throughput, recover by
//! themselves. The share of misses admitted follows AIMD, as TCP does: cut by a
//! quarter each interval the workers were busier than `server.max_busy_percent`,
//! raised by a tenth of the whole each interval they were not (from the floor
//! to all in about a second). It never drops below [`FLOOR`], so a replica
//! always makes progress on its cold keys. Admission is a deterministic stride
//! (every n-th miss), one atomic add per miss and nothing on the hit path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// How often the workers' busy share is sampled and the admitted share adjusted.
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
    /// `server.max_busy_percent` as a fraction; 1.0 or more: never shed.
    max_busy: f64,
    shed: metrics::Counter,
    busy_gauge: metrics::Gauge,
    share_gauge: metrics::Gauge,
}

impl Admission {
    pub fn new(max_busy_percent: u8) -> Self {
        Admission {
            share: AtomicU32::new(ALL),
            misses: AtomicU64::new(0),
            max_busy: f64::from(max_busy_percent) / 100.0,
            shed: metrics::counter!("phones_gateway_shed_total", "reason" => "cold"),
            busy_gauge: metrics::gauge!("phones_gateway_worker_busy_ratio"),
            share_gauge: metrics::gauge!("phones_gateway_cold_admitted_ratio"),
        }
    }

    /// Whether a request that needs an upstream call is let in now; counts it
    /// when it is shed.
    pub fn admit(&self) -> bool {
        let share = u64::from(self.share.load(Ordering::Relaxed));
        if share >= u64::from(ALL) {
            return true;
        }
        // The n-th miss is admitted when the running total of shares reaches a
        // new whole (rounded up, so the first is): exactly `share` of them,
        // evenly spread.
        let n = self.misses.fetch_add(1, Ordering::Relaxed);
        let whole = |k: u64| (k * share + u64::from(ALL) - 1) >> 16;
        let admitted = whole(n + 1) != whole(n);
        if !admitted {
            self.shed.increment(1);
        }
        admitted
    }

    /// One control step, given the workers' busy share over the last interval.
    fn adjust(&self, busy: f64) {
        let share = self.share.load(Ordering::Relaxed);
        let next = if busy > self.max_busy {
            (share - share / 4).max(FLOOR)
        } else {
            (share + ALL / 10).min(ALL)
        };
        self.share.store(next, Ordering::Relaxed);
        self.busy_gauge.set(busy);
        self.share_gauge.set(f64::from(next) / f64::from(ALL));
    }

    /// Samples the runtime's workers every [`INTERVAL`] until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        if self.max_busy >= 1.0 {
            return;
        }
        let metrics = tokio::runtime::Handle::current().metrics();
        let workers = metrics.num_workers();
        let busy_total = || {
            (0..workers)
                .map(|w| metrics.worker_total_busy_duration(w))
                .sum::<Duration>()
        };
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut at, mut busy) = (Instant::now(), busy_total());
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (now, total) = (Instant::now(), busy_total());
            let elapsed = now.duration_since(at).as_secs_f64() * workers as f64;
            if elapsed > 0.0 {
                self.adjust(total.saturating_sub(busy).as_secs_f64() / elapsed);
            }
            (at, busy) = (now, total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted_of(admission: &Admission, n: usize) -> usize {
        (0..n).filter(|_| admission.admit()).count()
    }

    #[test]
    fn all_misses_are_admitted_until_the_workers_are_too_busy() {
        let admission = Admission::new(90);
        admission.adjust(0.89);
        assert_eq!(admitted_of(&admission, 1000), 1000);
        admission.adjust(0.95);
        assert_eq!(admitted_of(&admission, 1000), 750);
    }

    #[test]
    fn the_share_falls_by_quarters_to_a_floor_and_climbs_back_by_tenths() {
        let admission = Admission::new(90);
        for _ in 0..100 {
            admission.adjust(1.0);
        }
        assert_eq!(admission.share.load(Ordering::Relaxed), FLOOR);
        assert_eq!(
            admitted_of(&admission, 6400),
            100,
            "a trickle keeps filling the caches"
        );
        for step in 1..=10 {
            admission.adjust(0.5);
            let share = admission.share.load(Ordering::Relaxed);
            assert!(step < 10 || share == ALL, "all admitted within a second");
        }
        assert_eq!(admitted_of(&admission, 1000), 1000);
    }

    #[tokio::test]
    async fn at_one_hundred_percent_nothing_watches_and_nothing_is_shed() {
        let stop = CancellationToken::new();
        let off = Arc::new(Admission::new(100));
        let watching = tokio::time::timeout(INTERVAL * 3, off.clone().watch(stop.clone()));
        assert!(watching.await.is_ok(), "the watcher returns at once");
        assert_eq!(admitted_of(&off, 1000), 1000);
        let on = Arc::new(Admission::new(90));
        let watching = tokio::time::timeout(INTERVAL * 3, on.watch(stop.clone()));
        assert!(watching.await.is_err(), "the watcher runs until stopped");
    }
}
