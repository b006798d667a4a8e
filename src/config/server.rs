//! `[server]`: the listeners, their request and connection limits, shedding,
//! cold admission and the shutdown sequence. Keys: docs/configuration.md.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::check::{Checks as _, MAX_WAIT_MS};
use super::error::Mistake;
use super::units;

/// The most `server.max_connections` may say (and the cap when the open-files
/// limit is unlimited).
pub const MAX_CONNECTIONS: usize = 1_000_000;

/// Every field is a plain value, so the section is `Copy`: the routers' states
/// hold it whole, and the JSON extractor takes its body limit from there.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub public_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    #[serde(default)]
    pub probe_addr: Option<SocketAddr>,
    pub max_body_bytes: usize,
    pub max_body_buffer_bytes: usize,
    pub max_body_buffer_per_client_bytes: usize,
    pub max_snapshot_bytes: usize,
    pub max_snapshot_uploads: usize,
    #[serde(
        rename = "snapshot_body_timeout_ms",
        deserialize_with = "units::millis"
    )]
    pub snapshot_body_timeout: Duration,
    #[serde(rename = "shutdown_pause_ms", deserialize_with = "units::millis")]
    pub shutdown_pause: Duration,
    #[serde(rename = "drain_timeout_ms", deserialize_with = "units::millis")]
    pub drain_timeout: Duration,
    pub max_in_flight: usize,
    pub max_connections: usize,
    #[serde(rename = "max_queue_delay_ms", deserialize_with = "units::millis")]
    pub max_queue_delay: Duration,
    /// Read it through `Config::request_deadline`, which fills in `None`.
    #[serde(
        default,
        rename = "request_deadline_ms",
        deserialize_with = "units::optional_millis"
    )]
    pub request_deadline: Option<Duration>,
    pub max_header_bytes: usize,
    #[serde(rename = "header_read_timeout_ms", deserialize_with = "units::millis")]
    pub header_read_timeout: Duration,
    #[serde(rename = "body_read_timeout_ms", deserialize_with = "units::millis")]
    pub body_read_timeout: Duration,
}

impl ServerConfig {
    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        found.range("server.max_body_bytes", self.max_body_bytes, 1..=1 << 30);
        found.range_noting(
            "server.max_body_buffer_bytes",
            self.max_body_buffer_bytes,
            self.max_body_bytes..=1 << 40,
            "at least server.max_body_bytes, so one body of that size fits",
        );
        found.range_noting(
            "server.max_body_buffer_per_client_bytes",
            self.max_body_buffer_per_client_bytes,
            self.max_body_bytes..=self.max_body_buffer_bytes,
            "at least server.max_body_bytes, so one body of that size fits, \
             at most server.max_body_buffer_bytes",
        );
        found.range_noting(
            "server.max_snapshot_bytes",
            self.max_snapshot_bytes,
            self.max_body_bytes..=1 << 34,
            "at least server.max_body_bytes",
        );
        found.range(
            "server.max_header_bytes",
            self.max_header_bytes,
            4096..=1 << 20,
        );
        found.range(
            "server.max_snapshot_uploads",
            self.max_snapshot_uploads,
            1..=64,
        );
        found.range_noting(
            "server.snapshot_body_timeout_ms",
            self.snapshot_body_timeout.as_millis(),
            self.body_read_timeout.as_millis()..=MAX_WAIT_MS.into(),
            "at least server.body_read_timeout_ms",
        );
        found.range_noting(
            "server.max_connections",
            self.max_connections,
            0..=MAX_CONNECTIONS,
            "0: derived from the open-files limit",
        );
        found.range("server.max_in_flight", self.max_in_flight, 1..=1_000_000);
        found.range_noting(
            "server.max_queue_delay_ms",
            self.max_queue_delay.as_millis(),
            0..=MAX_WAIT_MS.into(),
            "0: never shed uncached requests for waiting",
        );
        found.range(
            "server.shutdown_pause_ms",
            self.shutdown_pause.as_millis(),
            0..=MAX_WAIT_MS.into(),
        );
        for (key, value) in [
            ("server.drain_timeout_ms", self.drain_timeout),
            ("server.header_read_timeout_ms", self.header_read_timeout),
            ("server.body_read_timeout_ms", self.body_read_timeout),
        ] {
            found.range(key, value.as_millis(), 1..=MAX_WAIT_MS.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{assert_refused, assert_refused_keys};

    #[test]
    fn server_sizes_and_waits_are_bounded() {
        let max = "9223372036854775807";
        assert_refused_keys(&[
            ("server", "max_body_bytes", max),
            ("server", "max_body_buffer_bytes", "1048575"),
            ("server", "max_body_buffer_bytes", max),
            ("server", "max_body_buffer_per_client_bytes", "1048575"),
            ("server", "max_body_buffer_per_client_bytes", "67108865"),
            ("server", "max_snapshot_bytes", max),
            ("server", "max_in_flight", max),
            ("server", "max_connections", "1000001"),
            ("server", "shutdown_pause_ms", max),
            ("server", "drain_timeout_ms", "0"),
            ("server", "max_snapshot_uploads", "0"),
            ("server", "snapshot_body_timeout_ms", max),
            ("server", "request_deadline_ms", max),
        ]);
        assert_refused(&[(
            "[server]\nbody_read_timeout_ms = 20000\nsnapshot_body_timeout_ms = 10000",
            "server.snapshot_body_timeout_ms",
        )]);
    }
}
