//! The replica's wall clock, read in one place; elapsed time within a process
//! uses tokio's `Instant`, or [`Stopwatch`] where wall time is meant.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The time since the Unix epoch by this replica's wall clock (zero before the epoch).
pub fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `std`'s monotonic clock, named once: clippy.toml bans it elsewhere, since the
/// service's clock is tokio's (paused in tests).
#[allow(
    clippy::disallowed_types,
    reason = "the one wall-time stopwatch: what really passed, also under a paused test clock"
)]
type Monotonic = std::time::Instant;

/// Elapsed wall time, where what really passed is meant whatever tokio's clock
/// says: a duration metric (also under a paused test clock), a log throttle on a
/// thread outside the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopwatch(Monotonic);

impl Stopwatch {
    pub fn start() -> Self {
        Stopwatch(Monotonic::now())
    }

    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}
