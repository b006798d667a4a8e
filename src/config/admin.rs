//! `[admin]`: who may call the admin API (docs/admin-access.md). Token files are
//! read at start by [`AdminConfig::read_tokens`] and re-read by `http::api::access`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::{ConfigError, Mistake, invalid};
use super::secret::Secret;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Every scope. Empty: no such token (never that the routes are open).
    pub token: Secret,
    #[serde(default)]
    pub tokens: Vec<NamedTokenConfig>,
}

/// One `[[admin.tokens]]` entry, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedTokenConfig {
    pub name: String,
    #[serde(default)]
    pub token: Option<Secret>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Scopes as written; [`Scope::parse`] names an unknown one.
    pub scopes: Vec<String>,
}

/// What an admin route needs its caller's token to carry (docs/admin-access.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    StatusesRead,
    StatusesWrite,
    CacheInvalidate,
    RevealsRead,
    Debug,
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::StatusesRead,
        Scope::StatusesWrite,
        Scope::CacheInvalidate,
        Scope::RevealsRead,
        Scope::Debug,
    ];

    /// The scope as configured and documented (`statuses:read`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::StatusesRead => "statuses:read",
            Scope::StatusesWrite => "statuses:write",
            Scope::CacheInvalidate => "cache:invalidate",
            Scope::RevealsRead => "reveals:read",
            Scope::Debug => "debug",
        }
    }

    pub fn parse(text: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == text)
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of scopes, one bit each: what a token may do, tested per request
/// with one AND.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    pub const ALL: Scopes = {
        let mut bits = 0;
        let mut i = 0;
        while i < Scope::ALL.len() {
            bits |= Scope::ALL[i].bit();
            i += 1;
        }
        Scopes(bits)
    };

    pub fn of(scopes: impl IntoIterator<Item = Scope>) -> Scopes {
        Scopes(scopes.into_iter().fold(0, |bits, s| bits | s.bit()))
    }

    pub const fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }
}

/// A token as the admin listener holds it: name (`admin.token` for the one with
/// every scope), value, scopes, and the file it is re-read from, if any.
#[derive(Debug, Clone)]
pub struct AdminToken {
    pub name: String,
    pub value: Secret,
    pub scopes: Scopes,
    pub file: Option<PathBuf>,
}

/// The name `admin.token` goes by in logs and metrics (a named token's name
/// cannot contain a dot, so it cannot be taken).
pub const ADMIN_TOKEN_NAME: &str = "admin.token";

/// Longest `[[admin.tokens]]` name.
const MAX_NAME_LEN: usize = 64;

