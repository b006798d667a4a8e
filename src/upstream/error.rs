//! `UpstreamError`: every way an upstream call can fail, as one cheap, cloneable
//! value (coalesced waiters all receive it). What follows from each: `ending`.
//! Each is made where it arises, so the class is never guessed from a message.

use std::fmt;

use super::ending::Ending;
use crate::domain::{Failure, Source};

/// What each variant means, and its class: docs/rules.md's table, "Verdict
/// or undecided" (held to `ending` by the docs test).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    #[error("timed out")]
    Timeout,
    #[error("timed out in time the gateway lost")]
    LostTime,
    #[error("failed under load the gateway put on the upstream")]
    Load,
    #[error("backing off")]
    BackingOff,
    #[error("timed out before the upstream was asked")]
    LocalTimeout,
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("could not open a connection (local): {0}")]
    Local(String),
    #[error("unexpected status {0}")]
    Status(u16),
    #[error("load refused with status {0}")]
    LoadRefused(u16),
    /// Only the kind of a bad body, never content: the body may hold a number
    /// (docs/README.md#privacy), so this cannot carry a `String`.
    #[error("bad answer: {0}")]
    Decode(&'static str),
    #[error("circuit open")]
    CircuitOpen,
    #[error("circuit half-open, its probes undecided")]
    HalfOpen,
    #[error("too many calls in flight")]
    Saturated,
    #[error("too many calls in flight for this seller")]
    SellerSaturated,
    #[error("fetch panicked")]
    Panicked,
    #[error("fetch cancelled")]
    Cancelled,
    #[error("could not build the request")]
    Request,
}

/// Whose word an ended call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The upstream's word: the source failed, its `on_error` applies.
    Verdict,
    /// No word from the upstream: the source is undecided.
    Undecided,
}

impl UpstreamError {
    pub fn failure(&self) -> Failure {
        Ending::Failed(self)
            .row()
            .failure
            .unwrap_or(Failure::Gateway)
    }

    pub fn class(&self) -> Class {
        if self.failure().is_verdict() {
            Class::Verdict
        } else {
            Class::Undecided
        }
    }

    /// Not the upstream's verdict: the source is undecided.
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
    /// A number source's upstream ([`Source::upstream_name`]).
    Source(Source),
    /// Call tracking's status feed.
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
    /// counts it.
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
