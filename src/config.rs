//! The configuration tree: built-in defaults (`config/default.toml`, compiled in),
//! an optional file, then `PHONES_GATEWAY__` environment variables; then validation.
//!
//! [`Config::from_figment`] is pure so tests feed it strings; only
//! [`Config::load`] reads files and the environment.
//!
//! A configuration that cannot run is refused with every mistake at once
//! ([`ConfigError::Invalid`]), each naming its dotted key and where its value
//! came from: serde stops at the first mistake of a struct, so extraction is
//! retried with the defaults in place of each value at fault until the rest
//! extracts, and each section's validation collects rather than returns.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use serde::Deserialize;

use crate::domain::Sources;
pub use crate::domain::{OnError, Source};

/// The documented defaults, key by key.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");
/// What the default `server.request_deadline_ms` adds to the longest path
/// through the upstream timeouts: the chain's own time between its calls (the
/// real answer handed over, the call-tracking call started, its answer handed
/// back), which the timeouts do not count. On an idle replica that is well
/// under a millisecond; on a saturated one every hand-over waits for a worker,
/// and with the deadline at the bare sum a call-tracking answer inside its own
/// timeout was cut and the seller's real number shown (docs/rules.md has the
/// figures). A fixed amount, not a share of the timeouts: scheduling delay does
/// not grow with them.
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(100);
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
    pub reveals: RevealsConfig,
    pub tracing: TracingConfig,
}

/// Distributed tracing (docs/tracing.md): W3C trace context is always
/// continued; spans are exported only when `otlp_endpoint` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The OTLP/HTTP collector's base URL (spans go to `{otlp_endpoint}/v1/traces`);
    /// empty: no export.
    pub otlp_endpoint: String,
    /// The share of new traces recorded; a caller's sampled flag decides for its own.
    pub sample_ratio: f64,
}

impl TracingConfig {
    /// Whether spans are exported at all.
    pub fn exports(&self) -> bool {
        !self.otlp_endpoint.is_empty()
    }

    fn validate(&self, found: &mut Vec<Mistake>) {
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

/// The reveal log (who was shown which seller's number).
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
    /// How long reveals are kept.
    pub fn retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.retention_days) * 86_400)
    }

    fn validate(&self, found: &mut Vec<Mistake>) {
        found.extend(
            in_range(
                "reveals.flush_interval_ms",
                self.flush_interval.as_millis(),
                10..=60_000,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "reveals.max_buffered",
                self.max_buffered,
                1..=100_000_000,
                "",
            )
            .err(),
        );
        found.extend(in_range("reveals.retention_days", self.retention_days, 1..=3650, "").err());
    }
}

/// Circuit breaker settings, applied to each upstream.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerConfig {
    pub enabled: bool,
    pub consecutive_failures: u32,
    pub failure_ratio: f64,
    pub min_calls: u32,
    #[serde(rename = "window_s", deserialize_with = "units::seconds")]
    pub window: Duration,
    #[serde(rename = "open_ms", deserialize_with = "units::millis")]
    pub open: Duration,
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
    #[serde(rename = "shutdown_pause_ms", deserialize_with = "units::millis")]
    pub shutdown_pause: Duration,
    #[serde(rename = "drain_timeout_ms", deserialize_with = "units::millis")]
    pub drain_timeout: Duration,
    pub max_in_flight: usize,
    /// When a ready request waits longer than this for a worker thread,
    /// requests that need an upstream call are shed in proportion
    /// (`resolve::admission`); zero: never.
    #[serde(rename = "max_queue_delay_ms", deserialize_with = "units::millis")]
    pub max_queue_delay: Duration,
    /// `None`: the longest path through the configured upstream timeouts (see
    /// [`Config::request_deadline`]); an explicit value may not be below it.
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    pub token: Secret,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    pub url: Secret,
    /// PostgreSQL itself, when `url` is a transaction-mode pooler: migrations
    /// and LISTEN need a session of their own. Empty: `url`.
    pub direct_url: Secret,
    pub max_connections: u32,
    pub migrate_on_start: bool,
    /// PostgreSQL only: `LISTEN` for change hints; `false` learns changes by
    /// the catch-up poll alone (behind a transaction pooler, which cannot LISTEN).
    pub listen: bool,
    #[serde(rename = "sync_interval_ms", deserialize_with = "units::millis")]
    pub sync_interval: Duration,
    /// One database statement at most (PostgreSQL: `statement_timeout`).
    #[serde(rename = "statement_timeout_ms", deserialize_with = "units::millis")]
    pub statement_timeout: Duration,
    /// Waiting for a lock at most (PostgreSQL: `lock_timeout`; SQLite: its
    /// busy timeout).
    #[serde(rename = "lock_timeout_ms", deserialize_with = "units::millis")]
    pub lock_timeout: Duration,
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
    #[serde(rename = "timeout_ms", deserialize_with = "units::millis")]
    pub timeout: Duration,
    pub on_error: OnError,
    /// Calls to this upstream in flight at once; 0 means `server.max_in_flight`.
    /// Read it through [`UpstreamConfig::max_in_flight_or`].
    pub max_in_flight: usize,
    /// Calls to this upstream about one seller in flight at once; 0 means an
    /// eighth of the upstream's bound, at least 1 (why: `upstream::limit`).
    /// Read it through [`UpstreamConfig::max_in_flight_per_seller_or`].
    pub max_in_flight_per_seller: usize,
}

impl UpstreamConfig {
    /// Calls in flight allowed to this upstream: its `max_in_flight`, or
    /// `server_max_in_flight` (`server.max_in_flight`) when that is 0 (each
    /// public request in flight makes at most one call to each upstream).
    pub fn max_in_flight_or(&self, server_max_in_flight: usize) -> usize {
        match self.max_in_flight {
            0 => server_max_in_flight,
            n => n,
        }
    }

