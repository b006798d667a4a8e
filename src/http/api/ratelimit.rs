//! Per-viewer rate limit on number reveals (docs/api.md), with `governor` (GCRA): a
//! viewer (`X-Viewer-Id`) may reveal `rate_limit.per_viewer_per_minute` numbers a
//! minute, in bursts up to that many. Checked before any cache or upstream work;
//! a batch costs one per item. Requests without the header are not limited.
//!
//! Memory: viewer ids are hashed (keyed, per process) to a `u64`, and a
//! background sweep every 10 s forgets viewers whose allowance is full again (idle
//! for up to a minute), so the table holds at most the viewers of the last minute.

use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::error::ApiError;
use crate::domain::Viewer;

/// The header the trusted backend sets to the buyer's id.
pub const VIEWER_HEADER: &str = "x-viewer-id";
/// How often idle viewers are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

pub struct ViewerLimiter {
    limiter: DefaultKeyedRateLimiter<u64>,
    hasher: foldhash::quality::RandomState,
    limited: metrics::Counter,
}

impl ViewerLimiter {
    /// `None` when the limit is off (0).
    pub fn new(per_minute: u32) -> Option<Arc<Self>> {
        let per_minute = NonZeroU32::new(per_minute)?;
        Some(Arc::new(ViewerLimiter {
            limiter: RateLimiter::keyed(Quota::per_minute(per_minute)),
            hasher: foldhash::quality::RandomState::default(),
            limited: metrics::counter!("phones_gateway_rate_limited_total"),
        }))
    }

    /// Takes `items` reveals from the viewer's allowance, or refuses with 429;
    /// a request without a viewer is not limited. The viewer is the one the
    /// route validated (`X-Viewer-Id`), not the raw header read again.
    ///
    /// # Errors
    /// `TooManyRequests` with the seconds until the allowance suffices.
    pub fn check(&self, viewer: Option<&Viewer>, items: usize) -> Result<(), ApiError> {
        let Some(viewer) = viewer else {
            return Ok(());
        };
        let key = self.hasher.hash_one(viewer.as_str().as_bytes());
        let n =
            NonZeroU32::new(u32::try_from(items).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
        let retry_after_s = match self.limiter.check_key_n(&key, n) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
            }
            // More items than a whole minute's allowance.
            Err(_) => 60,
        };
        self.limited.increment(1);
        Err(ApiError::TooManyRequests {
            retry_after_s: retry_after_s.max(1),
        })
    }

    /// Viewers currently remembered.
    pub fn len(&self) -> usize {
        self.limiter.len()
    }

    pub fn is_empty(&self) -> bool {
        self.limiter.is_empty()
    }

    /// Forgets idle viewers every 10 s; runs until aborted.
    pub async fn sweep(self: Arc<Self>) {
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
    }
}
