//! How a call ends, and everything that follows from it, in one table
//! ([`Ending::row`]): a new way to end is one arm of one `match`. The docs test
//! holds docs/rules.md's table ("Verdict or undecided") to [`table`].

use super::error::UpstreamError;
use super::limit::End;
use crate::domain::Failure;

#[derive(Debug, Clone, Copy)]
pub(super) enum Ending<'a> {
    /// 200 with a body of the right shape.
    Answered,
    /// 404: no number.
    NotFound,
    Failed(&'a UpstreamError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Health {
    Up,
    /// A sign of ill health: judged by the back-off first (`backoff`).
    Down,
    Silent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Row {
    /// The reason's code; `None` for an answer.
    pub(super) failure: Option<Failure>,
    pub(super) health: Health,
    pub(super) limit: End,
    pub(super) outcome: Outcome,
}

/// The `outcome` label of `phones_gateway_upstream_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Ok,
    NotFound,
    Timeout,
    CircuitOpen,
    HalfOpen,
    Saturated,
    BackingOff,
    SellerSaturated,
    LoadRefused,
    Load,
    LostTime,
    Local,
    Error,
}

impl Outcome {
    /// Every outcome, in label order: the counters are registered at start.
    pub(super) const ALL: [Outcome; 13] = [
        Outcome::Ok,
        Outcome::NotFound,
        Outcome::Timeout,
        Outcome::CircuitOpen,
        Outcome::HalfOpen,
        Outcome::Saturated,
        Outcome::BackingOff,
        Outcome::SellerSaturated,
        Outcome::LoadRefused,
        Outcome::Load,
        Outcome::LostTime,
        Outcome::Local,
        Outcome::Error,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::NotFound => "not_found",
            Outcome::Timeout => "timeout",
            Outcome::CircuitOpen => "circuit_open",
            Outcome::HalfOpen => "half_open",
            Outcome::Saturated => "saturated",
            Outcome::BackingOff => "backing_off",
            Outcome::SellerSaturated => "seller_saturated",
            Outcome::LoadRefused => "load_refused",
            Outcome::Load => "load",
            Outcome::LostTime => "lost_time",
            Outcome::Local => "local",
            Outcome::Error => "error",
        }
    }
}

impl<'a> Ending<'a> {
    pub(super) fn of<T>(result: &'a Result<Option<T>, UpstreamError>) -> Self {
        match result {
            Ok(Some(_)) => Ending::Answered,
            Ok(None) => Ending::NotFound,
            Err(error) => Ending::Failed(error),
        }
    }

    pub(super) fn row(self) -> Row {
        use Health::{Down, Silent, Up};
        use Outcome as O;
        let row = |failure, health, limit, outcome| Row {
            failure,
            health,
            limit,
            outcome,
        };
        let error = match self {
            Ending::Answered => return row(None, Up, End::Answered, O::Ok),
            Ending::NotFound => return row(None, Up, End::Answered, O::NotFound),
            Ending::Failed(error) => error,
        };
        let failed = |failure, health, limit, outcome| row(Some(failure), health, limit, outcome);
        match error {
            UpstreamError::Timeout => failed(Failure::Timeout, Down, End::Unknown, O::Timeout),
            UpstreamError::Connect(_) => failed(Failure::Connect, Down, End::Unknown, O::Error),
            UpstreamError::Status(status) if (500..=599).contains(status) => {
                failed(Failure::ErrorStatus, Down, End::Answered, O::Error)
            }
            UpstreamError::Status(status) if is_rejection(*status) => {
                failed(Failure::Rejected, Silent, End::Answered, O::Error)
            }
            UpstreamError::Status(_) => {
                failed(Failure::ErrorStatus, Silent, End::Answered, O::Error)
            }
            UpstreamError::Decode(_) => failed(Failure::Invalid, Silent, End::Answered, O::Error),
            UpstreamError::CircuitOpen => {
                failed(Failure::CircuitOpen, Silent, End::Unknown, O::CircuitOpen)
            }
            UpstreamError::HalfOpen => failed(Failure::HalfOpen, Silent, End::Unknown, O::HalfOpen),
            UpstreamError::LoadRefused(_) => failed(
                Failure::LoadRefused,
                Silent,
                End::LoadRefused,
                O::LoadRefused,
            ),
            UpstreamError::Load => failed(Failure::Load, Silent, End::LoadRefused, O::Load),
            UpstreamError::Saturated => failed(Failure::Bound, Silent, End::Unknown, O::Saturated),
            UpstreamError::BackingOff => {
                failed(Failure::Bound, Silent, End::Unknown, O::BackingOff)
            }
            UpstreamError::SellerSaturated => {
                failed(Failure::Bound, Silent, End::Unknown, O::SellerSaturated)
            }
            UpstreamError::LostTime => failed(Failure::LostTime, Silent, End::Unknown, O::LostTime),
            UpstreamError::LocalTimeout | UpstreamError::Local(_) | UpstreamError::Request => {
                failed(Failure::Gateway, Silent, End::Unknown, O::Local)
            }
            UpstreamError::Panicked | UpstreamError::Cancelled => {
                failed(Failure::Gateway, Silent, End::Unknown, O::Error)
            }
        }
    }
}