    /// Calls in flight allowed to this upstream about one seller, under the
    /// upstream's bound `max_in_flight` (as resolved by
    /// [`UpstreamConfig::max_in_flight_or`]): its `max_in_flight_per_seller`, or
    /// when that is 0, an eighth of `max_in_flight`, at least 1.
    pub fn max_in_flight_per_seller_or(&self, max_in_flight: usize) -> usize {
        match self.max_in_flight_per_seller {
            0 => (max_in_flight / 8).max(1),
            n => n,
        }
    }
}

/// The call-tracking upstream: an upstream like the others, and its status feed.
///
/// Its keys stay where they were (`upstreams.calltracking.timeout_ms`): read
/// through [`CalltrackingKeys`], every key a field of its own, rather than with
/// `#[serde(flatten)]`. Flattened keys are buffered by serde before they are
/// read, so a mistake in one (`on_error = "maybe"`, a string for
/// `timeout_ms`) lost its key and was reported against `upstreams.calltracking`.
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
            },
            status_feed: keys.status_feed,
        }
    }
}

impl UpstreamsConfig {
    /// The upstream asked for `source`'s numbers.
    pub fn of(&self, source: Source) -> &UpstreamConfig {
        match source {
            Source::Anonymous => &self.anonymous,
            Source::Calltracking => &self.calltracking.upstream,
            Source::Real => &self.real_phone,
        }
    }

    /// Each source's `on_error`: what the selection rules do when it fails.
    pub fn policies(&self) -> Sources<OnError> {
        Sources::from_fn(|source| self.of(source).on_error)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusFeedConfig {
    pub enabled: bool,
    #[serde(rename = "interval_ms", deserialize_with = "units::millis")]
    pub interval: Duration,
    pub limit: u32,
    /// The feed leader's lease (docs/status-sync.md, "Leadership").
    #[serde(rename = "lease_ttl_ms", deserialize_with = "units::millis")]
    pub lease_ttl: Duration,
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

impl CachesConfig {
    /// The cache of `source`'s numbers.
    pub fn of(&self, source: Source) -> &CacheConfig {
        match source {
            Source::Anonymous => &self.anonymous,
            Source::Calltracking => &self.calltracking,
            Source::Real => &self.real_phone,
        }
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
}

/// Viewer budgets (docs/abuse.md): counted per replica, exchanged through the
/// database every `exchange_interval_ms`, so that they are the fleet's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    pub per_viewer_per_minute: u32,
    /// Per UTC calendar day; 0 = off.
    pub per_viewer_per_day: u32,
    #[serde(rename = "exchange_interval_ms", deserialize_with = "units::millis")]
    pub exchange_interval: Duration,
}

impl RateLimitConfig {
    /// Whether any budget is on.
    pub fn enabled(&self) -> bool {
        self.per_viewer_per_minute > 0 || self.per_viewer_per_day > 0
    }

    fn validate(&self, found: &mut Vec<Mistake>) {
        found.extend(
            in_range(
                "rate_limit.per_viewer_per_minute",
                self.per_viewer_per_minute,
                0..=65_535,
                " (a budget is for people; the ledgers count in 16 bits)",
            )
            .err(),
        );
        found.extend(
            in_range(
                "rate_limit.per_viewer_per_day",
                self.per_viewer_per_day,
                0..=65_535,
                " (a budget is for people; the ledgers count in 16 bits)",
            )
            .err(),
        );
        // Under a second: a viewer past a budget anywhere is refused everywhere
        // within one exchange (and its bounded call).
        found.extend(
            in_range(
                "rate_limit.exchange_interval_ms",
                self.exchange_interval.as_millis(),
                10..=750,
                " (a viewer past a budget must be refused fleet-wide within 1 s)",
            )
            .err(),
        );
    }
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
    /// Strings only: a secret read as a number would already have lost its
    /// leading zeros. From the environment, secrets arrive verbatim as strings
    /// (`SECRET_KEYS`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// Keys whose environment values are taken verbatim: figment would read
/// `0123456789` as a number (dropping the zero) and `true` as a boolean.
const SECRET_KEYS: [&str; 3] = ["admin.token", "database.url", "database.direct_url"];

/// A configuration that cannot run: every mistake in it, each naming its key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
    /// Every mistake found, in one run: extraction (unknown keys, wrong types)
    /// and validation (ranges, URLs) alike.
    #[error("{}", list(.0))]
    Invalid(Vec<Mistake>),
}

/// One thing wrong with the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mistake {
    /// The dotted key as documented (`upstreams.real_phone.timeout_ms`).
    pub key: String,
    pub reason: String,
    /// Where the value came from, when not the built-in defaults: `in FILE`
    /// (its absolute path) or `from environment variable NAME`.
    pub source: Option<String>,
}

impl fmt::Display for Mistake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A file that does not parse has no key to name.
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.reason)?;
        match &self.source {
            Some(source) => write!(f, " ({source})"),
            None => Ok(()),
        }
    }
}

fn list(mistakes: &[Mistake]) -> String {
    match mistakes {
        [one] => format!("invalid configuration: {one}"),
        many => {
            let mut text = format!("invalid configuration, {} mistakes:", many.len());
            for mistake in many {
                text.push_str("\n  ");
                text.push_str(&mistake.to_string());
            }
            text
        }
    }
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Mistake {
    Mistake {
        key: key.into(),
        reason: reason.into(),
        source: None,
    }
}

/// Rounds of "note the mistakes serde stopped at, put the default in their place,
/// extract again" before giving up on finding more: serde stops at the first
/// mistake of a struct, figment does not go on either.
const MAX_EXTRACTION_ROUNDS: usize = 64;

/// Where the value at `key` came from, for a mistake's message: a file's
/// absolute path, or the environment variable's name. `None` for the built-in
/// defaults (and values tests build from strings).
fn source_of(figment: &Figment, key: &str) -> Option<String> {
    described(figment.find_metadata(key)?, key)
}

/// [`source_of`] for the provider `metadata` describes.
fn described(metadata: &figment::Metadata, key: &str) -> Option<String> {
    if let Some(figment::Source::File(path)) = &metadata.source {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.clone());
        return Some(format!("in {}", path.display()));
    }
    if metadata.name.contains("environment variable") {
        // Named as written to be set (figment's own interpolation drops the
        // prefix and joins with dots).
        let name = format!(
            "{ENV_PREFIX}{}",
            key.replace('.', "__").to_ascii_uppercase()
        );
        return Some(format!("from environment variable {name}"));
    }
    None
}

