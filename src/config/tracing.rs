//! `[tracing]`: distributed tracing (docs/tracing.md). W3C trace context is
//! always continued; spans are exported only when `otlp_endpoint` is set.

use serde::Deserialize;

use super::check::parse_url;
use super::error::{Mistake, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    pub otlp_endpoint: String,
    pub sample_ratio: f64,
}

impl TracingConfig {
    pub fn exports(&self) -> bool {
        !self.otlp_endpoint.is_empty()
    }

    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            // NaN lands here too.
            found.push(invalid(
                "tracing.sample_ratio",
                format!("must be in 0.0..=1.0, got {}", self.sample_ratio),
            ));
        }
        if self.exports() {
            found.extend(
                parse_url(
                    "tracing.otlp_endpoint",
                    &self.otlp_endpoint,
                    &["http", "https"],
                    "must be an http:// or https:// URL, or empty",
                )
                .err(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::config::tests::assert_refused_keys;

    #[test]
    fn tracing_is_off_by_default_and_its_endpoint_must_be_an_http_url() {
        let c = Config::from_toml("").unwrap();
        assert!(!c.tracing.exports());
        assert!((c.tracing.sample_ratio - 0.01).abs() < f64::EPSILON);
        for endpoint in [
            "http://otel-collector:4318",
            "https://collector.example/otlp/",
        ] {
            let c =
                Config::from_toml(&format!("[tracing]\notlp_endpoint = \"{endpoint}\"")).unwrap();
            assert!(c.tracing.exports());
        }
        assert_refused_keys(&[
            ("tracing", "otlp_endpoint", "\"otel-collector:4318\""),
            ("tracing", "otlp_endpoint", "\"grpc://collector:4317\""),
            ("tracing", "otlp_endpoint", "\"http://c:4318/?x=1\""),
            ("tracing", "otlp_endpoint", "\"not a url\""),
        ]);
    }

    #[test]
    fn the_sample_ratio_is_a_share() {
        assert_refused_keys(&[
            ("tracing", "sample_ratio", "1.5"),
            ("tracing", "sample_ratio", "-0.1"),
            ("tracing", "sample_ratio", "nan"),
        ]);
    }
}
