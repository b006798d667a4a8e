//! `[upstreams]` and `[upstreams.<name>]`: each upstream's address, timeout,
//! `on_error` and bounds on calls in flight. Keys: docs/configuration.md.

use std::time::Duration;

use serde::Deserialize;

use super::check::{Checks as _, parse_url};
use super::error::{Mistake, invalid};
use super::status_feed::StatusFeedConfig;
use super::units;
use crate::domain::{OnError, Source, Sources};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamsConfig {
    #[serde(rename = "lost_time_tolerance_ms", deserialize_with = "units::millis")]
    pub lost_time_tolerance: Duration,
    #[serde(rename = "pool_idle_timeout_ms", deserialize_with = "units::millis")]
    pub pool_idle_timeout: Duration,
    pub real_phone: UpstreamConfig,
    pub anonymous: UpstreamConfig,
    pub calltracking: CalltrackingUpstreamConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub base_url: String,
    #[serde(rename = "timeout_ms", deserialize_with = "units::millis")]
    pub timeout: Duration,
    pub on_error: OnError,
    /// Read it through [`UpstreamConfig::max_in_flight_or`].
    pub max_in_flight: usize,
    /// Read it through [`UpstreamConfig::max_in_flight_per_seller_or`].
    pub max_in_flight_per_seller: usize,
    pub max_in_flight_per_request: usize,
    pub adaptive_limit: bool,
    pub min_in_flight: usize,
    pub latency_tolerance: f64,
}

impl UpstreamConfig {
    /// Calls in flight allowed to this upstream: its `max_in_flight`, or
    /// `server_max_in_flight` when that is 0.
    pub fn max_in_flight_or(&self, server_max_in_flight: usize) -> usize {
        match self.max_in_flight {
            0 => server_max_in_flight,
            n => n,
        }
    }

    /// Calls in flight allowed to this upstream about one seller, under its
    /// resolved `max_in_flight`: `max_in_flight_per_seller`, or when that is 0,
    /// `need` ([`seller_need`]) within an eighth of `max_in_flight`, at least 1.
    pub fn max_in_flight_per_seller_or(&self, max_in_flight: usize, need: usize) -> usize {
        match self.max_in_flight_per_seller {
            0 => need.min(max_in_flight / 8).max(1),
            n => n,
        }
    }

    fn validate(&self, section: &str, found: &mut Vec<Mistake>) {
        found.extend(validate_base_url(&format!("{section}.base_url"), &self.base_url).err());
        found.range(
            &format!("{section}.timeout_ms"),
            self.timeout.as_millis(),
            1..=60_000,
        );
        found.range_noting(
            &format!("{section}.max_in_flight"),
            self.max_in_flight,
            0..=1_000_000,
            "0: server.max_in_flight",
        );
        found.range_noting(
            &format!("{section}.max_in_flight_per_seller"),
            self.max_in_flight_per_seller,
            0..=1_000_000,
            "0: the need-sized default",
        );
        found.range(
            &format!("{section}.max_in_flight_per_request"),
            self.max_in_flight_per_request,
            1..=1_000,
        );
        found.range(
            &format!("{section}.min_in_flight"),
            self.min_in_flight,
            1..=1_000_000,
        );
        if !(1.1..=100.0).contains(&self.latency_tolerance) {
            found.push(invalid(
                format!("{section}.latency_tolerance"),
                "must be from 1.1 to 100",
            ));
        }
    }
}

/// The default bound per seller of `source`'s upstream, sized to what one
/// seller needs (docs/adaptive-limit.md, "Per-seller bounds").
pub fn seller_need(source: Source) -> usize {
    match source {
        Source::RealPhone | Source::Anonymous => 16,
        Source::Calltracking => 8,
    }
}

/// The call-tracking upstream: an upstream like the others, and its status feed.
///
/// Read through [`CalltrackingKeys`], not `#[serde(flatten)]`: serde buffers
/// flattened keys, so a mistake in one would lose its key in the message.
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "CalltrackingKeys")]
pub struct CalltrackingUpstreamConfig {
    pub upstream: UpstreamConfig,
    pub status_feed: StatusFeedConfig,
}

/// `[upstreams.calltracking]` as written: [`UpstreamConfig`]'s keys and
/// `status_feed`, each deserialized where figment can name it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CalltrackingKeys {
    base_url: String,
    #[serde(rename = "timeout_ms", deserialize_with = "units::millis")]
    timeout: Duration,
    on_error: OnError,
    max_in_flight: usize,
    max_in_flight_per_seller: usize,
    max_in_flight_per_request: usize,
    adaptive_limit: bool,
    min_in_flight: usize,
    latency_tolerance: f64,
    status_feed: StatusFeedConfig,
}

impl From<CalltrackingKeys> for CalltrackingUpstreamConfig {
    fn from(keys: CalltrackingKeys) -> Self {
        CalltrackingUpstreamConfig {
            upstream: UpstreamConfig {
                base_url: keys.base_url,
                timeout: keys.timeout,
                on_error: keys.on_error,
                max_in_flight: keys.max_in_flight,
                max_in_flight_per_seller: keys.max_in_flight_per_seller,
                max_in_flight_per_request: keys.max_in_flight_per_request,
                adaptive_limit: keys.adaptive_limit,
                min_in_flight: keys.min_in_flight,
                latency_tolerance: keys.latency_tolerance,
            },
            status_feed: keys.status_feed,
        }
    }
}

impl UpstreamsConfig {
    pub fn of(&self, source: Source) -> &UpstreamConfig {
        match source {
            Source::Anonymous => &self.anonymous,
            Source::Calltracking => &self.calltracking.upstream,
            Source::RealPhone => &self.real_phone,
        }
    }