/// [`key_of`] as its segments.
fn key_path(error: &figment::Error) -> Vec<String> {
    key_of(error).split('.').map(str::to_owned).collect()
}

/// The dotted key of an extraction error, without figment's profile: the
/// path, and for an unknown or missing field the field itself.
fn key_of(error: &figment::Error) -> String {
    use figment::error::Kind;
    let mut path = error.path.clone();
    let field = match &error.kind {
        Kind::UnknownField(field, _) => Some(field.as_str()),
        Kind::MissingField(field) => Some(field.as_ref()),
        _ => None,
    };
    if let Some(field) = field {
        if path.last().map(String::as_str) != Some(field) {
            path.push(field.to_owned());
        }
    }
    path.join(".")
}

/// Puts the default value at `path` in `dict` (or removes the key when the
/// defaults have none: an unknown key, or an optional one). Returns whether
/// anything changed.
fn repair(
    dict: &mut figment::value::Dict,
    path: &[String],
    defaults: &figment::value::Dict,
) -> bool {
    use figment::value::Value;
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut here = dict;
    let mut fallback = Some(defaults);
    for key in parents {
        fallback = fallback.and_then(|d| match d.get(key) {
            Some(Value::Dict(_, inner)) => Some(inner),
            _ => None,
        });
        match here.get_mut(key) {
            Some(Value::Dict(_, inner)) => here = inner,
            _ => return false,
        }
    }
    match fallback.and_then(|d| d.get(last)) {
        Some(default) if here.get(last) != Some(default) => {
            here.insert(last.clone(), default.clone());
            true
        }
        Some(_) => false,
        None => here.remove(last).is_some(),
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
            // Absolute, so every message names the file wherever it was run
            // from (figment would also search the parent directories for a
            // relative one).
            let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            if !path.is_file() {
                return Err(ConfigError::MissingFile(path.display().to_string()));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        Self::from_figment(figment.merge(environment()))
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
        let mut found = Vec::new();
        let config = match figment.extract::<Config>() {
            Ok(config) => Some(config),
            Err(error) => Self::extract_noting_all(&figment, error, &mut found),
        };
        if let Some(config) = &config {
            found.extend(config.mistakes().into_iter().map(|mut mistake| {
                mistake.source = source_of(&figment, &mistake.key);
                mistake
            }));
        }
        match config {
            Some(config) if found.is_empty() => Ok(config),
            _ => Err(ConfigError::Invalid(found)),
        }
    }

    /// After `first` failed the extraction: notes every mistake serde stops
    /// at, one round at a time, each round with the defaults put in place of
    /// the values at fault, until the rest extracts. Returns that config (its
    /// repaired values are the defaults, so validating it finds the other
    /// mistakes, not these), or `None` when the data cannot be read at all (a
    /// file that is not TOML).
    fn extract_noting_all(
        figment: &Figment,
        first: figment::Error,
        found: &mut Vec<Mistake>,
    ) -> Option<Config> {
        use figment::providers::Serialized;
        use figment::value::Dict;
        let note = |error: figment::Error, found: &mut Vec<Mistake>| {
            let key = key_of(&error);
            let mistake = Mistake {
                source: source_of(figment, &key),
                reason: error.kind.to_string(),
                key,
            };
            if !found.contains(&mistake) {
                found.push(mistake);
            }
        };
        let (Ok(mut data), Ok(defaults)) = (
            figment.extract::<Dict>(),
            Figment::from(Toml::string(DEFAULT_TOML)).extract::<Dict>(),
        ) else {
            // The providers themselves failed (a file that does not parse):
            // figment's message names the file and the line.
            for error in first {
                let key = key_of(&error);
                found.push(Mistake {
                    source: error.metadata.as_ref().and_then(|m| described(m, &key)),
                    reason: error.kind.to_string(),
                    key,
                });
            }
            return None;
        };
        let mut errors = first;
        for _ in 0..MAX_EXTRACTION_ROUNDS {
            let mut progress = false;
            for error in errors {
                progress |= repair(&mut data, &key_path(&error), &defaults);
                note(error, found);
            }
            if !progress {
                return None;
            }
            match Figment::from(Serialized::defaults(&data)).extract::<Config>() {
                Ok(config) => return Some(config),
                Err(next) => errors = next,
            }
        }
        None
    }

    /// Checks what types cannot: every number in a range that runs (a duration
    /// or size far out of range would overflow a clock or an allocation deep
    /// inside a request), URLs, the order list. Each section checks its own keys.
    ///
    /// # Errors
    /// Every key whose value cannot run, each named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let found = self.mistakes();
        if found.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(found))
        }
    }

    /// Every mistake [`Config::validate`] finds, in key order of the sections.
    fn mistakes(&self) -> Vec<Mistake> {
        let mut found = Vec::new();
        self.server.validate(&mut found);
        if let Some(explicit) = self.server.request_deadline {
            let longest = self.longest_upstream_path();
            found.extend(
                in_range(
                    "server.request_deadline_ms",
                    explicit.as_millis(),
                    longest.as_millis()..=MAX_WAIT_MS.into(),
                    " (at least the longest path through the upstream timeouts, \
                     max(anonymous, real_phone + calltracking))",
                )
                .err(),
            );
        }
        self.database.validate(&mut found);
        self.upstreams.validate(&mut found);
        self.selection.validate(&mut found);
        self.cache
            .real_phone
            .validate("cache.real_phone", &mut found);
        self.cache.anonymous.validate("cache.anonymous", &mut found);
        self.cache
            .calltracking
            .validate("cache.calltracking", &mut found);
        self.rate_limit.validate(&mut found);
        found.extend(
            in_range(
                "runtime.worker_threads",
                self.runtime.worker_threads,
                0..=1024,
                "",
            )
            .err(),
        );
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&self.log.filter) {
            found.push(invalid(
                "log.filter",
                format!("not a tracing filter: {error}"),
            ));
        }
        self.breaker.validate(&mut found);
        self.reveals.validate(&mut found);
        self.tracing.validate(&mut found);
        found
    }

    /// max(anonymous, real_phone + calltracking) of the configured timeouts: how
    /// long a request may need when every call answers within its own timeout.
    pub fn longest_upstream_path(&self) -> Duration {
        let u = &self.upstreams;
        u.anonymous
            .timeout
            .max(u.real_phone.timeout + u.calltracking.upstream.timeout)
    }

    /// `server.request_deadline_ms`, or by default the longest path through the
    /// upstream timeouts plus [`DEADLINE_MARGIN`], so a call answering within its
    /// own timeout is never cut, also on a replica whose workers are busy.
    pub fn request_deadline(&self) -> Duration {
        self.server
            .request_deadline
            .unwrap_or_else(|| self.longest_upstream_path() + DEADLINE_MARGIN)
    }
}

