//! `[upstreams.calltracking.status_feed]`: polling the status feed, and its lease.

use std::time::Duration;

use serde::Deserialize;

use super::check::Checks as _;
use super::error::Mistake;
use super::units;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusFeedConfig {
    pub enabled: bool,
    #[serde(rename = "interval_ms", deserialize_with = "units::millis")]
    pub interval: Duration,
    pub limit: u32,
    #[serde(rename = "lease_ttl_ms", deserialize_with = "units::millis")]
    pub lease_ttl: Duration,
}

impl StatusFeedConfig {
    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        found.range(
            "upstreams.calltracking.status_feed.interval_ms",
            self.interval.as_millis(),
            1..=3_600_000,
        );
        found.range(
            "upstreams.calltracking.status_feed.limit",
            self.limit,
            1..=10_000,
        );
        found.range_noting(
            "upstreams.calltracking.status_feed.lease_ttl_ms",
            self.lease_ttl.as_millis(),
            300..=6_000,
            "a stopped leader is replaced within 10 s",
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::assert_refused_keys;

    #[test]
    fn the_feeds_interval_and_lease_are_bounded() {
        let feed = "upstreams.calltracking.status_feed";
        assert_refused_keys(&[
            (feed, "interval_ms", "9223372036854775807"),
            (feed, "lease_ttl_ms", "100"),
            (feed, "lease_ttl_ms", "10000"),
        ]);
    }
}
