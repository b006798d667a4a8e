//! The configuration tree: compiled-in defaults (`config/default.toml`), an
//! optional file, then `PHONES_GATEWAY__` environment variables; then validation
//! (docs/configuration.md). Each section is in its own file. Only [`Config::load`]
//! reads files and the environment; [`Config::from_figment`] is pure.

mod admin;
mod breaker;
mod cache;
mod check;
mod database;
mod env;
mod error;
mod log;
mod rate_limit;
mod reveals;
mod runtime;
mod secret;
mod selection;
mod server;
mod status_feed;
mod tracing;
mod units;
mod upstreams;

use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Toml};
use serde::Deserialize;

pub use crate::domain::{OnError, Source};
pub use admin::{
    ADMIN_TOKEN_NAME, AdminConfig, AdminToken, NamedTokenConfig, Scope, Scopes, read_token_file,
};
pub use breaker::BreakerConfig;
pub use cache::{CacheConfig, CachesConfig};
pub use database::DatabaseConfig;
pub use env::{ENV_PREFIX, mistyped_environment};
pub use error::{ConfigError, Mistake};
pub use log::{LogConfig, LogFormat};
pub use rate_limit::BudgetsConfig;
pub use reveals::{OnOverflow, RevealsConfig};
pub use runtime::RuntimeConfig;
pub use secret::Secret;
pub use selection::SelectionConfig;
pub use server::{MAX_CONNECTIONS, ServerConfig};
pub use status_feed::StatusFeedConfig;
pub use tracing::TracingConfig;
pub use upstreams::{CalltrackingUpstreamConfig, UpstreamConfig, UpstreamsConfig, seller_need};

use check::{Checks as _, MAX_WAIT_MS};

/// The documented defaults, key by key.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");
/// What the default `server.request_deadline_ms` adds to the upstream timeouts'
/// longest path: the chain's own scheduling, which does not grow with the
/// timeouts (docs/rules.md, "Concurrency and the deadline").
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(100);

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
    pub rate_limit: BudgetsConfig,
    pub runtime: RuntimeConfig,
    pub breaker: BreakerConfig,
    pub reveals: RevealsConfig,
    pub tracing: TracingConfig,
}

/// Rounds of [`Config::extract_noting_all`] before giving up on finding more.
const MAX_EXTRACTION_ROUNDS: usize = 64;

/// Where the value at `key` came from, for a mistake's message; `None` for the
/// built-in defaults. A list's element is found by the list's key.
fn source_of(figment: &Figment, key: &str) -> Option<String> {
    let key = key.split('[').next().unwrap_or(key);
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

/// The path of an extraction error without figment's profile, an unknown or
/// missing field included; a list's element is its index.
fn key_path(error: &figment::Error) -> Vec<String> {
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
    path
}

fn is_index(segment: &str) -> bool {
    !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit())
}

