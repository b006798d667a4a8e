//! The request limits: a batch's items, and a route's body limit from `[server]`.

use crate::config::ServerConfig;

/// Items a batch may hold.
pub const MAX_BATCH_ITEMS: usize = 100;

/// The body limits of a route, which the extractors apply and a 413 names.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit {
    /// Over it, a 413 naming this limit.
    pub max_bytes: usize,
    /// The longest wait for the body's next bytes (else 408).
    pub read_timeout: std::time::Duration,
    /// The whole body's (else 408); for a JSON route, `read_timeout` itself.
    pub total_timeout: std::time::Duration,
}

/// Every JSON route but the snapshot.
pub fn json_body(server: &ServerConfig) -> BodyLimit {
    BodyLimit {
        max_bytes: server.max_body_bytes,
        read_timeout: server.body_read_timeout,
        total_timeout: server.body_read_timeout,
    }
}

/// The streamed snapshot PUT's: `read_timeout` between chunks, the whole
/// within `server.snapshot_body_timeout_ms`.
pub fn snapshot_body(server: &ServerConfig) -> BodyLimit {
    BodyLimit {
        max_bytes: server.max_snapshot_bytes,
        read_timeout: server.body_read_timeout,
        total_timeout: server.snapshot_body_timeout,
    }
}
