//! The configuration tree: built-in defaults (`config/default.toml`, compiled in),
//! an optional file, then `PHONES_GATEWAY__` environment variables; then validation.
//!
//! [`Config::from_figment`] is pure so tests feed it strings; only
//! [`Config::load`] reads files and the environment.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::Deserialize;

/// The documented defaults, key by key.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");
/// Prefix of environment overrides; `__` separates levels.
pub const ENV_PREFIX: &str = "PHONES_GATEWAY__";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub database: DatabaseConfig,
    pub log: LogConfig,
    pub upstreams: UpstreamsConfig,
    pub selection: SelectionConfig,
    pub cache: CachesConfig,
    pub rate_limit: RateLimitConfig,
    pub runtime: RuntimeConfig,
    pub breaker: BreakerConfig,
}

/// Circuit breaker settings, applied to each upstream.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    pub enabled: bool,
    pub consecutive_failures: u32,
    pub failure_ratio: f64,
    pub min_calls: u32,
    pub window_s: u64,
    pub open_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// 0: follow the cgroup CPU quota (or the cores when there is none).
    pub worker_threads: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub public_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub max_body_bytes: usize,
    pub max_snapshot_bytes: usize,
    pub shutdown_pause_ms: u64,
    pub drain_timeout_ms: u64,
    pub max_in_flight: usize,
    pub request_deadline_ms: u64,
    pub max_header_bytes: usize,
    pub header_read_timeout_ms: u64,
    pub body_read_timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    pub token: Secret,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub url: Secret,
    pub max_connections: u32,
    pub migrate_on_start: bool,
    pub sync_interval_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    pub filter: String,
    pub format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line (production).
    Json,
    /// Readable lines (the demo, a terminal).
    Text,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamsConfig {
    pub real_phone: UpstreamConfig,
    pub anonymous: UpstreamConfig,
    pub calltracking: CalltrackingUpstreamConfig,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub base_url: String,
    pub timeout_ms: u64,
    pub on_error: OnError,
}

impl UpstreamConfig {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalltrackingUpstreamConfig {
    pub base_url: String,
    pub timeout_ms: u64,
    pub on_error: OnError,
    pub status_feed: StatusFeedConfig,
}

impl CalltrackingUpstreamConfig {
    pub fn as_upstream(&self) -> UpstreamConfig {
        UpstreamConfig {
            base_url: self.base_url.clone(),
            timeout_ms: self.timeout_ms,
            on_error: self.on_error,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusFeedConfig {
    pub enabled: bool,
    pub interval_ms: u64,
    pub limit: u32,
}

/// What a failed source does (SPEC 5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Answer 503; reveal nothing further down the order.
    FailClosed,
    /// Go on to the next source.
    FallThrough,
}

/// A number source, as named in `selection.order` and in answers' `kind`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Anonymous,
    Calltracking,
    Real,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Anonymous => "anonymous",
            Source::Calltracking => "calltracking",
            Source::Real => "real",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectionConfig {
    pub order: Vec<Source>,
    pub anonymous_categories: Vec<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachesConfig {
    pub real_phone: CacheConfig,
    pub anonymous: CacheConfig,
    pub calltracking: CacheConfig,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    pub capacity: u64,
    pub ttl_s: u64,
    pub negative_ttl_s: u64,
    pub max_stale_s: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    pub per_viewer_per_minute: u32,
}

/// A string that never prints: tokens and database URLs with passwords.
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "\"<redacted>\""
        })
    }
}