impl AdminConfig {
    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        // Verbatim (nothing trimmed), so a value a header cannot carry is refused
        // rather than never matching.
        if !self.token.is_empty() {
            if let Some(problem) = token_problem(self.token.expose()) {
                found.push(invalid("admin.token", format!("the token {problem}")));
            }
        }
        for (i, entry) in self.tokens.iter().enumerate() {
            let key = |field: &str| format!("admin.tokens[{i}].{field}");
            let name = &entry.name;
            if name.is_empty()
                || name.len() > MAX_NAME_LEN
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            {
                found.push(invalid(
                    key("name"),
                    format!("must be 1 to {MAX_NAME_LEN} of a-z 0-9 - _, got {name:?}"),
                ));
            }
            if let Some(first) = self.tokens[..i].iter().position(|e| e.name == *name) {
                found.push(invalid(
                    key("name"),
                    format!("{name:?} is already the name of admin.tokens[{first}]"),
                ));
            }
            match (&entry.token, &entry.token_file) {
                (Some(_), Some(_)) | (None, None) => found.push(invalid(
                    key("token"),
                    format!("{name:?}: set exactly one of token and token_file"),
                )),
                (Some(token), None) => {
                    if let Some(problem) = token_problem(token.expose()) {
                        found.push(invalid(
                            key("token"),
                            format!("{name:?}: the token {problem}"),
                        ));
                    }
                }
                _ => {}
            }
            for scope in &entry.scopes {
                if Scope::parse(scope).is_none() {
                    let known: Vec<_> = Scope::ALL.iter().map(|s| s.as_str()).collect();
                    found.push(invalid(
                        key("scopes"),
                        format!(
                            "{name:?}: unknown scope {scope:?} (known: {})",
                            known.join(", ")
                        ),
                    ));
                }
            }
        }
    }

    /// Every token the admin listener starts with: `admin.token` (when not
    /// empty) with every scope, then each named token, its file read now. Fails
    /// on an unreadable or empty file, or a value two entries share.
    pub fn read_tokens(&self) -> Result<Vec<AdminToken>, ConfigError> {
        let mut found = Vec::new();
        let mut tokens: Vec<AdminToken> = Vec::new();
        let mut keys: Vec<String> = Vec::new();
        if !self.token.is_empty() {
            tokens.push(AdminToken {
                name: ADMIN_TOKEN_NAME.to_owned(),
                value: self.token.clone(),
                scopes: Scopes::ALL,
                file: None,
            });
            keys.push("admin.token".to_owned());
        }
        for (i, entry) in self.tokens.iter().enumerate() {
            let (key, value) = match (&entry.token, &entry.token_file) {
                (Some(token), _) => (format!("admin.tokens[{i}].token"), token.clone()),
                (None, Some(file)) => {
                    let key = format!("admin.tokens[{i}].token_file");
                    match read_token_file(file) {
                        Ok(value) => (key, value),
                        Err(reason) => {
                            found.push(invalid(key, format!("{:?}: {reason}", entry.name)));
                            continue;
                        }
                    }
                }
                (None, None) => continue,
            };
            if let Some(first) = tokens
                .iter()
                .position(|t| t.value.expose() == value.expose())
            {
                found.push(invalid(
                    key,
                    format!(
                        "{:?}: the same token as {} (each entry needs its own)",
                        entry.name, keys[first]
                    ),
                ));
                continue;
            }
            tokens.push(AdminToken {
                name: entry.name.clone(),
                value,
                scopes: Scopes::of(entry.scopes.iter().filter_map(|s| Scope::parse(s))),
                file: entry.token_file.clone(),
            });
            keys.push(key);
        }
        if found.is_empty() {
            Ok(tokens)
        } else {
            Err(ConfigError::Invalid(found))
        }
    }
}

/// Why `value` cannot be a bearer token, if it cannot; `None` for a value an
/// `Authorization: Bearer <token>` header carries as it is (docs/admin-access.md,
/// "What a token may hold"). The reason never quotes the value.
pub(super) fn token_problem(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        return Some("is empty");
    }
    let bytes = value.as_bytes();
    if bytes.iter().any(u8::is_ascii_whitespace) {
        return Some(
            "holds whitespace (a space, tab or line ending), which a bearer token in an \
             Authorization header cannot carry",
        );
    }
    if bytes.iter().any(u8::is_ascii_control) {
        return Some("holds a control character, which an Authorization header cannot carry");
    }
    if !value.is_ascii() {
        return Some("holds a character outside ASCII, which an Authorization header cannot carry");
    }
    None
}

