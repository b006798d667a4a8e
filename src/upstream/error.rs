//! `UpstreamError`: every way an upstream call can fail, as one cheap, cloneable
//! value (coalesced waiters all receive the same failure), and its class
//! ([`Class`]): the upstream's *verdict* on the call, or *undecided*.
//!
//! The line (docs/rules.md, "Verdict or undecided"): a source has *failed* only on
//! its own upstream's word: an error answer that is not a load refusal, an answer
//! that does not validate, a connection the upstream refused or reset, no answer
//! in time once the upstream was asked, or its breaker open after failures for
//! many sellers. Everything else is *undecided*: the gateway did not ask, or
//! could not, for a reason of its own (a bound on calls in flight, its own file
//! descriptors, ports, memory or host lookup, a fetch that panicked or was
//! cancelled, a request it could not build), or the upstream refused load (429,
//! or 503 with `Retry-After`). [`UpstreamError::class`] is one `match` without a
//! wildcard: a new variant does not compile until it is given a class. Each error
//! is classified where it arises (the pool maps `errno`, the call tracks its
//! phase for a timeout, the cache knows a panic from a cancellation), so the
//! class is never guessed from a message.

use std::fmt;

use crate::domain::Source;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// No complete answer within the upstream's timeout, the upstream having
    /// been asked (its address known, a connection being opened or used).
    #[error("timed out")]
    Timeout,
    /// The timeout ran out while the call was still in the gateway's own phase
    /// (the host lookup, on the blocking pool, or waiting for it): the upstream
    /// never had the chance to answer.
    #[error("timed out before the upstream was asked")]
    LocalTimeout,
    /// The upstream refused or reset the connection, or it broke mid-answer.
    #[error("connection failed: {0}")]
    Connect(String),
    /// The gateway's own trouble opening a connection: out of file descriptors
    /// (EMFILE, ENFILE), local ports (EADDRNOTAVAIL), buffers or memory
    /// (ENOBUFS, ENOMEM), or its own host lookup failing.
    #[error("could not open a connection (local): {0}")]
    Local(String),
    /// An HTTP status the contract does not allow.
    #[error("unexpected status {0}")]
    Status(u16),
    /// The upstream refused load: 429, or 503 with `Retry-After`. No word on
    /// the seller.
    #[error("load refused with status {0}")]
    LoadRefused(u16),
    /// A body that does not parse, or a phone that does not normalise. Only the
    /// kind of failure, never content: a parser's message quotes the body, and
    /// the body may hold a number (docs/README.md#privacy), so this cannot carry a `String`.
    #[error("bad answer: {0}")]
    Decode(&'static str),
    /// The circuit breaker is open: the upstream was not called. A breaker opens
    /// only on verdicts about several distinct sellers (`breaker.min_sellers`),
    /// so its being open is the upstream's verdict too.
    #[error("circuit open")]
    CircuitOpen,
    /// The upstream's bound on calls in flight is reached: it was not called.
    #[error("too many calls in flight")]
    Saturated,
    /// `max_in_flight_per_seller` calls to this upstream about this seller are
    /// under way: it was not called.
    #[error("too many calls in flight for this seller")]
    SellerSaturated,
    /// The fetch panicked (a bug): no word from the upstream.
    #[error("fetch panicked")]
    Panicked,
    /// The fetch's task was dropped before it ended (the runtime shutting down).
    #[error("fetch cancelled")]
    Cancelled,
    /// The gateway could not build the request (a bug: the URI is checked at
    /// start and the rest is ids and digits).
    #[error("could not build the request")]
    Request,
}

/// Whose word an ended call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The upstream's own word on the call: the source has failed, its
    /// `on_error` applies, the breaker counts it.
    Verdict,
    /// No word from the upstream: the source is undecided (nothing below it
    /// is revealed) and no breaker counts it.
    Undecided,
}

impl UpstreamError {
    /// The class of this error: one exhaustive match, no wildcard.
    pub fn class(&self) -> Class {
        match self {
            UpstreamError::Timeout
            | UpstreamError::Connect(_)
            | UpstreamError::Status(_)
            | UpstreamError::Decode(_)
            | UpstreamError::CircuitOpen => Class::Verdict,
            UpstreamError::LocalTimeout
            | UpstreamError::Local(_)
            | UpstreamError::LoadRefused(_)
            | UpstreamError::Saturated
            | UpstreamError::SellerSaturated
            | UpstreamError::Panicked
            | UpstreamError::Cancelled
            | UpstreamError::Request => Class::Undecided,
        }
    }

    /// Not the upstream's verdict (docs/rules.md): the source is undecided.
    pub fn undecided(&self) -> bool {
        self.class() == Class::Undecided
    }

    /// A short label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Timeout => "timeout",
            UpstreamError::LocalTimeout => "local_timeout",
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Local(_) => "local",
            UpstreamError::Status(_) => "status",
            UpstreamError::LoadRefused(_) => "load_refused",
            UpstreamError::Decode(_) => "decode",
            UpstreamError::CircuitOpen => "circuit_open",
            UpstreamError::Saturated => "saturated",
            UpstreamError::SellerSaturated => "seller_saturated",
            UpstreamError::Panicked => "panicked",
            UpstreamError::Cancelled => "cancelled",
            UpstreamError::Request => "request",
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

#[cfg(test)]
mod tests {
    use super::Class::{Undecided, Verdict};
    use super::*;

    /// Every variant, its class and its label: the list docs/rules.md shows.
    #[test]
    fn every_error_kind_has_its_class() {
        let table = [
            (UpstreamError::Timeout, Verdict, "timeout"),
            (UpstreamError::Connect("reset".into()), Verdict, "connect"),
            (UpstreamError::Status(500), Verdict, "status"),
            (UpstreamError::Status(503), Verdict, "status"),
            (
                UpstreamError::Decode("invalid JSON body"),
                Verdict,
                "decode",
            ),
            (UpstreamError::CircuitOpen, Verdict, "circuit_open"),
            (UpstreamError::LocalTimeout, Undecided, "local_timeout"),
            (UpstreamError::Local("EMFILE".into()), Undecided, "local"),
            (UpstreamError::LoadRefused(429), Undecided, "load_refused"),
            (UpstreamError::LoadRefused(503), Undecided, "load_refused"),
            (UpstreamError::Saturated, Undecided, "saturated"),
            (
                UpstreamError::SellerSaturated,
                Undecided,
                "seller_saturated",
            ),
            (UpstreamError::Panicked, Undecided, "panicked"),
            (UpstreamError::Cancelled, Undecided, "cancelled"),
            (UpstreamError::Request, Undecided, "request"),
        ];
        for (error, class, kind) in table {
            assert_eq!(error.class(), class, "{error:?}");
            assert_eq!(error.undecided(), class == Undecided, "{error:?}");
            assert_eq!(error.kind(), kind, "{error:?}");
        }
    }
}
