//! Time the process lost: how late its timers ran (CPU throttle, a paused
//! process, a stalled worker), as a running total read by an upstream call's
//! timer (docs/rules.md, "Whose time") and by cold admission. [`probe`] sleeps
//! [`PROBE_PERIOD`] at a time and adds how late it woke; a reading
//! ([`LostTime::mark`]) also counts the gap since the probe last woke, so
//! whatever runs first after a stall sees it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The probe's sleep: a stall longer than this (plus 1 ms) is lost time.
pub const PROBE_PERIOD: Duration = Duration::from_millis(5);

/// The process's lost time so far, and the tolerance a call allows.
pub struct LostTime {
    /// Microseconds lost since start.
    total_us: AtomicU64,
    /// The least lateness since [`LostTime::take_least`], in microseconds
    /// (`u64::MAX`: no wake since).
    least_us: AtomicU64,
    /// The probe's last wake, microseconds after `epoch`, plus one (0: never).
    woke_us: AtomicU64,
    epoch: Instant,
    period: Duration,
    /// `upstreams.lost_time_tolerance_ms`.
    tolerance: Duration,
    histogram: metrics::Histogram,
}

impl LostTime {
    pub fn new(tolerance: Duration, period: Duration) -> Self {
        LostTime {
            total_us: AtomicU64::new(0),
            least_us: AtomicU64::new(u64::MAX),
            woke_us: AtomicU64::new(0),
            epoch: Instant::now(),
            period,
            tolerance,
            histogram: metrics::histogram!("phones_gateway_lost_time_seconds"),
        }
    }

    /// The probe woke at `now`, `late` ([`lateness`]).
    pub fn woke(&self, now: Instant, late: Duration) {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.least_us.fetch_min(micros(late), Ordering::Relaxed);
        if !late.is_zero() {
            self.total_us.fetch_add(micros(late), Ordering::Relaxed);
            self.histogram.record(late.as_secs_f64());
        }
        let at = micros(now.saturating_duration_since(self.epoch)).saturating_add(1);
        self.woke_us.store(at, Ordering::Relaxed);
    }

    /// The running total now, the probe's pending gap included.
    pub fn mark(&self) -> Mark {
        let total = self.total_us.load(Ordering::Relaxed);
        let woke = self.woke_us.load(Ordering::Relaxed);
        if woke == 0 {
            return Mark(total);
        }
        let since_woke = Instant::now()
            .saturating_duration_since(self.epoch + Duration::from_micros(woke - 1))
            .saturating_sub(self.period + Duration::from_millis(1));
        Mark(total.saturating_add(u64::try_from(since_woke.as_micros()).unwrap_or(u64::MAX)))
    }

    /// The least lateness of the probe's wakes since the last call, which
    /// starts the next period; `None` if it did not wake meanwhile.
    pub fn take_least(&self) -> Option<Duration> {
        match self.least_us.swap(u64::MAX, Ordering::Relaxed) {
            u64::MAX => None,
            least => Some(Duration::from_micros(least)),
        }
    }

    /// Time lost since `mark` was read.
    pub fn since(&self, mark: Mark) -> Duration {
        Duration::from_micros(self.mark().0.saturating_sub(mark.0))
    }

    /// What a call's timer allows before giving time back.
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }
}

/// A reading of the running total of lost time.
#[derive(Debug, Clone, Copy)]
pub struct Mark(u64);

/// Feeds `lost` until `stop`: sleeps its period, adds how late it woke.
pub async fn probe(lost: std::sync::Arc<LostTime>, stop: CancellationToken) {
    loop {
        let due = Instant::now() + lost.period;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(due) => {}
        }
        let now = Instant::now();
        lost.woke(now, lateness(due, now));
    }
}

/// How late a timer due at `due` fired at `now`, less tokio's 1 ms granularity.
pub fn lateness(due: Instant, now: Instant) -> Duration {
    now.saturating_duration_since(due)
        .saturating_sub(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_millis(5);

    #[tokio::test(start_paused = true)]
    async fn the_total_counts_late_wakes_and_a_mark_reads_what_came_after() {
        let lost = LostTime::new(Duration::from_millis(30), PERIOD);
        lost.woke(Instant::now(), Duration::from_millis(5));
        let mark = lost.mark();
        assert_eq!(lost.since(mark), Duration::ZERO);
        lost.woke(Instant::now(), Duration::ZERO);
        lost.woke(Instant::now(), Duration::from_millis(400));
        lost.woke(Instant::now(), Duration::from_micros(250));
        assert_eq!(lost.since(mark), Duration::from_micros(400_250));
    }

    /// A stall counts before the probe wakes again (the gap beyond its period
    /// and 1 ms), and the probe's own report of it later adds nothing twice.
    #[tokio::test(start_paused = true)]
    async fn a_stall_is_seen_before_the_probe_runs_again() {
        let lost = LostTime::new(Duration::from_millis(30), PERIOD);
        lost.woke(Instant::now(), Duration::ZERO);
        let mark = lost.mark();
        tokio::time::advance(Duration::from_millis(4)).await;
        assert_eq!(lost.since(mark), Duration::ZERO, "within the period");
        tokio::time::advance(Duration::from_millis(202)).await;
        assert_eq!(lost.since(mark), Duration::from_millis(200));
        // The probe, due 5 ms after its last wake, wakes now: 200 ms late.
        lost.woke(Instant::now(), Duration::from_millis(200));
        assert_eq!(lost.since(mark), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn lateness_leaves_out_the_timers_millisecond() {
        let (due, ms) = (Instant::now(), Duration::from_millis);
        assert_eq!(lateness(due, due), Duration::ZERO);
        assert_eq!(lateness(due, due + ms(1)), Duration::ZERO);
        assert_eq!(lateness(due, due + ms(151)), ms(150));
        assert_eq!(lateness(due + Duration::from_secs(1), due), Duration::ZERO);
    }

    /// The probe adds a frozen runtime's time (the clock jumps, no task
    /// runs); the least lateness is the stall's while it is the only wake,
    /// an on-time wake's after it, and is read once.
    #[tokio::test(start_paused = true)]
    async fn the_probe_feeds_a_stall_and_its_least() {
        let stop = CancellationToken::new();
        let lost = std::sync::Arc::new(LostTime::new(Duration::from_millis(30), PERIOD));
        let mark = lost.mark();
        let probing = tokio::spawn(probe(lost.clone(), stop.clone()));
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(400)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let fed = lost.since(mark);
        assert!(fed >= Duration::from_millis(390), "lost time fed: {fed:?}");
        assert!(lost.take_least().unwrap() >= Duration::from_millis(390));
        assert_eq!(lost.take_least(), None, "read once");
        tokio::time::sleep(PERIOD * 3).await;
        lost.woke(Instant::now(), Duration::from_millis(400));
        assert_eq!(lost.take_least(), Some(Duration::ZERO), "the on-time wakes");
        stop.cancel();
        probing.await.unwrap();
    }

    /// A probe that wakes on time adds nothing.
    #[tokio::test(start_paused = true)]
    async fn a_calm_probe_adds_nothing() {
        let stop = CancellationToken::new();
        let lost = std::sync::Arc::new(LostTime::new(Duration::from_millis(30), PERIOD));
        let mark = lost.mark();
        let probing = tokio::spawn(probe(lost.clone(), stop.clone()));
        for _ in 0..20 {
            tokio::time::sleep(PERIOD).await;
        }
        assert_eq!(lost.since(mark), Duration::ZERO);
        assert_eq!(lost.take_least(), Some(Duration::ZERO));
        stop.cancel();
        probing.await.unwrap();
    }
}
