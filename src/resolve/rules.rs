//! The selection rules of docs/rules.md as a pure function: given what each source has
//! answered so far, is the request decided, and how?
//!
//! Sources are walked in the configured order. A source that does not apply, or
//! answered "no number", is skipped. One still pending stops the walk (`Wait`):
//! nothing below it may be revealed before it has answered. A source whose
//! applicability is not known yet (call tracking while the status set loads) is
//! pending for good: nothing will tell during this request, so the walk ends there
//! with `Unavailable`, whatever its policy. So is an undecided one (no verdict
//! from its upstream: not asked for a reason of the gateway's own, or a load
//! refusal): the walk ends there with `Undecided`, whatever its policy, since
//! its upstream has not failed. A failed
//! source either ends the walk with `Unavailable` (fail_closed) or is skipped
//! (fall_through).
//! With no source left: `Unavailable` if any applicable source failed (we cannot
//! tell the seller has no number), else `NoPhone`.

use crate::domain::Phone;
use crate::domain::{OnError, Source, Sources};

/// What one source has told us so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceState {
    NotApplicable,
    /// Whether it applies is not known yet, and will not be during this request.
    Unknown,
    Pending,
    Found(Phone),
    NotFound,
    /// Its own upstream's verdict failed it (an error answer, an answer that
    /// does not validate, a refused or reset connection, no answer in time,
    /// its breaker open on many sellers' failures): `on_error` applies.
    Failed,
    /// No verdict from its upstream ([`crate::upstream::Class::Undecided`]):
    /// not asked or not reachable for a reason of the gateway's own (a bound on
    /// calls in flight, its own sockets, a panicked fetch), or the upstream
    /// refused load. Nothing tells during this request, and nothing below it
    /// may be revealed.
    Undecided,
}

/// The state of every source for one request.
pub type States = Sources<SourceState>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Show this number.
    Answer(Source, Phone),
    /// No source has a number for this seller: 404.
    NoPhone,
    /// Cannot decide safely: 503. `failed` is the fail-closed source, if one.
    Unavailable { fail_closed: Option<Source> },
    /// Cannot decide now: 503 with `Retry-After`. This source has no verdict.
    Undecided(Source),
    /// A source that matters has not answered yet.
    Wait,
}

/// The order and the failure policy of each source.
#[derive(Debug, Clone)]
pub struct Rules {
    pub order: Vec<Source>,
    pub policy: Sources<OnError>,
}