/// Durations are written as integers in the unit their key names (`_ms`, `_s`,
/// as the documented keys are) and held as `Duration` from the moment they are read.
mod units {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }

    pub(super) fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }

    pub(super) fn optional_millis<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<u64>::deserialize(d).map(|ms| ms.map(Duration::from_millis))
    }

    pub(super) fn optional_seconds<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Option::<u64>::deserialize(d).map(|s| s.map(Duration::from_secs))
    }
}

/// `Ok` when `value` is in `range`, else an error naming `key` and the range.
fn in_range<T>(
    key: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
    why: &str,
) -> Result<(), Mistake>
where
    T: PartialOrd + fmt::Display,
{
    if range.contains(&value) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!(
            "must be in {}..={}{why}, got {value}",
            range.start(),
            range.end()
        ),
    ))
}

/// Ten minutes: the longest any wait, pause or timeout key may be.
const MAX_WAIT_MS: u64 = 600_000;

impl ServerConfig {
    fn validate(&self, found: &mut Vec<Mistake>) {
        found.extend(
            in_range(
                "server.max_body_bytes",
                self.max_body_bytes,
                1..=1 << 30,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "server.max_snapshot_bytes",
                self.max_snapshot_bytes,
                self.max_body_bytes..=1 << 34,
                " (at least server.max_body_bytes)",
            )
            .err(),
        );
        found.extend(
            in_range(
                "server.max_header_bytes",
                self.max_header_bytes,
                4096..=1 << 20,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "server.max_in_flight",
                self.max_in_flight,
                1..=1_000_000,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "server.max_queue_delay_ms",
                self.max_queue_delay.as_millis(),
                0..=MAX_WAIT_MS.into(),
                " (0: never shed uncached requests for waiting)",
            )
            .err(),
        );
        found.extend(
            in_range(
                "server.shutdown_pause_ms",
                self.shutdown_pause.as_millis(),
                0..=MAX_WAIT_MS.into(),
                "",
            )
            .err(),
        );
        for (key, value) in [
            ("server.drain_timeout_ms", self.drain_timeout),
            ("server.header_read_timeout_ms", self.header_read_timeout),
            ("server.body_read_timeout_ms", self.body_read_timeout),
        ] {
            found.extend(in_range(key, value.as_millis(), 1..=MAX_WAIT_MS.into(), "").err());
        }
    }
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

    fn validate(&self, found: &mut Vec<Mistake>) {
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
        found.extend(
            in_range(
                "database.max_connections",
                self.max_connections,
                1..=1000,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "database.sync_interval_ms",
                self.sync_interval.as_millis(),
                10..=60_000,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "database.statement_timeout_ms",
                self.statement_timeout.as_millis(),
                100..=3_600_000,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "database.lock_timeout_ms",
                self.lock_timeout.as_millis(),
                10..=self.statement_timeout.as_millis().max(10),
                " (at most database.statement_timeout_ms)",
            )
            .err(),
        );
    }
}

impl UpstreamsConfig {
    fn validate(&self, found: &mut Vec<Mistake>) {
        let upstreams = [
            ("upstreams.real_phone", &self.real_phone),
            ("upstreams.anonymous", &self.anonymous),
            ("upstreams.calltracking", &self.calltracking.upstream),
        ];
        for (key, upstream) in upstreams {
            found.extend(validate_base_url(&format!("{key}.base_url"), &upstream.base_url).err());
            found.extend(
                in_range(
                    &format!("{key}.timeout_ms"),
                    upstream.timeout.as_millis(),
                    1..=60_000,
                    "",
                )
                .err(),
            );
            found.extend(
                in_range(
                    &format!("{key}.max_in_flight"),
                    upstream.max_in_flight,
                    0..=1_000_000,
                    " (0: server.max_in_flight)",
                )
                .err(),
            );
            found.extend(
                in_range(
                    &format!("{key}.max_in_flight_per_seller"),
                    upstream.max_in_flight_per_seller,
                    0..=1_000_000,
                    " (0: an eighth of the upstream's max_in_flight)",
                )
                .err(),
            );
        }
        let feed = &self.calltracking.status_feed;
        found.extend(
            in_range(
                "upstreams.calltracking.status_feed.interval_ms",
                feed.interval.as_millis(),
                1..=3_600_000,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "upstreams.calltracking.status_feed.limit",
                feed.limit,
                1..=10_000,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                "upstreams.calltracking.status_feed.lease_ttl_ms",
                feed.lease_ttl.as_millis(),
                300..=6_000,
                " (a stopped leader is replaced within 10 s)",
            )
            .err(),
        );
    }
}

