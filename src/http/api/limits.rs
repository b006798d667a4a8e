//! The request limits the routers, the extractors and the handlers all read:
//! a leaf of the API, so that the extractors need not reach up to the
//! handlers (or the routers) for a bound.

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

/// The request limits of `[server]`, held in both routers' states: the JSON
/// extractor takes the body limit from there (`FromRef`), the snapshot route its
/// own, and a 413 names the limit it enforced.
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// `server.max_body_bytes`: every JSON body but the snapshot's (the
    /// routers' `DefaultBodyLimit` and the JSON extractor).
    pub max_body_bytes: usize,
    /// `server.max_snapshot_bytes`: the snapshot PUT, which streams its body.
    pub max_snapshot_bytes: usize,
    /// `server.max_header_bytes`: the fronts' header limit (a 431 over it).
    pub max_header_bytes: usize,
    /// `server.body_read_timeout_ms`: a whole body must arrive within this
    /// (a 408 otherwise).
    pub body_read_timeout: std::time::Duration,
    /// `server.snapshot_body_timeout_ms`: the whole snapshot body must arrive
    /// within this (a 408 otherwise).
    pub snapshot_body_timeout: std::time::Duration,
    /// `server.max_snapshot_uploads`: snapshot PUTs in flight at once.
    pub max_snapshot_uploads: usize,
}

impl From<&ServerConfig> for RequestLimits {
    fn from(server: &ServerConfig) -> Self {
        RequestLimits {
            max_body_bytes: server.max_body_bytes,
            max_snapshot_bytes: server.max_snapshot_bytes,
            max_header_bytes: server.max_header_bytes,
            body_read_timeout: server.body_read_timeout,
            snapshot_body_timeout: server.snapshot_body_timeout,
            max_snapshot_uploads: server.max_snapshot_uploads,
        }
    }
}

impl RequestLimits {
    /// Every JSON route but the snapshot.
    pub fn body(&self) -> BodyLimit {
        BodyLimit {
            max_bytes: self.max_body_bytes,
            read_timeout: self.body_read_timeout,
            total_timeout: self.body_read_timeout,
        }
    }
    /// The streamed snapshot PUT.
    pub fn snapshot(&self) -> BodyLimit {
        BodyLimit {
            max_bytes: self.max_snapshot_bytes,
            read_timeout: self.body_read_timeout,
            total_timeout: self.snapshot_body_timeout,
        }
    }
}
