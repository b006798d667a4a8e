//! The selection rules of docs/rules.md ("The walk") as a pure function: given
//! what each source has answered so far, is the request decided, and how? Its
//! [`Reason`] is made by the same walk, so it cannot disagree with the decision.

use crate::domain::{Failure, OnError, Origin, Phone, Reason, Skip, Source, Sources};

/// What one source has told us so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceState {
    NotApplicable,
    /// Whether it applies is not known yet, and will not be during this request.
    Unknown,
    Pending,
    /// A number, and where it came from.
    Found(Phone, Origin),
    NotFound,
    /// Its own upstream's verdict failed it, and which: `on_error` applies.
    Failed(Failure),
    /// No verdict from its upstream ([`crate::upstream::Class::Undecided`]),
    /// and why: nothing below it may be revealed.
    Undecided(Failure),
}

/// The state of every source for one request.
pub type States = Sources<SourceState>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Show this number, for this reason.
    Answer(Source, Phone, Reason),
    /// No source has a number for this seller: 404.
    NoPhone,
    /// Cannot decide safely: 503, with the fail-closed source if one.
    Unavailable { fail_closed: Option<Source> },
    /// Cannot decide now: 503 with `Retry-After`.
    Undecided(Source),
    /// A source that matters has not answered yet.
    Wait,
}

#[derive(Debug, Clone)]
pub struct Rules {
    pub order: Vec<Source>,
    pub policy: Sources<OnError>,
}

