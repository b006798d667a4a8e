//! Time the gateway lost: how late its timers and tasks ran, as a running
//! total that an upstream call reads when it starts and when its timer fires.
//!
//! "No answer within the timeout" is the upstream's verdict only for the time
//! the upstream had (docs/rules.md, "Whose time"). A process that is paused
//! (SIGSTOP, a VM pause) or throttled (a container's CPU quota used up) stops
//! reading its sockets while its clock runs on: an answer can sit in the
//! socket while the call's timer runs out, and the timer then fires before the
//! read. So a call's timer that fires asks how much time was lost meanwhile,
//! from two sources, and takes the larger:
//!
//! - [`LostTime`]'s running total ([`LostTime::mark`]), fed by a probe task
//!   (`resolve::admission`) that sleeps 5 ms at a time and adds how late it woke, less tokio's millisecond of
//!   granularity: what every ready task waited before a worker got to it;
//! - the call's own timer, how late it fired: after a pause, the call's timer
//!   can run before the probe's does.
//!
//! To that the call adds the time it spent inside the gateway before the
//! upstream was asked (its host lookup). Lost time above
//! `upstreams.lost_time_tolerance_ms` is given back once (the timer is re-armed
//! for it: the answer is often already in the socket). A call that loses more
//! than half of that extension again (and more than the tolerance: the gateway
//! paused again) is undecided
//! ([`UpstreamError::LostTime`](super::UpstreamError::LostTime)); one that did
//! not had its timeout of the gateway's attention, within what a busy
//! machine's scheduling takes (a machine that loses a fifth of its time loses
//! a fifth of the extension too), and its timeout is the upstream's.
//!
//! Every late wake is observed in `phones_gateway_lost_time_seconds` (a
//! histogram: its `_sum` rate is the share of time lost).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The process's lost time so far, and the tolerance a call allows.
pub struct LostTime {
    /// Microseconds lost since start, as the probe measured them.
    total_us: AtomicU64,
    /// `upstreams.lost_time_tolerance_ms`.
    tolerance: Duration,
    histogram: metrics::Histogram,
}

impl LostTime {
    pub fn new(tolerance: Duration) -> Self {
        LostTime {
            total_us: AtomicU64::new(0),
            tolerance,
            histogram: metrics::histogram!("phones_gateway_lost_time_seconds"),
        }
    }

    /// Adds `late`, how late a probe woke beyond the timer's granularity.
    pub fn add(&self, late: Duration) {
        if late.is_zero() {
            return;
        }
        let micros = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.total_us.fetch_add(micros, Ordering::Relaxed);
        self.histogram.record(late.as_secs_f64());
    }

    /// The running total, to compare two readings with [`LostTime::since`].
    pub fn mark(&self) -> Mark {
        Mark(self.total_us.load(Ordering::Relaxed))
    }

    /// Time lost since `mark` was read.
    pub fn since(&self, mark: Mark) -> Duration {
        Duration::from_micros(self.mark().0.saturating_sub(mark.0))
    }

    /// Whether a call that lost `lost` lost more than it may without being
    /// given it back.
    pub fn beyond_tolerance(&self, lost: Duration) -> bool {
        lost > self.tolerance
    }
}

/// A reading of the running total of lost time.
#[derive(Debug, Clone, Copy)]
pub struct Mark(u64);

/// How late a timer due at `due` fired at `now`, less the millisecond tokio's
/// timer takes at best.
pub fn lateness(due: tokio::time::Instant, now: tokio::time::Instant) -> Duration {
    now.saturating_duration_since(due)
        .saturating_sub(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_counts_late_wakes_and_a_mark_reads_what_came_after() {
        let lost = LostTime::new(Duration::from_millis(30));
        lost.add(Duration::from_millis(5));
        let mark = lost.mark();
        assert_eq!(lost.since(mark), Duration::ZERO);
        lost.add(Duration::ZERO);
        lost.add(Duration::from_millis(400));
        lost.add(Duration::from_micros(250));
        assert_eq!(lost.since(mark), Duration::from_micros(400_250));
        assert!(!lost.beyond_tolerance(Duration::from_millis(30)));
        assert!(lost.beyond_tolerance(Duration::from_micros(30_001)));
    }

    #[tokio::test(start_paused = true)]
    async fn lateness_leaves_out_the_timers_millisecond() {
        let due = tokio::time::Instant::now();
        assert_eq!(lateness(due, due), Duration::ZERO);
        assert_eq!(
            lateness(due, due + Duration::from_millis(1)),
            Duration::ZERO
        );
        assert_eq!(
            lateness(due, due + Duration::from_millis(151)),
            Duration::from_millis(150)
        );
        assert_eq!(lateness(due + Duration::from_secs(1), due), Duration::ZERO);
    }
}