impl<'de> Deserialize<'de> for Secret {
    /// Accepts numbers too: an all-digit token from the environment arrives as one.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Secret;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Secret, E> {
                Ok(Secret(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Secret, E> {
                Ok(Secret(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Secret, E> {
                Ok(Secret(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A configuration that cannot run, naming the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
    #[error("invalid configuration: {0}")]
    Parse(#[from] Box<figment::Error>),
    #[error("invalid configuration: {key}: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

impl Config {
    /// Defaults, then `file` if given, then the environment.
    ///
    /// # Errors
    /// A missing file, a value of the wrong type, an unknown key, or a value that
    /// fails [`Config::validate`].
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::MissingFile(path.display().to_string()));
            }
            figment = figment.merge(Toml::file(path));
        }
        Self::from_figment(figment.merge(Env::prefixed(ENV_PREFIX).split("__")))
    }

    /// The built-in defaults with `overlay` (TOML text) merged over them.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_toml(overlay: &str) -> Result<Self, ConfigError> {
        Self::from_figment(Figment::from(Toml::string(DEFAULT_TOML)).merge(Toml::string(overlay)))
    }

    /// Extracts and validates.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let config: Config = figment.extract().map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what types cannot: ranges, URLs, the order list.
    ///
    /// # Errors
    /// The first key whose value cannot run.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.server.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be above 0"));
        }
        if self.server.max_snapshot_bytes < self.server.max_body_bytes {
            return Err(invalid(
                "server.max_snapshot_bytes",
                "must be at least server.max_body_bytes",
            ));
        }
        let b = &self.breaker;
        if b.consecutive_failures == 0 {
            return Err(invalid("breaker.consecutive_failures", "must be above 0"));
        }
        if !(b.failure_ratio > 0.0 && b.failure_ratio <= 1.0) {
            return Err(invalid("breaker.failure_ratio", "must be in (0, 1]"));
        }
        if b.window_s == 0 || b.open_ms == 0 {
            return Err(invalid(
                "breaker.window_s / breaker.open_ms",
                "must be above 0",
            ));
        }
        if self.runtime.worker_threads > 1024 {
            return Err(invalid("runtime.worker_threads", "must be at most 1024"));
        }
        if !(4096..=1 << 20).contains(&self.server.max_header_bytes) {
            return Err(invalid(
                "server.max_header_bytes",
                "must be in 4096..=1048576",
            ));
        }
        for (key, value) in [
            (
                "server.header_read_timeout_ms",
                self.server.header_read_timeout_ms,
            ),
            (
                "server.body_read_timeout_ms",
                self.server.body_read_timeout_ms,
            ),
        ] {
            if !(1..=600_000).contains(&value) {
                return Err(invalid(key, "must be in 1..=600000"));
            }
        }
        if !(1..=60_000).contains(&self.server.request_deadline_ms) {
            return Err(invalid(
                "server.request_deadline_ms",
                "must be in 1..=60000",
            ));
        }
        if self.server.max_in_flight == 0 {
            return Err(invalid("server.max_in_flight", "must be above 0"));
        }
        if self.server.shutdown_pause_ms > 600_000 {
            return Err(invalid(
                "server.shutdown_pause_ms",
                "must be at most 600000",
            ));
        }
        if !(1..=600_000).contains(&self.server.drain_timeout_ms) {
            return Err(invalid("server.drain_timeout_ms", "must be in 1..=600000"));
        }
        let db = self.database.url.expose();
        if !["sqlite:", "postgres:", "postgresql:"]
            .iter()
            .any(|scheme| db.starts_with(scheme))
        {
            return Err(invalid(
                "database.url",
                "must start with sqlite: or postgres:",
            ));
        }
        if !(1..=1000).contains(&self.database.max_connections) {
            return Err(invalid("database.max_connections", "must be in 1..=1000"));
        }
        if !(10..=60_000).contains(&self.database.sync_interval_ms) {
            return Err(invalid(
                "database.sync_interval_ms",
                "must be in 10..=60000",
            ));
        }
        let upstreams = [
            ("upstreams.real_phone", self.upstreams.real_phone.clone()),
            ("upstreams.anonymous", self.upstreams.anonymous.clone()),
            (
                "upstreams.calltracking",
                self.upstreams.calltracking.as_upstream(),
            ),
        ];
        for (key, upstream) in upstreams {
            validate_base_url(&format!("{key}.base_url"), &upstream.base_url)?;
            if !(1..=60_000).contains(&upstream.timeout_ms) {
                return Err(invalid(format!("{key}.timeout_ms"), "must be in 1..=60000"));
            }
        }
        let feed = &self.upstreams.calltracking.status_feed;
        if feed.interval_ms == 0 {
            return Err(invalid(
                "upstreams.calltracking.status_feed.interval_ms",
                "must be above 0",
            ));
        }
        if !(1..=10_000).contains(&feed.limit) {
            return Err(invalid(
                "upstreams.calltracking.status_feed.limit",
                "must be in 1..=10000",
            ));
        }
        if self.selection.order.is_empty() {
            return Err(invalid("selection.order", "must name at least one source"));
        }
        for (i, source) in self.selection.order.iter().enumerate() {
            if self.selection.order[..i].contains(source) {
                return Err(invalid(
                    "selection.order",
                    format!("\"{}\" is listed twice", source.as_str()),
                ));
            }
        }
        for category in &self.selection.anonymous_categories {
            if crate::ids::CategoryId::new(*category).is_err() {
                return Err(invalid(
                    "selection.anonymous_categories",
                    format!("{category} is not a category id (1..=2147483647)"),
                ));
            }
        }
        let caches = [
            ("cache.real_phone", self.cache.real_phone),
            ("cache.anonymous", self.cache.anonymous),
            ("cache.calltracking", self.cache.calltracking),
        ];
        for (key, cache) in caches {
            if cache.capacity == 0 {
                return Err(invalid(format!("{key}.capacity"), "must be above 0"));
            }
            for (name, value) in [
                ("ttl_s", cache.ttl_s),
                ("negative_ttl_s", cache.negative_ttl_s),
            ] {
                if !(1..=86_400 * 7).contains(&value) {
                    return Err(invalid(format!("{key}.{name}"), "must be in 1..=604800"));
                }
            }
            if cache.max_stale_s > 86_400 * 7 {
                return Err(invalid(
                    format!("{key}.max_stale_s"),
                    "must be at most 604800",
                ));
            }
        }
        Ok(())
    }
}

fn validate_base_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| invalid(key, e.to_string()))?;
    if parsed.scheme() != "http" {
        return Err(invalid(
            key,
            "must be an http:// URL (TLS to upstreams is left to the mesh)",
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid(key, "must not carry a query or fragment"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.server.public_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.server.admin_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(c.server.max_body_bytes, 1 << 20);
        assert_eq!(
            c.selection.order,
            [Source::Anonymous, Source::Calltracking, Source::Real]
        );
        assert_eq!(c.selection.anonymous_categories, [9, 24]);
        assert_eq!(c.upstreams.anonymous.on_error, OnError::FailClosed);
        assert_eq!(c.upstreams.calltracking.on_error, OnError::FallThrough);
        assert_eq!(c.upstreams.real_phone.timeout_ms, 300);
        assert_eq!(c.cache.real_phone.capacity, 5_000_000);
        assert_eq!(c.cache.calltracking.capacity, 500_000);
        assert_eq!(c.cache.anonymous.capacity, 1_000_000);
        assert_eq!(c.cache.anonymous.ttl_s, 300);
        assert_eq!(c.cache.real_phone.negative_ttl_s, 60);
        assert_eq!(c.cache.real_phone.max_stale_s, 3600);
        assert!(c.admin.token.is_empty());
        assert_eq!(
            c.database.url.expose(),
            "sqlite://phones-gateway.db?mode=rwc"
        );
        assert_eq!(c.rate_limit.per_viewer_per_minute, 0);
    }

    fn error_of(toml: &str) -> String {
        Config::from_toml(toml).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_key() {
        let e = error_of("[selection]\norder = [\"anonymous\", \"anonymous\"]");
        assert!(e.contains("selection.order"), "{e}");
        let e = error_of("[upstreams.real_phone]\nbase_url = \"not a url\"");
        assert!(e.contains("upstreams.real_phone.base_url"), "{e}");
        let e = error_of("[upstreams.anonymous]\ntimeout_ms = 0");
        assert!(e.contains("upstreams.anonymous.timeout_ms"), "{e}");
        let e = error_of("[cache.anonymous]\ncapacity = 0");
        assert!(e.contains("cache.anonymous.capacity"), "{e}");
        let e = error_of("[upstreams.anonymous]\non_error = \"maybe\"");
        assert!(e.contains("on_error"), "{e}");
        let e = error_of("[server]\npublic_adr = \"0.0.0.0:1\"");
        assert!(e.contains("public_adr"), "{e}");
        let e = error_of("[selection]\nanonymous_categories = [0]");
        assert!(e.contains("selection.anonymous_categories"), "{e}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, not ours
    fn environment_overrides_files() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "gw.toml",
                "[upstreams.real_phone]\nbase_url = \"http://file:1\"",
            )?;
            jail.set_env("PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__TIMEOUT_MS", "250");
            jail.set_env("PHONES_GATEWAY__ADMIN__TOKEN", "123456");
            jail.set_env("PHONES_GATEWAY__SELECTION__ANONYMOUS_CATEGORIES", "[9, 31]");
            let c = Config::load(Some(Path::new("gw.toml"))).expect("loads");
            assert_eq!(c.upstreams.real_phone.base_url, "http://file:1");
            assert_eq!(c.upstreams.real_phone.timeout_ms, 250);
            assert_eq!(c.admin.token.expose(), "123456");
            assert_eq!(c.selection.anonymous_categories, [9, 31]);
            assert_eq!(format!("{:?}", c.admin.token), "\"<redacted>\"");
            Ok(())
        });
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let e = Config::load(Some(Path::new("/nonexistent/gw.toml"))).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/gw.toml"));
    }
}
