//! `[runtime]`: the tokio runtime's worker threads.

use serde::Deserialize;

use super::check::Checks as _;
use super::error::Mistake;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    pub worker_threads: usize,
}

impl RuntimeConfig {
    pub(super) fn validate(&self, found: &mut Vec<Mistake>) {
        found.range("runtime.worker_threads", self.worker_threads, 0..=1024);
    }
}