/// A 4xx other than 404 (an answer) and 429 (a load refusal).
fn is_rejection(status: u16) -> bool {
    (400..=499).contains(&status) && status != 404 && status != 429
}

/// One line of the table as `docs/rules.md` writes it.
pub type Line = [&'static str; 6];

/// The table's lines for an ending of each kind (a 5xx and a 4xx standing for
/// their statuses), as the docs test reads them.
pub fn table() -> Vec<Line> {
    let errors = [
        UpstreamError::Timeout,
        UpstreamError::Connect(String::new()),
        UpstreamError::Status(500),
        UpstreamError::Status(422),
        UpstreamError::Status(302),
        UpstreamError::Decode(""),
        UpstreamError::CircuitOpen,
        UpstreamError::HalfOpen,
        UpstreamError::LoadRefused(429),
        UpstreamError::Load,
        UpstreamError::LostTime,
        UpstreamError::Local(String::new()),
        UpstreamError::LocalTimeout,
        UpstreamError::Request,
        UpstreamError::Saturated,
        UpstreamError::BackingOff,
        UpstreamError::SellerSaturated,
        UpstreamError::Panicked,
        UpstreamError::Cancelled,
    ];
    errors
        .iter()
        .map(|error| {
            let row = Ending::Failed(error).row();
            let failure = row.failure.unwrap_or(Failure::Gateway);
            let kind = match error {
                UpstreamError::Status(500) => "status 5xx",
                UpstreamError::Status(422) => "status 4xx",
                UpstreamError::Status(_) => "status other",
                other => other.kind(),
            };
            [
                kind,
                failure.as_str(),
                if failure.is_verdict() {
                    "verdict"
                } else {
                    "undecided"
                },
                match row.health {
                    Health::Down => "counts, once judged",
                    Health::Up => "counts",
                    Health::Silent => "not counted",
                },
                match row.limit {
                    End::Answered => "an answer",
                    End::LoadRefused => "a cut",
                    End::Unknown => "nothing",
                },
                row.outcome.as_str(),
            ]
        })
        .collect()
}

impl UpstreamError {
    /// The failure a reason stores for this error: its row's, else the
    /// gateway's own.
    pub fn failure(&self) -> Failure {
        Ending::Failed(self)
            .row()
            .failure
            .unwrap_or(Failure::Gateway)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Class::{Undecided, Verdict};

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
            let down = Ending::Failed(&error).row().health == Health::Down;
            assert_eq!(down, health, "{error:?}");
        }
    }

    /// The `outcome` labels, which dashboards and alerts read: frozen.
    #[test]
    fn outcome_labels_are_frozen() {
        let labels: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        #[rustfmt::skip]
        let frozen = [
            "ok", "not_found", "timeout", "circuit_open", "half_open", "saturated", "backing_off",
            "seller_saturated", "load_refused", "load", "lost_time", "local", "error",
        ];
        assert_eq!(labels, frozen);
    }

    /// An answer and a 404 are the upstream up; a few of the table's lines.
    #[test]
    fn answers_and_the_tables_lines() {
        let answered = Row {
            failure: None,
            health: Health::Up,
            limit: End::Answered,
            outcome: Outcome::Ok,
        };
        assert_eq!(Ending::of(&Ok::<_, UpstreamError>(Some(1))).row(), answered);
        let mut not_found = answered;
        not_found.outcome = Outcome::NotFound;
        let none = Ending::of(&Ok::<Option<u8>, UpstreamError>(None)).row();
        assert_eq!(none, not_found);
        let table = table();
        assert_eq!(table.len(), 19);
        #[rustfmt::skip]
        let lines = [
            ["timeout", "timeout", "verdict", "counts, once judged", "nothing", "timeout"],
            ["status 4xx", "rejected", "verdict", "not counted", "an answer", "error"],
            ["half_open", "half_open", "undecided", "not counted", "nothing", "half_open"],
            ["load", "load", "undecided", "not counted", "a cut", "load"],
        ];
        for line in lines {
            assert!(table.contains(&line), "{line:?} in {table:?}");
        }
    }
}
