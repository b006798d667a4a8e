//! Faults a whole-app test can inject into the store, compiled only with the
//! `test-faults` cargo feature (`crate::upstream::faults` says why): a status
//! write stalls, holding SQLite's write lock, so that only the client's bound
//! (`pool::Backend::bounded`) ends it.

use std::ops::RangeInclusive;

/// Versions whose status writes stall for ever; far above any other test's.
pub const STALLING_VERSIONS: RangeInclusive<u64> = 9_000_000_000..=9_000_000_999;

/// Never returns when `version` is in [`STALLING_VERSIONS`].
pub(super) async fn stall_at(version: u64) {
    if STALLING_VERSIONS.contains(&version) {
        std::future::pending::<()>().await;
    }
}
