//! The replica's wall clock, read in one place: the budgets' windows, the
//! reveal log's times and the status sync's lag all count from the Unix epoch
//! by this clock. Replicas agree on such times as far as their clocks do; what
//! needs only elapsed time within one process uses `Instant` instead.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The time since the Unix epoch by this replica's wall clock; zero for a clock
/// set before the epoch.
pub fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}