    /// Each source's `on_error`: what the selection rules do when it fails.
    pub fn policies(&self) -> Sources<OnError> {
        Sources::from_fn(|source| self.of(source).on_error)
    }

    /// max(anonymous, real_phone + calltracking) of the configured timeouts: how
    /// long a request may need when every call answers within its own timeout.
    pub fn longest_path(&self) -> Duration {
        self.anonymous
            .timeout
            .max(self.real_phone.timeout + self.calltracking.upstream.timeout)
    }

    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        found.range(
            "upstreams.lost_time_tolerance_ms",
            self.lost_time_tolerance.as_millis(),
            1..=10_000,
        );
        found.range(
            "upstreams.pool_idle_timeout_ms",
            self.pool_idle_timeout.as_millis(),
            1..=600_000,
        );
        self.real_phone.validate("upstreams.real_phone", found);
        self.anonymous.validate("upstreams.anonymous", found);
        self.calltracking
            .upstream
            .validate("upstreams.calltracking", found);
        self.calltracking.status_feed.validate(found);
    }
}

fn validate_base_url(key: &str, url: &str) -> Result<(), Mistake> {
    // Plain ASCII: the client formats each call's URI onto this base and parses
    // it with `http::Uri`, which does no host mapping (upstream/mod.rs).
    let parsed = parse_url(
        key,
        url,
        &["http"],
        "must be an http:// URL (TLS to upstreams is left to the mesh)",
    )?;
    if parsed.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(invalid(key, "must not carry credentials"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::config::tests::{assert_refused_keys, error_of};

    #[test]
    fn the_calltracking_upstream_takes_the_common_keys_and_refuses_others() {
        let e = error_of("[upstreams.calltracking]\ntimeout_ms = 100\ntimeout = 100");
        assert!(e.contains("upstreams.calltracking.timeout:"), "{e}");
        assert!(e.contains("unknown field"), "{e}");
        assert_refused_keys(&[("upstreams.calltracking.status_feed", "enabeld", "true")]);
        assert_refused_keys(&[("upstreams.calltracking", "timeout_ms", "0")]);
        let c = Config::from_toml(
            "[upstreams.calltracking]\ntimeout_ms = 123\nmax_in_flight = 5\n\
             [upstreams.calltracking.status_feed]\nlimit = 9",
        )
        .unwrap();
        let calltracking = &c.upstreams.calltracking;
        assert_eq!(calltracking.upstream.timeout, Duration::from_millis(123));
        assert_eq!(calltracking.upstream.max_in_flight, 5);
        assert_eq!(calltracking.status_feed.limit, 9);
        assert!(std::ptr::eq(
            c.upstreams.of(Source::Calltracking),
            &calltracking.upstream
        ));
    }

    #[test]
    fn the_bound_per_seller_is_the_need_at_most_an_eighth_of_the_upstreams_unless_set() {
        let c = Config::from_toml(
            "[upstreams.calltracking]
max_in_flight = 64
             [upstreams.real_phone]
max_in_flight_per_seller = 3",
        )
        .unwrap();
        let calltracking = &c.upstreams.calltracking.upstream;
        assert_eq!(calltracking.max_in_flight_per_seller_or(64, 8), 8);
        assert_eq!(calltracking.max_in_flight_per_seller_or(4096, 8), 8);
        assert_eq!(calltracking.max_in_flight_per_seller_or(4096, 16), 16);
        assert_eq!(calltracking.max_in_flight_per_seller_or(4, 8), 1);
        let real_phone = &c.upstreams.real_phone;
        assert_eq!(real_phone.max_in_flight_per_seller_or(64, 16), 3);
        assert_refused_keys(&[("upstreams.anonymous", "max_in_flight_per_seller", "2000000")]);
    }

    #[test]
    fn base_urls_are_plain_http_with_a_host_and_nothing_after_the_path() {
        for good in [
            "http://127.0.0.1:9101",
            "http://real-phone/",
            "http://h:1/prefix",
        ] {
            assert!(validate_base_url("k", good).is_ok(), "{good}");
        }
        for bad in [
            "https://real-phone",
            "real-phone:9101",
            "http://",
            "http://h/?q=1",
            "http://h/#f",
            "http://user:secret@h",
            "http://тел.рф",
            "not a url",
        ] {
            let e = validate_base_url("upstreams.x.base_url", bad).unwrap_err();
            assert!(e.to_string().contains("upstreams.x.base_url"), "{bad}: {e}");
        }
    }

    #[test]
    fn upstream_concurrency_defaults_to_the_public_bound() {
        let c = Config::from_toml("[server]\nmax_in_flight = 64").unwrap();
        let public = c.server.max_in_flight;
        assert_eq!(c.upstreams.real_phone.max_in_flight_or(public), 64);
        let c = Config::from_toml("[upstreams.anonymous]\nmax_in_flight = 7").unwrap();
        let public = c.server.max_in_flight;
        assert_eq!(c.upstreams.anonymous.max_in_flight_or(public), 7);
        assert_eq!(c.upstreams.real_phone.max_in_flight_or(public), 4096);
    }

    #[test]
    fn upstream_bounds_are_bounded() {
        assert_refused_keys(&[
            (
                "upstreams.real_phone",
                "max_in_flight",
                "9223372036854775807",
            ),
            ("upstreams.calltracking", "max_in_flight_per_request", "0"),
            ("upstreams", "lost_time_tolerance_ms", "0"),
        ]);
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.upstreams.lost_time_tolerance, Duration::from_millis(30));
        for source in Source::ALL {
            assert_eq!(c.upstreams.of(source).max_in_flight_per_request, 16);
        }
    }
}
