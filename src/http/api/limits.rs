//! The request limits: the items a batch may hold, and a route's body limit
//! (its size and read timeouts, from `[server]`), which the extractors apply
//! and a 413 names.

use crate::config::ServerConfig;

/// Items a batch may hold (the public batch route, and the extractor that
/// stops keeping items past it).
pub const MAX_BATCH_ITEMS: usize = 100;

/// The body limits of a route, recorded as a request extension so the extractors
/// can apply them and a 413 can say the size.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    /// The most bytes the body may hold: over it, a 413 naming this limit.
    pub max_bytes: usize,
    /// The longest wait for the body's next bytes (a slow client gets 408).
    pub read_timeout: std::time::Duration,
    /// The whole body must arrive within this time (a 408 otherwise). For a
    /// JSON route, `read_timeout` itself: its body is read whole.
    pub total_timeout: std::time::Duration,
}

/// The body limit of every JSON route but the snapshot: `server.max_body_bytes`
/// within `server.body_read_timeout_ms`.
pub fn json_body(server: &ServerConfig) -> BodyLimit {
    BodyLimit {
        max_bytes: server.max_body_bytes,
        read_timeout: server.body_read_timeout,
        total_timeout: server.body_read_timeout,
    }
}

/// The streamed snapshot PUT's: `server.max_snapshot_bytes`, chunks at most
/// `server.body_read_timeout_ms` apart, the whole within
/// `server.snapshot_body_timeout_ms`.
pub fn snapshot_body(server: &ServerConfig) -> BodyLimit {
    BodyLimit {
        max_bytes: server.max_snapshot_bytes,
        read_timeout: server.body_read_timeout,
        total_timeout: server.snapshot_body_timeout,
    }
}
