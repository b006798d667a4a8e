//! The environment's overrides (`PHONES_GATEWAY__` variables, secrets verbatim),
//! and the names that look meant for the gateway but are not read.

use figment::Figment;
use figment::providers::Env;

/// Prefix of environment overrides; `__` separates levels.
pub const ENV_PREFIX: &str = "PHONES_GATEWAY__";

/// Keys whose environment values are taken verbatim: figment would read
/// `0123456789` as a number (dropping the zero) and `true` as a boolean.
const SECRET_KEYS: [&str; 3] = ["admin.token", "database.url", "database.direct_url"];

/// Environment variables that look meant for the gateway but are not read
/// (`PHONES_GATEWAY_ADMIN__TOKEN`, one underscore), which figment passes over
/// in silence. Names only, sorted: values may be secrets.
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
pub(super) fn environment() -> Figment {
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::config::Config;

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
            let url = "postgres://gw:007@db/gw?sslmode=disable";
            jail.set_env("PHONES_GATEWAY__DATABASE__URL", url);
            let c = Config::load(None).expect("loads");
            assert_eq!(c.admin.token.expose(), "0123456789");
            assert_eq!(c.database.url.expose(), url);
            for verbatim in ["true", "[1,2]", "1e3"] {
                jail.set_env("PHONES_GATEWAY__ADMIN__TOKEN", verbatim);
                let c = Config::load(None).expect("loads");
                assert_eq!(c.admin.token.expose(), verbatim);
            }
            // Not trimmed either: spaces around a token are refused (a header
            // cannot carry them), not dropped.
            jail.set_env("PHONES_GATEWAY__ADMIN__TOKEN", "  spaced  ");
            let e = Config::load(None).expect_err("refused").to_string();
            assert!(e.contains("admin.token"), "{e}");
            jail.set_env("PHONES_GATEWAY__ADMIN__TOKEN", "0123456789");
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
}