impl SelectionConfig {
    fn validate(&self, found: &mut Vec<Mistake>) {
        if self.order.is_empty() {
            found.push(invalid("selection.order", "must name at least one source"));
        }
        for (i, source) in self.order.iter().enumerate() {
            if self.order[..i].contains(source) {
                found.push(invalid(
                    "selection.order",
                    format!("\"{}\" is listed twice", source.as_str()),
                ));
            }
        }
        for category in &self.anonymous_categories {
            if crate::domain::CategoryId::new(*category).is_err() {
                found.push(invalid(
                    "selection.anonymous_categories",
                    format!("{category} is not a category id (1..=2147483647)"),
                ));
            }
        }
    }
}

/// A week: the longest TTL or stale window.
const MAX_TTL_S: u64 = 7 * 86_400;

impl CacheConfig {
    fn validate(&self, section: &str, found: &mut Vec<Mistake>) {
        // 10^8 entries is about 5.6 GB at the measured 56 B an entry.
        found.extend(
            in_range(
                &format!("{section}.capacity"),
                self.capacity,
                1..=100_000_000,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                &format!("{section}.ttl_s"),
                self.ttl.as_secs(),
                1..=MAX_TTL_S,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                &format!("{section}.negative_ttl_s"),
                self.negative_ttl.as_secs(),
                1..=MAX_TTL_S,
                "",
            )
            .err(),
        );
        found.extend(
            in_range(
                &format!("{section}.max_stale_s"),
                self.max_stale.as_secs(),
                0..=MAX_TTL_S,
                "",
            )
            .err(),
        );
        if let Some(ahead) = self.refresh_ahead {
            found.extend(
                in_range(
                    &format!("{section}.refresh_ahead_s"),
                    ahead.as_secs(),
                    // Saturating: a ttl_s of 0 is its own mistake, found above.
                    0..=self.ttl.as_secs().saturating_sub(1),
                    " (below ttl_s, or every hit would refresh)",
                )
                .err(),
            );
        }
    }
}

impl BreakerConfig {
    fn validate(&self, found: &mut Vec<Mistake>) {
        found.extend(
            in_range(
                "breaker.consecutive_failures",
                self.consecutive_failures,
                1..=1_000_000,
                "",
            )
            .err(),
        );
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            found.push(invalid("breaker.failure_ratio", "must be in (0, 1]"));
        }
        found.extend(in_range("breaker.min_calls", self.min_calls, 1..=1_000_000, "").err());
        found.extend(in_range("breaker.window_s", self.window.as_secs(), 1..=3600, "").err());
        found.extend(in_range("breaker.open_ms", self.open.as_millis(), 1..=3_600_000, "").err());
    }
}

/// Environment variables that look meant for the gateway but are not read: a
/// `PHONES_GATEWAY_` prefix with one underscore (`PHONES_GATEWAY_ADMIN__TOKEN`),
/// which figment passes over in silence. A name without `__` after the prefix
/// (`PHONES_GATEWAY_BIN`, the scripts' own) is not taken for an override. Names only, sorted: values may be
/// secrets.
pub fn mistyped_environment() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .filter(|name| {
            // Only what looks like an override (a `__` between levels further
            // on): `PHONES_GATEWAY_BIN`, which scripts/cluster reads, is not one.
            strip_prefix_ignore_case(name, "PHONES_GATEWAY_")
                .is_some_and(|rest| rest.contains("__"))
                && strip_prefix_ignore_case(name, ENV_PREFIX).is_none()
        })
        .collect();
    names.sort();
    names
}

/// `PHONES_GATEWAY__` variables, parsed as figment does (numbers, booleans,
/// lists), except the `SECRET_KEYS`, which are taken as the exact strings given.
fn environment() -> Figment {
    let mut env = Figment::from(Env::prefixed(ENV_PREFIX).split("__").ignore(&SECRET_KEYS));
    for (name, value) in std::env::vars() {
        let Some(rest) = strip_prefix_ignore_case(&name, ENV_PREFIX) else {
            continue;
        };
        let key = rest.replace("__", ".").to_ascii_lowercase();
        if SECRET_KEYS.contains(&key.as_str()) {
            env = env.merge(SecretVar { key, value });
        }
    }
    env
}

/// One of the `SECRET_KEYS` from the environment, verbatim; a provider of its
/// own so that a mistake in it names the environment as its source.
struct SecretVar {
    key: String,
    value: String,
}

