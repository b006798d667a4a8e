//! `UpstreamError`: every way an upstream call can fail, as one cheap, cloneable
//! value (coalesced waiters all receive the same failure).

use std::fmt;

use crate::domain::Source;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// No complete answer within the upstream's timeout.
    #[error("timed out")]
    Timeout,
    /// Could not connect, or the connection broke.
    #[error("connection failed: {0}")]
    Connect(String),
    /// An HTTP status the contract does not allow.
    #[error("unexpected status {0}")]
    Status(u16),
    /// A body that does not parse, or a phone that does not normalise. Only the
    /// kind of failure, never content: a parser's message quotes the body, and
    /// the body may hold a number (docs/README.md#privacy), so this cannot carry a `String`.
    #[error("bad answer: {0}")]
    Decode(&'static str),
    /// The circuit breaker is open: the upstream was not called.
    #[error("circuit open")]
    CircuitOpen,
    /// `max_in_flight` calls to this upstream are under way: it was not called.
    #[error("too many calls in flight")]
    Saturated,
    /// `max_in_flight_per_seller` calls to this upstream about this seller are
    /// under way: it was not called.
    #[error("too many calls in flight for this seller")]
    SellerSaturated,
    /// The fetch task itself died (a bug); treated as any other failure.
    #[error("fetch task failed")]
    Internal,
}

impl UpstreamError {
    /// The gateway did not ask, for a reason of its own (a bound on calls in
    /// flight reached): the upstream has not failed, so the source is undecided
    /// rather than failed (docs/rules.md). A breaker is not such a reason: each
    /// endpoint's breaker opens on that endpoint's own failures only.
    pub fn refused(&self) -> bool {
        matches!(
            self,
            UpstreamError::Saturated | UpstreamError::SellerSaturated
        )
    }

    /// A short label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Timeout => "timeout",
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Status(_) => "status",
            UpstreamError::Decode(_) => "decode",
            UpstreamError::CircuitOpen => "circuit_open",
            UpstreamError::Saturated => "saturated",
            UpstreamError::SellerSaturated => "seller_saturated",
            UpstreamError::Internal => "internal",
        }
    }
}

/// Which upstream a call went to; names appear in logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamName {
    /// A number source's upstream, named as its `[upstreams.*]` section
    /// ([`Source::upstream_name`]).
    Source(Source),
    /// Call tracking's status feed: its base URL, a client of its own.
    StatusFeed,
}

impl UpstreamName {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamName::Source(source) => source.upstream_name(),
            UpstreamName::StatusFeed => "status_feed",
        }
    }
}

impl fmt::Display for UpstreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
