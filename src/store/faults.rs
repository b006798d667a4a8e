//! Faults a whole-app test can inject into the store, compiled only with the
//! `test-faults` cargo feature (`crate::upstream::faults` says why a feature,
//! and how it stays out of the release binary): a disk that stalls.
//!
//! SQLite's busy timeout bounds a wait for another connection's lock, not a
//! read, a write or an fsync on a disk that stopped answering; only the
//! gateway's own bound on the call (`pool::Backend::bounded`) ends such a
//! call. A test cannot stall a real disk under one file, so a status write
//! stalls here instead: inside its write transaction, after its first write,
//! holding SQLite's write lock, and it never returns. Given up, its future is
//! dropped and sqlx rolls the transaction back.
//!
//! The trigger is the version the write carries: a delta with an item at a
//! version in [`STALLING_VERSIONS`], or a snapshot at one.

use std::ops::RangeInclusive;

/// Versions whose status writes stall for ever. Far above any version the
/// tests use otherwise.
pub const STALLING_VERSIONS: RangeInclusive<u64> = 9_000_000_000..=9_000_000_999;

/// Never returns when `version` is in [`STALLING_VERSIONS`].
pub(super) async fn stall_at(version: u64) {
    if STALLING_VERSIONS.contains(&version) {
        std::future::pending::<()>().await;
    }
}
