//! `UpstreamError`: every way an upstream call can fail, as one cheap, cloneable
//! value (coalesced waiters all receive the same failure). What follows from
//! each (its code, verdict or undecided, what a breaker and the adaptive bound
//! make of it) is the one table in `ending`; the line between the upstream's
//! word and the gateway's own trouble is docs/rules.md, "Verdict or
//! undecided". Each error is made where it arises (the pool maps `errno`, the
//! timer judges lost time, the back-off judges load, the cache knows a panic
//! from a cancellation), so the class is never guessed from a message.

use std::fmt;

use super::ending::Ending;
use crate::domain::{Failure, Source};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// No complete answer within the upstream's timeout, the upstream having
    /// been asked (its address known, a connection being opened or used).
    #[error("timed out")]
    Timeout,
    /// No answer in time, but the gateway lost time of its own during the call
    /// (its process paused or throttled, its timers late) beyond
    /// `upstreams.lost_time_tolerance_ms`, also after that time was given back
    /// once (`lost`).
    #[error("timed out in time the gateway lost")]
    LostTime,
    /// A health failure (no answer in time, a 5xx, a refused or reset
    /// connection) while the gateway was backing off from load it may have
    /// put on the upstream, before it could judge whose it was (`backoff`).
    #[error("failed under load the gateway put on the upstream")]
    Load,
    /// Not sent: the gateway is backing off this upstream, and the rate it
    /// backs off to is reached (`backoff`).
    #[error("backing off")]
    BackingOff,
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
    /// only on health failures about several distinct sellers in several
    /// requests (`breaker.min_sellers`, `breaker.min_requests`), so its being
    /// open is the upstream's verdict too.
    #[error("circuit open")]
    CircuitOpen,
    /// The breaker is half-open and its probes ended undecided: nothing has
    /// said yet whether the upstream is back, so the call is not made and
    /// says nothing either.
    #[error("circuit half-open, its probes undecided")]
    HalfOpen,
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
    /// The reason's code for this error ([`Ending::row`]).
    pub fn failure(&self) -> Failure {
        Ending::Failed(self)
            .row()
            .failure
            .unwrap_or(Failure::Gateway)
    }

    /// The class of this error, from its code.
    pub fn class(&self) -> Class {
        if self.failure().is_verdict() {
            Class::Verdict
        } else {
            Class::Undecided
        }
    }

    /// Not the upstream's verdict (docs/rules.md): the source is undecided.
    pub fn undecided(&self) -> bool {
        self.class() == Class::Undecided
    }

    /// The variant's name, for logs and the docs' table.
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Timeout => "timeout",
            UpstreamError::LocalTimeout => "local_timeout",
            UpstreamError::LostTime => "lost_time",
            UpstreamError::Load => "load",
            UpstreamError::BackingOff => "backing_off",
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Local(_) => "local",
            UpstreamError::Status(_) => "status",
            UpstreamError::LoadRefused(_) => "load_refused",
            UpstreamError::Decode(_) => "decode",
            UpstreamError::CircuitOpen => "circuit_open",
            UpstreamError::HalfOpen => "half_open",
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

    /// Every variant, its code, its class, its label, and whether a breaker
    /// counts it: the list docs/rules.md shows.
    #[test]
    fn every_error_kind_has_its_code_and_class() {
        use Failure as F;
        #[rustfmt::skip]
        let table = [
            (UpstreamError::Timeout,                     F::Timeout,     Verdict,   "timeout",          true),
            (UpstreamError::Connect("reset".into()),     F::Connect,     Verdict,   "connect",          true),
            (UpstreamError::Status(500),                 F::ErrorStatus, Verdict,   "status",           true),
            (UpstreamError::Status(503),                 F::ErrorStatus, Verdict,   "status",           true),
            (UpstreamError::Status(599),                 F::ErrorStatus, Verdict,   "status",           true),
            (UpstreamError::Status(302),                 F::ErrorStatus, Verdict,   "status",           false),
            (UpstreamError::Status(600),                 F::ErrorStatus, Verdict,   "status",           false),
            (UpstreamError::Status(400),                 F::Rejected,    Verdict,   "status",           false),
            (UpstreamError::Status(422),                 F::Rejected,    Verdict,   "status",           false),
            (UpstreamError::Status(499),                 F::Rejected,    Verdict,   "status",           false),
            // A 404 where none is allowed (the status feed's page) is no
            // rejection, nor is a 429 (never made: it is a load refusal).
            (UpstreamError::Status(404),                 F::ErrorStatus, Verdict,   "status",           false),
            (UpstreamError::Status(429),                 F::ErrorStatus, Verdict,   "status",           false),
            (UpstreamError::Decode("invalid JSON body"), F::Invalid,     Verdict,   "decode",           false),
            (UpstreamError::CircuitOpen,                 F::CircuitOpen, Verdict,   "circuit_open",     false),
            (UpstreamError::LostTime,                    F::LostTime,    Undecided, "lost_time",        false),
            (UpstreamError::Load,                        F::Load,        Undecided, "load",             false),
            (UpstreamError::LocalTimeout,                F::Gateway,     Undecided, "local_timeout",    false),
            (UpstreamError::Local("EMFILE".into()),      F::Gateway,     Undecided, "local",            false),
            (UpstreamError::LoadRefused(429),            F::LoadRefused, Undecided, "load_refused",     false),
            (UpstreamError::LoadRefused(503),            F::LoadRefused, Undecided, "load_refused",     false),
            (UpstreamError::Saturated,                   F::Bound,       Undecided, "saturated",        false),
            (UpstreamError::SellerSaturated,             F::Bound,       Undecided, "seller_saturated", false),
            (UpstreamError::Panicked,                    F::Gateway,     Undecided, "panicked",         false),
            (UpstreamError::Cancelled,                   F::Gateway,     Undecided, "cancelled",        false),
            (UpstreamError::Request,                     F::Gateway,     Undecided, "request",          false),
            (UpstreamError::HalfOpen,                    F::HalfOpen,    Undecided, "half_open",        false),
            (UpstreamError::BackingOff,                  F::Bound,       Undecided, "backing_off",      false),
        ];
        for (error, failure, class, kind, health) in table {
            assert_eq!(error.failure(), failure, "{error:?}");
            assert_eq!(error.class(), class, "{error:?}");
            assert_eq!(error.undecided(), class == Undecided, "{error:?}");
            assert_eq!(error.kind(), kind, "{error:?}");
            let down = Ending::Failed(&error).row().health == super::super::ending::Health::Down;
            assert_eq!(down, health, "{error:?}");
        }
    }

    /// The names logs and metric labels carry.
    #[test]
    fn every_upstream_has_its_name() {
        let table = [
            (UpstreamName::Source(Source::RealPhone), "real_phone"),
            (UpstreamName::Source(Source::Anonymous), "anonymous"),
            (UpstreamName::Source(Source::Calltracking), "calltracking"),
            (UpstreamName::StatusFeed, "status_feed"),
        ];
        for (name, text) in table {
            assert_eq!(name.as_str(), text);
            assert_eq!(name.to_string(), text);
        }
    }
}