/// The key of an extraction error as documented: dotted, a list's element
/// by its index (`selection.order[1]`).
fn key_of(error: &figment::Error) -> String {
    let mut key = String::new();
    for segment in key_path(error) {
        if is_index(&segment) {
            key.push_str(&format!("[{segment}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(&segment);
        }
    }
    key
}

/// Puts the default value at `path` in `dict` (or removes the key when the
/// defaults have none: an unknown key, or an optional one). A mistake in a
/// list's element repairs the whole list. Returns whether anything changed.
fn repair(
    dict: &mut figment::value::Dict,
    path: &[String],
    defaults: &figment::value::Dict,
) -> bool {
    use figment::value::Value;
    let path = match path.iter().position(|segment| is_index(segment)) {
        Some(list) => &path[..list],
        None => path,
    };
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
    /// Defaults, then `file` if given, then the environment; validated.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            // Absolute, so every message names the file wherever it was run from
            // (figment would also search parent directories for a relative one).
            let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            if !path.is_file() {
                return Err(ConfigError::MissingFile(path.display().to_string()));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        Self::from_figment(figment.merge(env::environment()))
    }

    /// The built-in defaults with `overlay` (TOML text) merged over them.
    pub fn from_toml(overlay: &str) -> Result<Self, ConfigError> {
        Self::from_figment(Figment::from(Toml::string(DEFAULT_TOML)).merge(Toml::string(overlay)))
    }

    /// Extracts and validates `figment`, failing as [`Config::load`] does.
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

    /// After `first` failed: notes every mistake serde stops at, a round at a
    /// time with defaults in place of the faulty values, and returns what then
    /// extracts (to validate for the rest); `None` for data that is not TOML.
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

    /// Checks what types cannot; each section checks its own keys.
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
        // The one check across sections: an explicit deadline against the
        // upstreams' timeouts.
        if let Some(explicit) = self.server.request_deadline {
            let longest = self.longest_upstream_path();
            found.range_noting(
                "server.request_deadline_ms",
                explicit.as_millis(),
                longest.as_millis()..=MAX_WAIT_MS.into(),
                "at least the longest path through the upstream timeouts, \
                     max(anonymous, real_phone + calltracking)",
            );
        }
        self.admin.validate(&mut found);
        self.database.validate(&mut found);
        self.upstreams.validate(&mut found);
        self.selection.validate(&mut found);
        self.cache.validate(&mut found);
        self.rate_limit.validate(&mut found);
        self.runtime.validate(&mut found);
        self.log.validate(&mut found);
        self.breaker.validate(&mut found);
        self.reveals.validate(&mut found);
        self.tracing.validate(&mut found);
        found
    }

    /// [`UpstreamsConfig::longest_path`].
    pub fn longest_upstream_path(&self) -> Duration {
        self.upstreams.longest_path()
    }

    /// `server.request_deadline_ms`, or the longest upstream path plus
    /// [`DEADLINE_MARGIN`].
    pub fn request_deadline(&self) -> Duration {
        self.server
            .request_deadline
            .unwrap_or_else(|| self.longest_upstream_path() + DEADLINE_MARGIN)
    }

    /// The most descriptors the process's own calls hold at once, which the
    /// inbound cap keeps free (`server.max_connections`): each upstream's bound,
    /// 3 per SQLite connection (file, WAL, shared memory), and two beside the pool.
    pub fn outbound_descriptors(&self) -> usize {
        let server = self.server.max_in_flight;
        let upstreams: usize = Source::ALL
            .into_iter()
            .map(|source| self.upstreams.of(source).max_in_flight_or(server))
            .sum();
        let feed = if self.upstreams.calltracking.status_feed.enabled {
            2
        } else {
            0
        };
        let database =
            3 * (usize::try_from(self.database.max_connections).unwrap_or(usize::MAX) + 2);
        upstreams.saturating_add(feed).saturating_add(database)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What loading `toml` over the defaults refuses, as printed.
    pub(crate) fn error_of(toml: &str) -> String {
        Config::from_toml(toml).unwrap_err().to_string()
    }

    /// Each `(toml, key)`: refused, naming `key`.
    pub(crate) fn assert_refused(cases: &[(&str, &str)]) {
        for (toml, key) in cases {
            let e = error_of(toml);
            assert!(e.contains(key), "{toml}: {e}");
        }
    }

    /// Each `(section, key, value)`: `key = value` under `[section]` is
    /// refused, naming `section.key`.
    pub(crate) fn assert_refused_keys(cases: &[(&str, &str, &str)]) {
        for (section, key, value) in cases {
            let e = error_of(&format!("[{section}]\n{key} = {value}"));
            let named = format!("{section}.{key}");
            assert!(e.contains(&named), "[{section}] {key} = {value}: {e}");
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.server.public_addr.to_string(), "0.0.0.0:8080");
        assert_eq!(c.server.admin_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(c.server.max_body_bytes, 1 << 20);
        let order = [Source::Anonymous, Source::Calltracking, Source::RealPhone];
        assert_eq!(c.selection.order, order);
        assert_eq!(c.selection.anonymous_categories, [9, 24]);
        assert_eq!(c.upstreams.anonymous.on_error, OnError::FailClosed);
        let calltracking = &c.upstreams.calltracking.upstream;
        assert_eq!(calltracking.on_error, OnError::FallThrough);
        assert_eq!(c.upstreams.real_phone.timeout, Duration::from_millis(300));
        assert_eq!(c.cache.real_phone.capacity, 5_000_000);
        assert_eq!(c.cache.calltracking.capacity, 500_000);
        assert_eq!(c.cache.anonymous.capacity, 1_000_000);
        assert_eq!(c.cache.anonymous.ttl, Duration::from_secs(300));
        assert_eq!(c.cache.real_phone.negative_ttl, Duration::from_secs(60));
        assert_eq!(c.cache.real_phone.max_stale, Duration::from_secs(3600));
        assert!(c.admin.token.is_empty());
        let url = "sqlite://phones-gateway.db?mode=rwc";
        assert_eq!(c.database.url.expose(), url);
        assert_eq!(c.rate_limit.per_viewer_per_minute, 0);
    }

    #[test]
    fn errors_name_the_key() {
        assert_refused_keys(&[
            ("selection", "order", "[\"anonymous\", \"anonymous\"]"),
            ("upstreams.real_phone", "base_url", "\"not a url\""),
            ("upstreams.anonymous", "timeout_ms", "0"),
            ("cache.anonymous", "capacity", "0"),
            ("upstreams.anonymous", "on_error", "\"maybe\""),
            ("upstreams.calltracking", "on_error", "\"maybe\""),
            ("server", "public_adr", "\"0.0.0.0:1\""),
            ("selection", "anonymous_categories", "[0]"),
        ]);
        // A bad element of a list, by its index, among the other mistakes.
        let e = error_of(
            "[selection]\norder = [\"anonymous\", \"bogus\"]\n[cache.anonymous]\ncapacity = 0",
        );
        assert!(e.contains("selection.order[1]: unknown variant"), "{e}");
        assert!(e.contains("cache.anonymous.capacity"), "{e}");
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
            let on_error = &["fail_closed", "fall_through"][..];
            for (section, leaf, allowed) in [
                ("upstreams.calltracking", "on_error", on_error),
                ("upstreams.real_phone", "on_error", on_error),
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
    fn the_request_deadline_defaults_to_the_longest_upstream_path_and_a_margin() {
        let deadline = |toml: &str| Config::from_toml(toml).unwrap().request_deadline();
        assert_eq!(deadline(""), Duration::from_millis(700));
        let anonymous = "[upstreams.anonymous]\ntimeout_ms = 800";
        assert_eq!(deadline(anonymous), Duration::from_millis(900));
        let c =
            "[upstreams.real_phone]\ntimeout_ms = 250\n[upstreams.calltracking]\ntimeout_ms = 400";
        assert_eq!(deadline(c), Duration::from_millis(750));
        let server = |ms: u32| format!("[server]\nrequest_deadline_ms = {ms}");
        assert_eq!(deadline(&server(900)), Duration::from_millis(900));
        // The bare longest path may be set explicitly (no margin)...
        assert_eq!(deadline(&server(600)), Duration::from_millis(600));
        // ...but not less: refused, naming the key.
        assert_refused(&[
            (&server(599), "server.request_deadline_ms"),
            (
                &format!("{}\n{anonymous}", server(700)),
                "server.request_deadline_ms",
            ),
        ]);
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let e = Config::load(Some(Path::new("/nonexistent/gw.toml"))).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/gw.toml"));
    }

    /// The contract's sample configuration: every section parses and validates.
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
        let calltracking = &c.upstreams.calltracking.upstream;
        assert_eq!(calltracking.base_url, "http://127.0.0.1:9103");
        assert_eq!(c.reveals.retention_days, 30);
    }
}
