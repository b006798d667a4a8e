//! `UpstreamError`: every way an upstream call can fail, as one cheap, cloneable
//! value (coalesced waiters all receive it). What follows from each: `ending`.
//! Each is made where it arises, so the class is never guessed from a message.

use std::fmt;

use crate::domain::Source;

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
    use super::*;

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
