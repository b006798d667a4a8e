//! The reveal log (who was shown which seller's number) and the per-ad counts:
//! buffered in memory, written in batches by [`flush`], old rows deleted by
//! [`retention`] (docs/reveal-log.md). [`Reveals::record`] is all the request
//! path does: one send on an unbounded channel (lock-free for senders) and one
//! atomic add, no lock a request can wait on.

pub mod flush;
pub mod retention;

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc;

use crate::config::{OnOverflow, RevealsConfig};
use crate::domain::{Reveal, wall_clock};
use crate::telemetry::write_gauge;

/// The recording side of the reveal log; cheap to clone.
#[derive(Clone)]
pub struct Reveals {
    inner: Arc<Inner>,
}

struct Inner {
    sender: mpsc::UnboundedSender<Reveal>,
    /// Taken once by the flush task.
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Reveal>>>,
    /// Reveals in memory not yet written (in the channel or a failed batch).
    buffered: AtomicUsize,
    /// When the oldest reveal held unwritten was recorded (microseconds since
    /// the epoch; 0: none); kept while writes fail, so a hung database shows.
    oldest_unwritten_us: AtomicI64,
    /// `[reveals]`: `max_buffered` and `on_overflow` are read here.
    config: RevealsConfig,
    metrics: Metrics,
}

struct Metrics {
    recorded: metrics::Counter,
    dropped: metrics::Counter,
    refused: metrics::Counter,
}

/// The buffer is full and `on_overflow = "refuse"`: do not show the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the reveal log is full")]
pub struct Full;

impl Reveals {
    pub fn new(config: &RevealsConfig) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Reveals {
            inner: Arc::new(Inner {
                sender,
                receiver: Mutex::new(Some(receiver)),
                buffered: AtomicUsize::new(0),
                oldest_unwritten_us: AtomicI64::new(0),
                config: config.clone(),
                metrics: Metrics {
                    recorded: metrics::counter!("phones_gateway_reveals_recorded_total"),
                    dropped: metrics::counter!("phones_gateway_reveals_dropped_total"),
                    refused: metrics::counter!("phones_gateway_reveals_refused_total"),
                },
            }),
        }
    }

    /// Records one number shown; [`Full`] when the buffer is full and
    /// `on_overflow = "refuse"`: the caller must not show the number.
    pub fn record(&self, reveal: Reveal) -> Result<(), Full> {
        let inner = &*self.inner;
        // Taken before it is checked, so racing recorders cannot overshoot.
        let before = inner.buffered.fetch_add(1, Ordering::AcqRel);
        if before >= inner.config.max_buffered {
            inner.buffered.fetch_sub(1, Ordering::AcqRel);
            return match inner.config.on_overflow {
                OnOverflow::Drop => {
                    inner.metrics.dropped.increment(1);
                    Ok(())
                }
                OnOverflow::Refuse => {
                    inner.metrics.refused.increment(1);
                    Err(Full)
                }
            };
        }
        if inner.sender.send(reveal).is_err() {
            // The flush task is gone (the app is stopping): nothing will write it.
            inner.buffered.fetch_sub(1, Ordering::AcqRel);
            inner.metrics.dropped.increment(1);
            return Ok(());
        }
        inner.metrics.recorded.increment(1);
        Ok(())
    }

    /// Reveals in memory, not yet written.
    pub fn buffered(&self) -> usize {
        self.inner.buffered.load(Ordering::Acquire)
    }

    /// How long the oldest reveal being written, or waiting after a failed
    /// write, has been unwritten; zero when the last write succeeded.
    pub fn oldest_unwritten(&self) -> std::time::Duration {
        match self.inner.oldest_unwritten_us.load(Ordering::Acquire) {
            0 => std::time::Duration::ZERO,
            at => std::time::Duration::from_micros(u64::try_from(now_us() - at).unwrap_or(0)),
        }
    }

    /// Appends the buffer's gauges to its app's `/metrics` text, as they are now.
    pub fn render_gauges(&self, out: &mut String) {
        let oldest = self.oldest_unwritten().as_secs_f64();
        for (name, value) in [
            ("phones_gateway_reveals_buffered", self.buffered() as f64),
            ("phones_gateway_reveals_oldest_unwritten_seconds", oldest),
        ] {
            write_gauge(out, name, [(&[][..], value)]);
        }
    }

    /// The receiving end, once: the flush task owns it.
    fn take_receiver(&self) -> Option<mpsc::UnboundedReceiver<Reveal>> {
        self.inner
            .receiver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// A write of reveals, the oldest recorded at `at_us`, starts.
    fn writing(&self, at_us: i64) {
        // 0 means none: a clock at the epoch still counts as held.
        self.inner
            .oldest_unwritten_us
            .store(at_us.max(1), Ordering::Release);
    }

    /// `n` reveals left memory (written).
    fn written(&self, n: usize) {
        self.inner.oldest_unwritten_us.store(0, Ordering::Release);
        self.inner.buffered.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> i64 {
    i64::try_from(wall_clock::since_epoch().as_micros())
        .unwrap_or(i64::MAX)
        .saturating_add(test_clock::skew_us())
}

/// This replica's clock set off by a test, to play a replica whose clock is
/// wrong; per thread, so tests beside each other do not see it.
#[cfg(test)]
pub(crate) mod test_clock {
    use std::cell::Cell;

    thread_local! {
        static SKEW_US: Cell<i64> = const { Cell::new(0) };
    }

    pub(crate) fn skew_us() -> i64 {
        SKEW_US.with(Cell::get)
    }

    pub(crate) fn set_skew_us(skew: i64) {
        SKEW_US.with(|s| s.set(skew));
    }
}

#[cfg(not(test))]
mod test_clock {
    pub(super) const fn skew_us() -> i64 {
        0
    }
}