impl Rules {
    pub fn decide(&self, states: &States) -> Decision {
        let mut any_failed = false;
        for &source in &self.order {
            match states[source] {
                SourceState::NotApplicable | SourceState::NotFound => {}
                SourceState::Pending => return Decision::Wait,
                SourceState::Unknown => return Decision::Unavailable { fail_closed: None },
                SourceState::Undecided => return Decision::Undecided(source),
                SourceState::Found(phone) => return Decision::Answer(source, phone),
                SourceState::Failed => match self.policy[source] {
                    OnError::FailClosed => {
                        return Decision::Unavailable {
                            fail_closed: Some(source),
                        };
                    }
                    OnError::FallThrough => any_failed = true,
                },
            }
        }
        if any_failed {
            Decision::Unavailable { fail_closed: None }
        } else {
            Decision::NoPhone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Source::*;
    use SourceState::*;

    fn p(n: u64) -> Phone {
        Phone::from_u64(n).unwrap()
    }

    fn rules() -> Rules {
        Rules {
            order: vec![Anonymous, Calltracking, RealPhone],
            policy: Sources::new(
                OnError::FailClosed,
                OnError::FallThrough,
                OnError::FallThrough,
            ),
        }
    }

    const A: u64 = 78_000_000_001;
    const C: u64 = 78_000_000_002;
    const R: u64 = 79_161_234_567;

    #[test]
    fn the_rule_table() {
        let unavailable = Decision::Unavailable { fail_closed: None };
        let closed = Decision::Unavailable {
            fail_closed: Some(Anonymous),
        };
        #[rustfmt::skip]
        let table = [
            // anonymous        calltracking      real           -> decision
            ((Found(p(A)),     Found(p(C)),      Found(p(R))),     Decision::Answer(Anonymous, p(A))),
            ((Found(p(A)),     Pending,          Pending),         Decision::Answer(Anonymous, p(A))),
            ((Pending,         Found(p(C)),      Found(p(R))),     Decision::Wait),
            ((NotFound,        Found(p(C)),      Found(p(R))),     Decision::Answer(Calltracking, p(C))),
            ((NotApplicable,   Found(p(C)),      Found(p(R))),     Decision::Answer(Calltracking, p(C))),
            ((NotApplicable,   Pending,          Found(p(R))),     Decision::Wait),
            ((NotApplicable,   NotApplicable,    Found(p(R))),     Decision::Answer(RealPhone, p(R))),
            ((NotFound,        NotApplicable,    Pending),         Decision::Wait),
            ((NotFound,        NotFound,         Found(p(R))),     Decision::Answer(RealPhone, p(R))),
            ((NotApplicable,   NotApplicable,    NotFound),        Decision::NoPhone),
            ((NotFound,        NotFound,         NotFound),        Decision::NoPhone),
            // anonymous fails closed: never reveals what is below it
            ((Failed,          Found(p(C)),      Found(p(R))),     closed),
            ((Failed,          Pending,          Pending),         closed),
            // calltracking falls through to the real number
            ((NotApplicable,   Failed,           Found(p(R))),     Decision::Answer(RealPhone, p(R))),
            ((NotFound,        Failed,           NotFound),        unavailable),
            ((NotApplicable,   Failed,           Failed),          unavailable),
            ((NotApplicable,   NotApplicable,    Failed),          unavailable),
            // call tracking unknown (status set loading): blocks what is below it
            ((Found(p(A)),     Unknown,          Found(p(R))),     Decision::Answer(Anonymous, p(A))),
            ((Pending,         Unknown,          Found(p(R))),     Decision::Wait),
            ((NotFound,        Unknown,          Found(p(R))),     unavailable),
            ((NotApplicable,   Unknown,          Found(p(R))),     unavailable),
            ((NotApplicable,   Unknown,          Pending),         unavailable),
            // undecided (not asked: a bound reached) is not failed: whatever the
            // policy, nothing below it is revealed
            ((NotApplicable,   Undecided,        Found(p(R))),     Decision::Undecided(Calltracking)),
            ((NotFound,        Undecided,        Found(p(R))),     Decision::Undecided(Calltracking)),
            ((Pending,         Undecided,        Found(p(R))),     Decision::Wait),
            ((Found(p(A)),     Undecided,        Found(p(R))),     Decision::Answer(Anonymous, p(A))),
            ((Undecided,       Found(p(C)),      Found(p(R))),     Decision::Undecided(Anonymous)),
            ((NotFound,        NotApplicable,    Undecided),       Decision::Undecided(RealPhone)),
            ((NotFound,        Failed,           Undecided),       Decision::Undecided(RealPhone)),
        ];
        let rules = rules();
        for ((anonymous, calltracking, real), want) in table {
            let states = States::new(anonymous, calltracking, real);
            assert_eq!(rules.decide(&states), want, "{states:?}");
        }
    }

    #[test]
    fn policies_and_order_are_configurable() {
        let mut rules = rules();
        rules.policy[Anonymous] = OnError::FallThrough;
        let states = States::new(Failed, NotApplicable, Found(p(R)));
        assert_eq!(rules.decide(&states), Decision::Answer(RealPhone, p(R)));

        rules.policy[Calltracking] = OnError::FailClosed;
        let states = States::new(NotFound, Failed, Found(p(R)));
        assert_eq!(
            rules.decide(&states),
            Decision::Unavailable {
                fail_closed: Some(Calltracking)
            }
        );

        let rules = Rules {
            order: vec![RealPhone, Anonymous],
            ..super::tests::rules()
        };
        let states = States::new(Found(p(A)), Found(p(C)), Found(p(R)));
        assert_eq!(rules.decide(&states), Decision::Answer(RealPhone, p(R)));
        let states = States::new(Found(p(A)), Found(p(C)), NotFound);
        assert_eq!(rules.decide(&states), Decision::Answer(Anonymous, p(A)));
    }
}