impl Rules {
    pub fn decide(&self, states: &States) -> Decision {
        let mut any_failed = false;
        // Passed over, and why, in order (at most two: one source answers).
        let mut passed: [Option<(Source, Skip)>; 2] = [None; 2];
        fn pass(passed: &mut [Option<(Source, Skip)>; 2], source: Source, skip: Skip) {
            if let Some(free) = passed.iter_mut().find(|p| p.is_none()) {
                *free = Some((source, skip));
            }
        }
        for &source in &self.order {
            match states[source] {
                SourceState::NotApplicable => pass(&mut passed, source, Skip::NotApplicable),
                SourceState::NotFound => pass(&mut passed, source, Skip::NoNumber),
                SourceState::Pending => return Decision::Wait,
                SourceState::Unknown => return Decision::Unavailable { fail_closed: None },
                SourceState::Undecided(_) => return Decision::Undecided(source),
                SourceState::Found(phone, origin) => {
                    let reason = passed
                        .into_iter()
                        .flatten()
                        .fold(Reason::new(origin), |reason, (above, skip)| {
                            reason.skipped(above, skip)
                        });
                    return Decision::Answer(source, phone, reason);
                }
                SourceState::Failed(failure) => match self.policy[source] {
                    OnError::FailClosed => {
                        return Decision::Unavailable {
                            fail_closed: Some(source),
                        };
                    }
                    OnError::FallThrough => {
                        any_failed = true;
                        pass(&mut passed, source, Skip::Failed(failure));
                    }
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

/// The test values the plan's tests share too.
#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use Source::*;
    use SourceState::*;

    pub(crate) fn p(n: u64) -> Phone {
        Phone::from_u64(n).unwrap()
    }

    /// Found from the upstream.
    fn up(n: u64) -> SourceState {
        Found(p(n), Origin::Upstream)
    }

    pub(crate) const TIMEOUT: SourceState = Failed(Failure::Timeout);
    const BREAKER: SourceState = Failed(Failure::CircuitOpen);
    pub(crate) const BOUND: SourceState = Undecided(Failure::Bound);

    /// The default order and policies.
    pub(crate) fn rules() -> Rules {
        Rules {
            order: vec![Anonymous, Calltracking, RealPhone],
            policy: Sources::new(
                OnError::FailClosed,
                OnError::FallThrough,
                OnError::FallThrough,
            ),
        }
    }

    pub(crate) const A: u64 = 78_000_000_001;
    pub(crate) const C: u64 = 78_000_000_002;
    pub(crate) const R: u64 = 79_161_234_567;

    /// An answer of `source`'s number `n` from the upstream.
    fn answer(source: Source, n: u64, skips: &[(Source, Skip)]) -> Decision {
        answer_from(source, n, Origin::Upstream, skips)
    }

    /// The answer of `source`'s number `n` from `origin`, the sources above
    /// passed over as `skips`: the decision with its reason.
    pub(crate) fn answer_from(
        source: Source,
        n: u64,
        origin: Origin,
        skips: &[(Source, Skip)],
    ) -> Decision {
        let reason = skips
            .iter()
            .fold(Reason::new(origin), |r, &(s, skip)| r.skipped(s, skip));
        Decision::Answer(source, p(n), reason)
    }

    pub(crate) const NA: Skip = Skip::NotApplicable;
    pub(crate) const NO: Skip = Skip::NoNumber;

    #[test]
    fn the_rule_table() {
        let unavailable = Decision::Unavailable { fail_closed: None };
        let closed = Decision::Unavailable {
            fail_closed: Some(Anonymous),
        };
        let timed_out = Skip::Failed(Failure::Timeout);
        #[rustfmt::skip]
        let table = [
            // anonymous        calltracking      real           -> decision
            ((up(A),           up(C),            up(R)),           answer(Anonymous, A, &[])),
            ((up(A),           Pending,          Pending),         answer(Anonymous, A, &[])),
            ((Pending,         up(C),            up(R)),           Decision::Wait),
            ((NotFound,        up(C),            up(R)),           answer(Calltracking, C, &[(Anonymous, NO)])),
            ((NotApplicable,   up(C),            up(R)),           answer(Calltracking, C, &[(Anonymous, NA)])),
            ((NotApplicable,   Pending,          up(R)),           Decision::Wait),
            ((NotApplicable,   NotApplicable,    up(R)),           answer(RealPhone, R, &[(Anonymous, NA), (Calltracking, NA)])),
            ((NotFound,        NotApplicable,    Pending),         Decision::Wait),
            ((NotFound,        NotFound,         up(R)),           answer(RealPhone, R, &[(Anonymous, NO), (Calltracking, NO)])),
            ((NotApplicable,   NotApplicable,    NotFound),        Decision::NoPhone),
            ((NotFound,        NotFound,         NotFound),        Decision::NoPhone),
            // anonymous fails closed: never reveals what is below it
            ((TIMEOUT,         up(C),            up(R)),           closed),
            ((BREAKER,         Pending,          Pending),         closed),
            // calltracking falls through to the real number, and says why
            ((NotApplicable,   TIMEOUT,          up(R)),           answer(RealPhone, R, &[(Anonymous, NA), (Calltracking, timed_out)])),
            ((NotApplicable,   BREAKER,          up(R)),           answer(RealPhone, R, &[(Anonymous, NA), (Calltracking, Skip::Failed(Failure::CircuitOpen))])),
            ((NotFound,        TIMEOUT,          NotFound),        unavailable),
            ((NotApplicable,   TIMEOUT,          TIMEOUT),         unavailable),
            ((NotApplicable,   NotApplicable,    TIMEOUT),         unavailable),
            // call tracking unknown (status set loading): blocks what is below it
            ((up(A),           Unknown,          up(R)),           answer(Anonymous, A, &[])),
            ((Pending,         Unknown,          up(R)),           Decision::Wait),
            ((NotFound,        Unknown,          up(R)),           unavailable),
            ((NotApplicable,   Unknown,          up(R)),           unavailable),
            ((NotApplicable,   Unknown,          Pending),         unavailable),
            // undecided (a bound reached) is not failed: nothing below it is revealed
            ((NotApplicable,   BOUND,            up(R)),           Decision::Undecided(Calltracking)),
            ((NotFound,        Undecided(Failure::Deadline), up(R)), Decision::Undecided(Calltracking)),
            ((Pending,         BOUND,            up(R)),           Decision::Wait),
            ((up(A),           BOUND,            up(R)),           answer(Anonymous, A, &[])),
            ((BOUND,           up(C),            up(R)),           Decision::Undecided(Anonymous)),
            ((NotFound,        NotApplicable,    BOUND),           Decision::Undecided(RealPhone)),
            ((NotFound,        TIMEOUT,          BOUND),           Decision::Undecided(RealPhone)),
        ];
        let rules = rules();
        for ((anonymous, calltracking, real), want) in table {
            let states = States::new(anonymous, calltracking, real);
            assert_eq!(rules.decide(&states), want, "{states:?}");
        }
    }

    /// The answering number's origin is the reason's, whichever source answers.
    #[test]
    fn the_origin_is_the_answering_sources() {
        let rules = rules();
        for origin in [
            Origin::Cache,
            Origin::Upstream,
            Origin::Phone,
            Origin::Stale(Failure::LostTime),
        ] {
            let states = States::new(NotApplicable, TIMEOUT, Found(p(R), origin));
            let timed_out = Skip::Failed(Failure::Timeout);
            let skips = [(Anonymous, NA), (Calltracking, timed_out)];
            let want = answer_from(RealPhone, R, origin, &skips);
            assert_eq!(rules.decide(&states), want, "{origin:?}");
            let states = States::new(Found(p(A), origin), Pending, Pending);
            let want = answer_from(Anonymous, A, origin, &[]);
            assert_eq!(rules.decide(&states), want, "{origin:?}");
        }
    }

    #[test]
    fn policies_and_order_are_configurable() {
        let mut rules = rules();
        rules.policy[Anonymous] = OnError::FallThrough;
        let states = States::new(Failed(Failure::ErrorStatus), NotApplicable, up(R));
        let failed = Skip::Failed(Failure::ErrorStatus);
        let skips = [(Anonymous, failed), (Calltracking, NA)];
        assert_eq!(rules.decide(&states), answer(RealPhone, R, &skips));

        rules.policy[Calltracking] = OnError::FailClosed;
        let states = States::new(NotFound, TIMEOUT, up(R));
        let closed = Some(Calltracking);
        let want = Decision::Unavailable {
            fail_closed: closed,
        };
        assert_eq!(rules.decide(&states), want);

        let rules = Rules {
            order: vec![RealPhone, Anonymous],
            ..super::tests::rules()
        };
        let states = States::new(up(A), up(C), up(R));
        assert_eq!(rules.decide(&states), answer(RealPhone, R, &[]));
        let states = States::new(up(A), up(C), NotFound);
        let want = answer(Anonymous, A, &[(RealPhone, NO)]);
        assert_eq!(rules.decide(&states), want);
    }
}