impl figment::Provider for SecretVar {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named("environment variable")
    }

    fn data(
        &self,
    ) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        figment::providers::Serialized::default(&self.key, &self.value).data()
    }
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// `url` as an absolute URL of one of `schemes` (else `scheme_rule`), naming a
/// host, with nothing after the path. Parsed by `http::Uri`: plain ASCII, no
/// host mapping.
fn parse_url(
    key: &str,
    url: &str,
    schemes: &[&str],
    scheme_rule: &str,
) -> Result<hyper::Uri, Mistake> {
    let parsed: hyper::Uri = url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| invalid(key, format!("not a URL: {e}")))?;
    if !parsed.scheme_str().is_some_and(|s| schemes.contains(&s)) {
        return Err(invalid(key, scheme_rule));
    }
    if parsed.host().is_none_or(str::is_empty) {
        return Err(invalid(key, "must name a host"));
    }
    if parsed.query().is_some() || url.contains('#') {
        return Err(invalid(key, "must not carry a query or fragment"));
    }
    Ok(parsed)
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
        assert_eq!(
            c.upstreams.calltracking.upstream.on_error,
            OnError::FallThrough
        );
        assert_eq!(c.upstreams.real_phone.timeout, Duration::from_millis(300));
        assert_eq!(c.cache.real_phone.capacity, 5_000_000);
        assert_eq!(c.cache.calltracking.capacity, 500_000);
        assert_eq!(c.cache.anonymous.capacity, 1_000_000);
        assert_eq!(c.cache.anonymous.ttl, Duration::from_secs(300));
        assert_eq!(c.cache.real_phone.negative_ttl, Duration::from_secs(60));
        assert_eq!(c.cache.real_phone.max_stale, Duration::from_secs(3600));
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
        assert!(e.contains("upstreams.anonymous.on_error"), "{e}");
        let e = error_of("[upstreams.calltracking]\non_error = \"maybe\"");
        assert!(e.contains("upstreams.calltracking.on_error"), "{e}");
        let e = error_of("[server]\npublic_adr = \"0.0.0.0:1\"");
        assert!(e.contains("public_adr"), "{e}");
        let e = error_of("[selection]\nanonymous_categories = [0]");
        assert!(e.contains("selection.anonymous_categories"), "{e}");
    }

    #[test]
    fn the_calltracking_upstream_takes_the_common_keys_and_refuses_others() {
        // `upstreams.calltracking` holds the common upstream keys beside its
        // status feed: a typo is refused, as in every section.
        let e = error_of("[upstreams.calltracking]\ntimeout_ms = 100\ntimeout = 100");
        assert!(e.contains("upstreams.calltracking.timeout:"), "{e}");
        assert!(e.contains("unknown field"), "{e}");
        let e = error_of("[upstreams.calltracking.status_feed]\nenabeld = true");
        assert!(
            e.contains("upstreams.calltracking.status_feed.enabeld"),
            "{e}"
        );
        let e = error_of("[upstreams.calltracking]\ntimeout_ms = 0");
        assert!(e.contains("upstreams.calltracking.timeout_ms"), "{e}");
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

    /// Every leaf key of the defaults, dotted, with its default value.
    fn leaf_keys() -> Vec<(String, figment::value::Value)> {
        fn walk(
            prefix: &str,
            dict: &figment::value::Dict,
            out: &mut Vec<(String, figment::value::Value)>,
        ) {
            for (key, value) in dict {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                match value {
                    figment::value::Value::Dict(_, inner) => walk(&path, inner, out),
                    leaf => out.push((path, leaf.clone())),
                }
            }
        }
        let defaults = Figment::from(Toml::string(DEFAULT_TOML))
            .extract::<figment::value::Dict>()
            .unwrap();
        let mut out = Vec::new();
        walk("", &defaults, &mut out);
        out
    }

    /// The mistakes `Config::load` (what `serve --config FILE` runs) finds in
    /// a file of `toml`.
    #[allow(clippy::result_large_err)] // figment's Jail API, not ours
    fn mistakes_in_file(jail: &mut figment::Jail, toml: &str) -> Vec<Mistake> {
        jail.create_file("gw.toml", toml).unwrap();
        match Config::load(Some(Path::new("gw.toml"))) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(found)) => found,
            Err(other) => panic!("{other}"),
        }
    }

    /// A value of the wrong type under any key, whatever its type (number,
    /// duration, bool, string, enum, list), names that key, dotted, and the
    /// file; nothing else is reported.
    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, not ours
    fn a_value_of_the_wrong_type_names_its_whole_key() {
        use figment::value::Value;
        let keys = leaf_keys();
        assert!(keys.len() > 50, "{}", keys.len());
        figment::Jail::expect_with(|jail| {
            for (key, default) in &keys {
                let wrong = match default {
                    Value::String(..) => "7",
                    _ => "\"seven\"",
                };
                let (section, leaf) = key.rsplit_once('.').unwrap();
                let found = mistakes_in_file(jail, &format!("[{section}]\n{leaf} = {wrong}\n"));
                let keys_found: Vec<&str> = found.iter().map(|m| m.key.as_str()).collect();
                assert_eq!(keys_found, [key.as_str()], "{key} = {wrong}: {found:?}");
                let text = found[0].to_string();
                assert!(text.starts_with(&format!("{key}: ")), "{text}");
                assert!(text.contains("gw.toml"), "{text}");
            }
            Ok(())
        });
    }

    /// An enum's unknown value names the key and the values it takes.
    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, not ours
    fn an_unknown_enum_value_names_its_key_and_the_allowed_values() {
        figment::Jail::expect_with(|jail| {
            for (section, leaf, allowed) in [
                (
                    "upstreams.calltracking",
                    "on_error",
                    &["fail_closed", "fall_through"][..],
                ),
                (
                    "upstreams.real_phone",
                    "on_error",
                    &["fail_closed", "fall_through"],
                ),
                ("log", "format", &["json", "text"]),
                ("reveals", "on_overflow", &["drop", "refuse"]),
                ("selection", "order", &["anonymous", "calltracking", "real"]),
            ] {
                let value = if leaf == "order" {
                    "[\"real\", \"maybe\"]"
                } else {
                    "\"maybe\""
                };
                let found = mistakes_in_file(jail, &format!("[{section}]\n{leaf} = {value}\n"));
                let key = format!("{section}.{leaf}");
                assert_eq!(found.len(), 1, "{key}: {found:?}");
                let text = found[0].to_string();
                assert!(text.starts_with(&key), "{text}");
                assert!(text.contains("maybe"), "{text}");
                for value in allowed {
                    assert!(text.contains(value), "{key}: {value} not named in {text}");
                }
            }
            Ok(())
        });
    }

    #[test]
    fn the_bound_per_seller_is_an_eighth_of_the_upstreams_unless_set() {
        let c = Config::from_toml(
            "[upstreams.calltracking]
max_in_flight = 64
             [upstreams.real_phone]
max_in_flight_per_seller = 3",
        )
        .unwrap();
        let calltracking = &c.upstreams.calltracking.upstream;
        assert_eq!(calltracking.max_in_flight_per_seller_or(64), 8);
        assert_eq!(calltracking.max_in_flight_per_seller_or(4), 1);
        assert_eq!(c.upstreams.real_phone.max_in_flight_per_seller_or(64), 3);
        let e = error_of("[upstreams.anonymous]\nmax_in_flight_per_seller = 2000000");
        assert!(
            e.contains("upstreams.anonymous.max_in_flight_per_seller"),
            "{e}"
        );
    }

    #[test]
    fn every_mistake_is_named_in_one_run() {
        let e = Config::from_toml(
            "[server]\npublic_adr = \"0.0.0.0:1\"\nmax_in_flight = 0\n\
             [upstreams.real_phone]\ntimeout_ms = \"fast\"\n\
             [upstreams.anonymous]\ntimeout_ms = -1\n\
             [cache.anonymous]\ncapacity = 0\nttl_s = 0\nrefresh_ahead_s = 5\n\
             [sever]\nx = 1\n[log]\nfilter = \"=[\"",
        )
        .unwrap_err();
        let ConfigError::Invalid(mistakes) = &e else {
            panic!("{e}");
        };
        let mut keys: Vec<&str> = mistakes.iter().map(|m| m.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "cache.anonymous.capacity",
                "cache.anonymous.refresh_ahead_s",
                "cache.anonymous.ttl_s",
                "log.filter",
                "server.max_in_flight",
                "server.public_adr",
                "sever",
                "upstreams.anonymous.timeout_ms",
                "upstreams.real_phone.timeout_ms",
            ],
            "{e}"
        );
        assert!(!e.to_string().contains("default."), "{e}");
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
            assert_eq!(c.upstreams.real_phone.timeout, Duration::from_millis(250));
            assert_eq!(c.admin.token.expose(), "123456");
            assert_eq!(c.selection.anonymous_categories, [9, 31]);
            assert_eq!(format!("{:?}", c.admin.token), "\"<redacted>\"");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API, not ours
    fn secrets_from_the_environment_are_taken_verbatim() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("PHONES_GATEWAY__ADMIN__TOKEN", "0123456789");
            jail.set_env(
                "PHONES_GATEWAY__DATABASE__URL",
                "postgres://gw:007@db/gw?sslmode=disable",
            );
            let c = Config::load(None).expect("loads");
            assert_eq!(c.admin.token.expose(), "0123456789");
            assert_eq!(
                c.database.url.expose(),
                "postgres://gw:007@db/gw?sslmode=disable"
            );
            for verbatim in ["true", "[1, 2]", "1e3", "  spaced  "] {
                jail.set_env("PHONES_GATEWAY__ADMIN__TOKEN", verbatim);
                let c = Config::load(None).expect("loads");
                assert_eq!(c.admin.token.expose(), verbatim);
            }
            // Other keys are still parsed as figment does.
            jail.set_env("PHONES_GATEWAY__SERVER__MAX_IN_FLIGHT", "0128");
            assert_eq!(Config::load(None).expect("loads").server.max_in_flight, 128);
            // The largest u64 (only the environment can say it): refused, named.
            jail.set_env("PHONES_GATEWAY__BREAKER__WINDOW_S", "18446744073709551615");
            let e = Config::load(None).expect_err("refused").to_string();
            assert!(e.contains("breaker.window_s"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn the_request_deadline_defaults_to_the_longest_upstream_path_and_a_margin() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.request_deadline(), Duration::from_millis(700));
        let c = Config::from_toml("[upstreams.anonymous]\ntimeout_ms = 800").unwrap();
        assert_eq!(c.request_deadline(), Duration::from_millis(900));
        let c = Config::from_toml(
            "[upstreams.real_phone]\ntimeout_ms = 250\n[upstreams.calltracking]\ntimeout_ms = 400",
        )
        .unwrap();
        assert_eq!(c.request_deadline(), Duration::from_millis(750));
        let c = Config::from_toml("[server]\nrequest_deadline_ms = 900").unwrap();
        assert_eq!(c.request_deadline(), Duration::from_millis(900));
        // The bare longest path may be set explicitly (no margin)...
        let c = Config::from_toml("[server]\nrequest_deadline_ms = 600").unwrap();
        assert_eq!(c.request_deadline(), Duration::from_millis(600));
        // ...but not less: refused, naming the key.
        let e = error_of("[server]\nrequest_deadline_ms = 599");
        assert!(e.contains("server.request_deadline_ms"), "{e}");
        let e = error_of(
            "[server]\nrequest_deadline_ms = 700\n[upstreams.anonymous]\ntimeout_ms = 800",
        );
        assert!(e.contains("server.request_deadline_ms"), "{e}");
    }

    #[test]
    fn every_duration_and_size_is_bounded() {
        for (toml, key) in [
            (
                "[breaker]\nwindow_s = 9223372036854775807",
                "breaker.window_s",
            ),
            (
                "[breaker]\nopen_ms = 9223372036854775807",
                "breaker.open_ms",
            ),
            ("[breaker]\nmin_calls = 0", "breaker.min_calls"),
            (
                "[breaker]\nconsecutive_failures = 0",
                "breaker.consecutive_failures",
            ),
            (
                "[server]\nmax_body_bytes = 9223372036854775807",
                "server.max_body_bytes",
            ),
            (
                "[server]\nmax_snapshot_bytes = 9223372036854775807",
                "server.max_snapshot_bytes",
            ),
            (
                "[server]\nmax_in_flight = 9223372036854775807",
                "server.max_in_flight",
            ),
            (
                "[server]\nshutdown_pause_ms = 9223372036854775807",
                "server.shutdown_pause_ms",
            ),
            ("[server]\ndrain_timeout_ms = 0", "server.drain_timeout_ms"),
            (
                "[server]\nrequest_deadline_ms = 9223372036854775807",
                "server.request_deadline_ms",
            ),
            (
                "[cache.real_phone]\ncapacity = 9223372036854775807",
                "cache.real_phone.capacity",
            ),
            (
                "[cache.calltracking]\nmax_stale_s = 9223372036854775807",
                "cache.calltracking.max_stale_s",
            ),
            ("[cache.anonymous]\nttl_s = 0", "cache.anonymous.ttl_s"),
            (
                "[upstreams.real_phone]\nmax_in_flight = 9223372036854775807",
                "upstreams.real_phone.max_in_flight",
            ),
            (
                "[upstreams.calltracking.status_feed]\ninterval_ms = 9223372036854775807",
                "upstreams.calltracking.status_feed.interval_ms",
            ),
            (
                "[upstreams.calltracking.status_feed]\nlease_ttl_ms = 100",
                "upstreams.calltracking.status_feed.lease_ttl_ms",
            ),
            (
                "[upstreams.calltracking.status_feed]\nlease_ttl_ms = 10000",
                "upstreams.calltracking.status_feed.lease_ttl_ms",
            ),
            (
                "[rate_limit]\nper_viewer_per_minute = 4294967295",
                "rate_limit.per_viewer_per_minute",
            ),
            (
                "[database]\nsync_interval_ms = 9223372036854775807",
                "database.sync_interval_ms",
            ),
            (
                "[database]\nstatement_timeout_ms = 0",
                "database.statement_timeout_ms",
            ),
            (
                "[database]\nstatement_timeout_ms = 9223372036854775807",
                "database.statement_timeout_ms",
            ),
            (
                "[database]\nlock_timeout_ms = 5",
                "database.lock_timeout_ms",
            ),
            (
                "[database]\nstatement_timeout_ms = 1000\nlock_timeout_ms = 2000",
                "database.lock_timeout_ms",
            ),
            ("[tracing]\nsample_ratio = 1.5", "tracing.sample_ratio"),
            ("[tracing]\nsample_ratio = -0.1", "tracing.sample_ratio"),
            ("[tracing]\nsample_ratio = nan", "tracing.sample_ratio"),
        ] {
            let e = error_of(toml);
            assert!(e.contains(key), "{toml}: {e}");
        }
    }

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
    fn upstream_concurrency_defaults_to_the_public_bound() {
        let c = Config::from_toml("[server]\nmax_in_flight = 64").unwrap();
        assert_eq!(
            c.upstreams
                .real_phone
                .max_in_flight_or(c.server.max_in_flight),
            64
        );
        let c = Config::from_toml("[upstreams.anonymous]\nmax_in_flight = 7").unwrap();
        assert_eq!(
            c.upstreams
                .anonymous
                .max_in_flight_or(c.server.max_in_flight),
            7
        );
        assert_eq!(
            c.upstreams
                .real_phone
                .max_in_flight_or(c.server.max_in_flight),
            4096
        );
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let e = Config::load(Some(Path::new("/nonexistent/gw.toml"))).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/gw.toml"));
    }

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
        for endpoint in [
            "otel-collector:4318",
            "grpc://collector:4317",
            "http://c:4318/?x=1",
            "not a url",
        ] {
            let e = error_of(&format!("[tracing]\notlp_endpoint = \"{endpoint}\""));
            assert!(e.contains("tracing.otlp_endpoint"), "{endpoint}: {e}");
        }
    }

    /// The sample configuration of the contract (verbatim but for two comments
    /// that cited its sections): every section of it parses and validates,
    /// `[tracing]` included.
    #[test]
    fn the_documented_sample_configuration_parses_and_validates() {
        const SAMPLE: &str = r#"
[server]
public_addr = "0.0.0.0:8080"
admin_addr = "0.0.0.0:8081"
max_body_bytes = 1048576

[admin]
token = ""            # usually from the environment

[database]
url = "sqlite://phones-gateway.db?mode=rwc"   # or postgres://...

[upstreams.real_phone]
base_url = "http://127.0.0.1:9101"
timeout_ms = 300

[upstreams.anonymous]
base_url = "http://127.0.0.1:9102"
timeout_ms = 300
on_error = "fail_closed"

[upstreams.calltracking]
base_url = "http://127.0.0.1:9103"
timeout_ms = 300
on_error = "fall_through"

[upstreams.calltracking.status_feed]
enabled = false
interval_ms = 1000

[selection]
order = ["anonymous", "calltracking", "real"]
anonymous_categories = [9, 24]

[cache.real_phone]          # likewise [cache.anonymous], [cache.calltracking]
capacity = 5000000
ttl_s = 900
negative_ttl_s = 60
max_stale_s = 3600

[rate_limit]
per_viewer_per_minute = 0   # 0 = off

[tracing]
otlp_endpoint = ""          # e.g. "http://otel-collector:4318"; empty = no export
sample_ratio = 0.01

[reveals]
enabled = true
flush_interval_ms = 1000
max_buffered = 1000000
on_overflow = "drop"        # or "refuse"
retention_days = 30
"#;
        let c = Config::from_toml(SAMPLE).unwrap();
        assert_eq!(c.tracing.otlp_endpoint, "");
        assert!((c.tracing.sample_ratio - 0.01).abs() < f64::EPSILON);
        assert_eq!(
            c.upstreams.calltracking.upstream.base_url,
            "http://127.0.0.1:9103"
        );
        assert_eq!(c.reveals.retention_days, 30);
    }
}
