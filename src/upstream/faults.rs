//! Faults a whole-app test can inject, compiled only with the `test-faults`
//! cargo feature: a fetch that panics. The feature is on only through
//! `Cargo.toml`'s dev-dependency of the crate on itself, so the release binary
//! holds no such code; a `#[cfg(test)]` hook would not reach whole-app tests.

use std::ops::RangeInclusive;

use crate::domain::UserId;

/// Sellers whose every upstream call panics; far above the tests' other ids.
pub const PANICKING_SELLERS: RangeInclusive<u64> = 9_000_000_000..=9_000_000_999;

/// Panics when the call is about a seller in [`PANICKING_SELLERS`].
pub(super) fn panic_for(seller: Option<UserId>) {
    if let Some(seller) = seller {
        assert!(
            !PANICKING_SELLERS.contains(&seller.get()),
            "test-faults: a fetch about seller {seller} panics"
        );
    }
}
