//! [`Secret`]: a string that never prints (tokens, database URLs with passwords).

use std::fmt;

use serde::Deserialize;

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
    /// Strings only: a secret read as a number would have lost its leading zeros
    /// (the environment's arrive verbatim: `env::SECRET_KEYS`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}
