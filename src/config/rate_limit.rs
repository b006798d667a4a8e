//! `[rate_limit]`: the viewer budgets (docs/budgets.md).

use std::time::Duration;

use serde::Deserialize;

use super::check::Checks as _;
use super::error::Mistake;
use super::units;

/// A plain value: the budgets hold it whole.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsConfig {
    pub per_viewer_per_minute: u32,
    pub per_viewer_per_day: u32,
    #[serde(rename = "exchange_interval_ms", deserialize_with = "units::millis")]
    pub exchange_interval: Duration,
}

impl BudgetsConfig {
    /// Whether any budget is on.
    pub fn enabled(&self) -> bool {
        self.per_viewer_per_minute > 0 || self.per_viewer_per_day > 0
    }

    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        found.range_noting(
            "rate_limit.per_viewer_per_minute",
            self.per_viewer_per_minute,
            0..=65_535,
            "a budget is for people; the ledgers count in 16 bits",
        );
        found.range_noting(
            "rate_limit.per_viewer_per_day",
            self.per_viewer_per_day,
            0..=65_535,
            "a budget is for people; the ledgers count in 16 bits",
        );
        found.range_noting(
            "rate_limit.exchange_interval_ms",
            self.exchange_interval.as_millis(),
            10..=750,
            "a viewer past a budget must be refused fleet-wide within 1 s",
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::assert_refused_keys;

    #[test]
    fn budgets_are_bounded() {
        assert_refused_keys(&[("rate_limit", "per_viewer_per_minute", "4294967295")]);
    }
}
