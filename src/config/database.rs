//! `[database]`: the store, its pool, and every call's bounds (docs/configuration.md).

use std::time::Duration;

use serde::Deserialize;

use super::check::Checks as _;
use super::error::{Mistake, invalid};
use super::secret::Secret;
use super::units;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub url: Secret,
    pub direct_url: Secret,
    pub max_connections: u32,
    pub migrate_on_start: bool,
    pub listen: bool,
    #[serde(rename = "sync_interval_ms", deserialize_with = "units::millis")]
    pub sync_interval: Duration,
    #[serde(rename = "statement_timeout_ms", deserialize_with = "units::millis")]
    pub statement_timeout: Duration,
    #[serde(rename = "lock_timeout_ms", deserialize_with = "units::millis")]
    pub lock_timeout: Duration,
}

impl DatabaseConfig {
    /// Where migrations and LISTEN reach PostgreSQL itself.
    pub fn direct_url(&self) -> Option<&str> {
        Some(self.direct_url.expose()).filter(|u| !u.is_empty())
    }

    /// Whether this replica needs a PostgreSQL session of its own: migrations
    /// at start, or LISTEN. (Feed leadership is a lease row: it needs none.)
    pub fn needs_session(&self) -> bool {
        self.migrate_on_start || self.listen
    }

    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        let url = self.url.expose();
        if !["sqlite:", "postgres:", "postgresql:"]
            .iter()
            .any(|scheme| url.starts_with(scheme))
        {
            found.push(invalid(
                "database.url",
                "must start with sqlite: or postgres:",
            ));
        }
        let direct = self.direct_url.expose();
        if !direct.is_empty() {
            if !url.starts_with("postgres") {
                found.push(invalid(
                    "database.direct_url",
                    "is for PostgreSQL behind a pooler; database.url is not PostgreSQL",
                ));
            } else if !["postgres:", "postgresql:"]
                .iter()
                .any(|scheme| direct.starts_with(scheme))
            {
                found.push(invalid("database.direct_url", "must start with postgres:"));
            }
        }
        found.range("database.max_connections", self.max_connections, 1..=1000);
        found.range(
            "database.sync_interval_ms",
            self.sync_interval.as_millis(),
            10..=60_000,
        );
        found.range(
            "database.statement_timeout_ms",
            self.statement_timeout.as_millis(),
            100..=3_600_000,
        );
        found.range_noting(
            "database.lock_timeout_ms",
            self.lock_timeout.as_millis(),
            10..=self.statement_timeout.as_millis().max(10),
            "at most database.statement_timeout_ms",
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{assert_refused, assert_refused_keys};

    #[test]
    fn database_waits_are_bounded() {
        assert_refused_keys(&[
            ("database", "sync_interval_ms", "9223372036854775807"),
            ("database", "statement_timeout_ms", "0"),
            ("database", "statement_timeout_ms", "9223372036854775807"),
            ("database", "lock_timeout_ms", "5"),
        ]);
        assert_refused(&[(
            "[database]\nstatement_timeout_ms = 1000\nlock_timeout_ms = 2000",
            "database.lock_timeout_ms",
        )]);
    }
}
