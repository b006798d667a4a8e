//! Faults a whole-app test can inject, compiled only with the `test-faults`
//! cargo feature: a fetch that panics.
//!
//! Why a feature, and how it is on for tests only: the feature is off by
//! default, and `Cargo.toml` enables it through a dev-dependency of the crate on
//! itself (`phones-gateway = { path = ".", features = ["test-faults"] }`). Cargo
//! (resolver 2) turns a dev-dependency's features on only for the targets that
//! need dev-dependencies (tests, benches, examples), so `cargo test
//! --all-targets` builds the library with it and `cargo build --release` (the
//! binary that ships) builds it without: there is no such code in the release
//! binary to trigger, not even a dormant branch. An environment variable or a
//! config key would leave a panic one setting away in production; a
//! `#[cfg(test)]` hook would not reach the whole-app tests, which link the
//! library built without `cfg(test)`.
//!
//! The trigger is the seller a test asks about: any upstream call about a
//! seller in [`PANICKING_SELLERS`] panics once its places are taken and the
//! breaker let it through, as a bug inside the call would.

use std::ops::RangeInclusive;

use crate::domain::UserId;

/// Sellers whose every upstream call panics. Far above any id the tests use
/// otherwise.
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
