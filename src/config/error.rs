//! What a configuration that cannot run is reported as: [`ConfigError`], made of
//! [`Mistake`]s that each name their dotted key and where its value came from.

use std::fmt;

/// A configuration that cannot run: every mistake in it, each naming its key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {0} does not exist")]
    MissingFile(String),
    /// Every mistake found in one run, of extraction and validation alike.
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

/// A mistake at `key` (its source is filled in by loading).
pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Mistake {
    Mistake {
        key: key.into(),
        reason: reason.into(),
        source: None,
    }
}
