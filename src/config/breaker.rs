//! `[breaker]`: each upstream client's circuit breaker (docs/configuration.md;
//! why distinct sellers: `upstream::breaker`). `min_sellers` and `min_requests`
//! are at most 32, the size of a window's set.

use std::time::Duration;

use serde::Deserialize;

use super::check::Checks as _;
use super::error::{Mistake, invalid};
use super::units;

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    pub enabled: bool,
    pub consecutive_failures: u32,
    pub failure_ratio: f64,
    pub min_calls: u32,
    pub min_sellers: u32,
    pub min_requests: u32,
    #[serde(rename = "window_s", deserialize_with = "units::seconds")]
    pub window: Duration,
    #[serde(rename = "open_ms", deserialize_with = "units::millis")]
    pub open: Duration,
}

impl BreakerConfig {
    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        found.range(
            "breaker.consecutive_failures",
            self.consecutive_failures,
            1..=1_000_000,
        );
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            found.push(invalid("breaker.failure_ratio", "must be in (0, 1]"));
        }
        found.range("breaker.min_calls", self.min_calls, 1..=1_000_000);
        found.range("breaker.min_sellers", self.min_sellers, 1..=32);
        found.range("breaker.min_requests", self.min_requests, 1..=32);
        found.range("breaker.window_s", self.window.as_secs(), 1..=3600);
        found.range("breaker.open_ms", self.open.as_millis(), 1..=3_600_000);
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::assert_refused_keys;

    #[test]
    fn breaker_values_are_bounded() {
        assert_refused_keys(&[
            ("breaker", "window_s", "9223372036854775807"),
            ("breaker", "open_ms", "9223372036854775807"),
            ("breaker", "min_calls", "0"),
            ("breaker", "min_sellers", "0"),
            ("breaker", "min_sellers", "33"),
            ("breaker", "min_requests", "0"),
            ("breaker", "min_requests", "33"),
            ("breaker", "consecutive_failures", "0"),
        ]);
    }
}
