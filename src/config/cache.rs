//! `[cache.<source>]`: each source's cache (size, TTLs, stale window, refresh ahead).

use std::time::Duration;

use serde::Deserialize;

use super::check::Checks as _;
use super::error::Mistake;
use super::units;
use crate::domain::Source;

/// A week: the longest TTL or stale window.
const MAX_TTL_S: u64 = 7 * 86_400;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachesConfig {
    pub real_phone: CacheConfig,
    pub anonymous: CacheConfig,
    pub calltracking: CacheConfig,
}

impl CachesConfig {
    pub fn of(&self, source: Source) -> &CacheConfig {
        match source {
            Source::Anonymous => &self.anonymous,
            Source::Calltracking => &self.calltracking,
            Source::RealPhone => &self.real_phone,
        }
    }

    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        self.real_phone.validate("cache.real_phone", found);
        self.anonymous.validate("cache.anonymous", found);
        self.calltracking.validate("cache.calltracking", found);
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    pub capacity: u64,
    #[serde(rename = "ttl_s", deserialize_with = "units::seconds")]
    pub ttl: Duration,
    #[serde(rename = "negative_ttl_s", deserialize_with = "units::seconds")]
    pub negative_ttl: Duration,
    #[serde(rename = "max_stale_s", deserialize_with = "units::seconds")]
    pub max_stale: Duration,
    /// `None`: a tenth of the TTL (see [`CacheConfig::refresh_ahead`]).
    #[serde(
        default,
        rename = "refresh_ahead_s",
        deserialize_with = "units::optional_seconds"
    )]
    pub refresh_ahead: Option<Duration>,
}

impl CacheConfig {
    /// How long before expiry a hit refreshes an entry in the background:
    /// `refresh_ahead_s`, by default a tenth of the TTL; zero turns it off.
    pub fn refresh_ahead(&self) -> Duration {
        self.refresh_ahead.unwrap_or(self.ttl / 10)
    }

    fn validate(&self, section: &str, found: &mut Vec<Mistake>) {
        // 10^8 entries is about 5.6 GB at the measured 56 B an entry.
        found.range(
            &format!("{section}.capacity"),
            self.capacity,
            1..=100_000_000,
        );
        found.range(
            &format!("{section}.ttl_s"),
            self.ttl.as_secs(),
            1..=MAX_TTL_S,
        );
        found.range(
            &format!("{section}.negative_ttl_s"),
            self.negative_ttl.as_secs(),
            1..=MAX_TTL_S,
        );
        found.range(
            &format!("{section}.max_stale_s"),
            self.max_stale.as_secs(),
            0..=MAX_TTL_S,
        );
        if let Some(ahead) = self.refresh_ahead {
            // Saturating: a ttl_s of 0 is its own mistake, found above.
            found.range_noting(
                &format!("{section}.refresh_ahead_s"),
                ahead.as_secs(),
                0..=self.ttl.as_secs().saturating_sub(1),
                "below ttl_s, or every hit would refresh",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::Config;
    use crate::config::tests::{assert_refused_keys, error_of};

    #[test]
    fn refresh_ahead_defaults_to_a_tenth_of_the_ttl() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.cache.real_phone.refresh_ahead(), Duration::from_secs(90));
        assert_eq!(c.cache.anonymous.refresh_ahead(), Duration::from_secs(30));
        let c = Config::from_toml("[cache.calltracking]\nrefresh_ahead_s = 0").unwrap();
        assert_eq!(c.cache.calltracking.refresh_ahead(), Duration::ZERO);
        let e = error_of("[cache.real_phone]\nttl_s = 60\nrefresh_ahead_s = 60");
        assert!(e.contains("cache.real_phone.refresh_ahead_s"), "{e}");
    }

    #[test]
    fn cache_sizes_and_ttls_are_bounded() {
        assert_refused_keys(&[
            ("cache.real_phone", "capacity", "9223372036854775807"),
            ("cache.calltracking", "max_stale_s", "9223372036854775807"),
            ("cache.anonymous", "ttl_s", "0"),
        ]);
    }
}
