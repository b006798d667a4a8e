//! `[reveals]`: the reveal log's buffer, write interval, overflow and retention.

use std::time::Duration;

use serde::Deserialize;

use super::check::Checks as _;
use super::error::Mistake;
use super::units;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevealsConfig {
    pub enabled: bool,
    #[serde(rename = "flush_interval_ms", deserialize_with = "units::millis")]
    pub flush_interval: Duration,
    pub max_buffered: usize,
    pub on_overflow: OnOverflow,
    pub retention_days: u32,
}

/// What a full reveal buffer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnOverflow {
    /// Drop the reveal (counted) and show the number.
    Drop,
    /// Answer 503 rather than show a number that cannot be recorded.
    Refuse,
}

impl RevealsConfig {
    pub fn retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.retention_days) * 86_400)
    }

    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        found.range(
            "reveals.flush_interval_ms",
            self.flush_interval.as_millis(),
            10..=60_000,
        );
        found.range("reveals.max_buffered", self.max_buffered, 1..=100_000_000);
        found.range("reveals.retention_days", self.retention_days, 1..=3650);
    }
}
