//! `[log]`: which log lines are written, and how.

use serde::Deserialize;

use super::error::{Mistake, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    pub filter: String,
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line (production).
    Json,
    /// Readable lines (the demo, a terminal).
    Text,
}

impl LogConfig {
    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&self.filter) {
            found.push(invalid(
                "log.filter",
                format!("not a tracing filter: {error}"),
            ));
        }
    }
}