/// A token file's value, trimmed, which must then pass [`token_problem`]. An
/// error names the file, never the value.
pub fn read_token_file(path: &Path) -> Result<Secret, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value = text.trim_ascii();
    if value.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    if let Some(problem) = token_problem(value) {
        return Err(format!("{}: the token {problem}", path.display()));
    }
    Ok(Secret::new(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::tests::assert_refused;

    /// The tokens of `toml`, or the error reading them says.
    fn read_tokens(toml: &str) -> Result<Vec<AdminToken>, String> {
        let config = Config::from_toml(toml).unwrap();
        config.admin.read_tokens().map_err(|e| e.to_string())
    }

    #[test]
    fn scopes_parse_as_documented() {
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()), Some(scope));
            assert!(Scopes::ALL.contains(scope));
            assert!(!Scopes::default().contains(scope));
        }
        assert_eq!(Scope::parse("statuses"), None);
        let some = Scopes::of([Scope::Debug]);
        assert!(some.contains(Scope::Debug) && !some.contains(Scope::RevealsRead));
    }

    #[test]
    fn bad_entries_are_refused_naming_the_key() {
        let long_name = format!(
            "[[admin.tokens]]\nname = \"{}\"\ntoken = \"x\"\nscopes = []",
            "a".repeat(65)
        );
        #[rustfmt::skip]
        let cases = [
            ("[[admin.tokens]]\nname = \"a\"\ntoken = \"x\"\nscopes = [\"statuses:wrote\"]", "admin.tokens[0].scopes"),
            ("[[admin.tokens]]\nname = \"a\"\ntoken = \"x\"\nscopes = []\n\
              [[admin.tokens]]\nname = \"a\"\ntoken = \"y\"\nscopes = []", "admin.tokens[1].name"),
            ("[[admin.tokens]]\nname = \"A b\"\ntoken = \"x\"\nscopes = []", "admin.tokens[0].name"),
            (long_name.as_str(), "admin.tokens[0].name"),
            ("[[admin.tokens]]\nname = \"a\"\nscopes = []", "admin.tokens[0].token"),
            ("[[admin.tokens]]\nname = \"a\"\ntoken = \"x\"\ntoken_file = \"/f\"\nscopes = []", "admin.tokens[0].token"),
            ("[[admin.tokens]]\nname = \"a\"\ntoken = \"\"\nscopes = []", "admin.tokens[0].token"),
            ("[[admin.tokens]]\nname = \"a\"\ntoken = \"x y\"\nscopes = []", "admin.tokens[0].token"),
            ("[admin]\ntoken = \"0123456789\\n\"", "admin.token"),
            ("[admin]\ntoken = \" 0123456789\"", "admin.token"),
        ];
        assert_refused(&cases);
        // Verbatim: not trimmed, not read as a number.
        let tokens = read_tokens("[admin]\ntoken = \"0123456789\"").unwrap();
        assert_eq!(tokens[0].value.expose(), "0123456789");
        let ok = "[[admin.tokens]]\nname = \"calltracking-sync_2\"\ntoken = \"x\"\n\
                  scopes = [\"statuses:write\", \"debug\"]";
        let tokens = read_tokens(ok).unwrap();
        assert_eq!(tokens.len(), 1);
        let scopes = Scopes::of([Scope::StatusesWrite, Scope::Debug]);
        assert_eq!(tokens[0].scopes, scopes);
    }

    #[test]
    fn start_refuses_a_shared_token_and_an_unreadable_file() {
        let dir = std::env::temp_dir().join(format!("pg-admin-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t");
        std::fs::write(&file, "s3cr3t-value\n").unwrap();
        let shared = format!(
            "[admin]\ntoken = \"s3cr3t-value\"\n[[admin.tokens]]\nname = \"a\"\n\
             token_file = {file:?}\nscopes = []"
        );
        let e = read_tokens(&shared).unwrap_err();
        let both = e.contains("admin.tokens[0].token_file") && e.contains("admin.token");
        assert!(both, "{e}");
        assert!(!e.contains("s3cr3t"), "the value is never printed: {e}");
        let missing = format!(
            "[[admin.tokens]]\nname = \"a\"\ntoken_file = {:?}\nscopes = []",
            dir.join("missing")
        );
        let e = read_tokens(&missing).unwrap_err();
        assert!(e.contains("admin.tokens[0].token_file"), "{e}");
        std::fs::write(&file, "\n").unwrap();
        let empty = format!("[[admin.tokens]]\nname = \"a\"\ntoken_file = {file:?}\nscopes = []");
        let e = read_tokens(&empty).unwrap_err();
        assert!(e.contains("is empty"), "{e}");
        for uncarried in ["s3cr3t value\n", "s3cr3t\tvalue", "s3cr3t\u{7f}", "s3cr3té"] {
            std::fs::write(&file, uncarried).unwrap();
            let e = read_tokens(&empty).unwrap_err();
            assert!(e.contains("admin.tokens[0].token_file"), "{e}");
            assert!(e.contains("cannot carry"), "{e}");
            assert!(!e.contains("s3cr3t"), "the value is never printed: {e}");
        }
        std::fs::write(&file, "\n\n  s3cr3t-value \r\n\n").unwrap();
        let tokens = read_tokens(&empty).unwrap();
        let dropped = "whitespace around it dropped";
        assert_eq!(tokens[0].value.expose(), "s3cr3t-value", "{dropped}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
