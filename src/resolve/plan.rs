//! The selection plan of one request, as pure functions: which sources apply,
//! what the caches already settle, what must be asked and in which order, and
//! what each answer or the deadline settles (docs/rules.md, "Concurrency and the
//! deadline"); [`rules::Rules::decide`](super::rules::Rules::decide) walks the
//! states. Each cache is read through a function handed in, so tests read a table.

use foldhash::HashSet;

use super::rules::{Decision, Rules, SourceState, States};
use crate::config::SelectionConfig;
use crate::domain::{
    AdId, CategoryId, Failure, Known, OnError, Origin, Phone, Source, Sources, UserId,
};

/// What the buyer asked about.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub user: UserId,
    pub ad: AdId,
    pub category: CategoryId,
    /// The seller's real number, when the caller already has it.
    pub phone: Option<Phone>,
}

/// What `[selection]` (and each source's `on_error`) says, ready to plan with.
#[derive(Debug, Clone)]
pub struct Selection {
    pub rules: Rules,
    pub anonymous_categories: HashSet<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    Anonymous,
    RealPhone,
    Calltracking(Phone),
}

impl Ask {
    /// The source asked about (call tracking's real number is asked as `RealPhone`).
    pub fn source(self) -> Source {
        match self {
            Ask::Anonymous => Source::Anonymous,
            Ask::RealPhone => Source::RealPhone,
            Ask::Calltracking(_) => Source::Calltracking,
        }
    }
}

/// Where one request stands: each source's state and what is still to come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub states: States,
    /// The real number once known (given, cached or answered).
    real_phone: Option<Phone>,
    /// Being fetched (for `real`, for call tracking or both).
    real_pending: bool,
    calltracking_applies: bool,
    real_in_order: bool,
}

impl Selection {
    /// The plan of `[selection]` with each source's `on_error` (`policy`).
    pub fn new(selection: &SelectionConfig, policy: Sources<OnError>) -> Self {
        Selection {
            rules: Rules {
                order: selection.order.clone(),
                policy,
            },
            anonymous_categories: selection.anonymous_categories.iter().copied().collect(),
        }
    }

    /// What is known without asking: `tracking` is asked only when call
    /// tracking is in the order, `fresh` once per cache that matters, real first.
    pub fn start(
        &self,
        req: &Request,
        tracking: impl FnOnce() -> Known<()>,
        mut fresh: impl FnMut(Ask) -> Known<Phone>,
    ) -> Progress {
        let order = &self.rules.order;
        let anonymous_applies = order.contains(&Source::Anonymous)
            && self.anonymous_categories.contains(&req.category.get());
        let tracking = if order.contains(&Source::Calltracking) {
            tracking()
        } else {
            Known::No
        };
        let calltracking_applies = tracking == Known::Yes(());
        let real_in_order = order.contains(&Source::RealPhone);
        let real_needed = real_in_order || calltracking_applies;
        let real_known = match req.phone {
            Some(phone) => Known::Yes(phone),
            None if real_needed => fresh(Ask::RealPhone),
            None => Known::NotKnown,
        };
        let anonymous = if anonymous_applies {
            fresh_state(fresh(Ask::Anonymous))
        } else {
            SourceState::NotApplicable
        };
        let real = match (real_in_order, req.phone) {
            (false, _) => SourceState::NotApplicable,
            (true, Some(phone)) => SourceState::Found(phone, Origin::Phone),
            (true, None) => fresh_state(real_known),
        };
        let calltracking = match (tracking, real_known) {
            // Until the status set is loaded, nothing below call tracking may
            // be shown (docs/status-sync.md).
            (Known::NotKnown, _) => SourceState::Unknown,
            (Known::No, _) => SourceState::NotApplicable,
            (Known::Yes(()), Known::Yes(real)) => fresh_state(fresh(Ask::Calltracking(real))),
            (Known::Yes(()), Known::No) => SourceState::NotFound,
            (Known::Yes(()), Known::NotKnown) => SourceState::Pending,
        };
        Progress {
            states: States::new(anonymous, calltracking, real),
            real_phone: match real_known {
                Known::Yes(phone) => Some(phone),
                Known::No | Known::NotKnown => None,
            },
            real_pending: real_needed && real_known == Known::NotKnown,
            calltracking_applies,
            real_in_order,
        }
    }

    pub fn decide(&self, progress: &Progress) -> Decision {
        self.rules.decide(&progress.states)
    }
}

impl Progress {
    /// What to ask at once, by the source whose slot it takes.
    pub fn asks(&self) -> Sources<Option<Ask>> {
        let pending = |source| self.states[source] == SourceState::Pending;
        Sources::new(
            pending(Source::Anonymous).then_some(Ask::Anonymous),
            match self.real_phone {
                Some(phone) if pending(Source::Calltracking) => Some(Ask::Calltracking(phone)),
                _ => None,
            },
            self.real_pending.then_some(Ask::RealPhone),
        )
    }

    /// The answer to what was asked in `slot`'s slot: the states it settles,
    /// and what to ask next (call tracking, once the real number is known).
    pub fn answered(&mut self, slot: Source, state: SourceState) -> Option<Ask> {
        match slot {
            Source::Anonymous | Source::Calltracking => {
                self.states[slot] = state;
                None
            }
            Source::RealPhone => {
                self.real_pending = false;
                if self.real_in_order {
                    self.states[Source::RealPhone] = state;
                }
                if let SourceState::Found(phone, _) = state {
                    self.real_phone = Some(phone);
                }
                if !self.calltracking_applies {
                    return None;
                }
                match state {
                    SourceState::Found(phone, _) => Some(Ask::Calltracking(phone)),
                    // Call tracking shares the real number's fate (undecided included).
                    other => {
                        self.states[Source::Calltracking] = other;
                        None
                    }
                }
            }
        }
    }

    /// At the request deadline whatever is still pending is undecided, or
    /// serves the usable stale value `stale` reads. Every state is settled after.
    pub fn at_deadline(&mut self, mut stale: impl FnMut(Ask) -> Known<Phone>) {
        let pending = |states: &States, source| states[source] == SourceState::Pending;
        if pending(&self.states, Source::Anonymous) {
            self.states[Source::Anonymous] = stale_or_undecided(stale(Ask::Anonymous));
        }
        let calltracking_waits_for_real =
            pending(&self.states, Source::Calltracking) && self.real_phone.is_none();
        if pending(&self.states, Source::RealPhone) || calltracking_waits_for_real {
            let real = stale(Ask::RealPhone);
            if let Known::Yes(phone) = real {
                self.real_phone = Some(phone);
            }
            if pending(&self.states, Source::RealPhone) {
                self.states[Source::RealPhone] = stale_or_undecided(real);
            }
            if calltracking_waits_for_real && real == Known::No {
                // A seller with no phone has no call-tracking number either.
                self.states[Source::Calltracking] = SourceState::NotFound;
            }
        }
        if pending(&self.states, Source::Calltracking) {
            self.states[Source::Calltracking] = match self.real_phone {
                Some(phone) => stale_or_undecided(stale(Ask::Calltracking(phone))),
                None => SourceState::Undecided(Failure::Deadline),
            };
        }
        self.real_pending = false;
    }
}

fn fresh_state(cached: Known<Phone>) -> SourceState {
    match cached {
        Known::Yes(phone) => SourceState::Found(phone, Origin::Cache),
        Known::No => SourceState::NotFound,
        Known::NotKnown => SourceState::Pending,
    }
}

/// A stale cache answer at the deadline as a source state, else undecided.
fn stale_or_undecided(stale: Known<Phone>) -> SourceState {
    match stale {
        Known::Yes(phone) => SourceState::Found(phone, Origin::Stale(Failure::Deadline)),
        Known::No => SourceState::NotFound,
        Known::NotKnown => SourceState::Undecided(Failure::Deadline),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Skip;
    use crate::resolve::rules::tests::{A, BOUND, C, NA, NO, R, TIMEOUT, answer_from as answer};
    use crate::resolve::rules::tests::{p, rules};
    use Source::{Anonymous, Calltracking, RealPhone};
    use SourceState::{Failed, Found, NotApplicable, NotFound, Pending, Undecided, Unknown};

    const ANON_CATEGORY: u64 = 9;
    const PLAIN_CATEGORY: u64 = 1;

    /// The default `[selection]` and policies.
    fn selection() -> Selection {
        Selection {
            rules: rules(),
            anonymous_categories: [ANON_CATEGORY].into_iter().collect(),
        }
    }

    fn request(category: u64, phone: Option<Phone>) -> Request {
        Request {
            user: UserId::new(42).unwrap(),
            ad: AdId::new(1).unwrap(),
            category: CategoryId::new(category).unwrap(),
            phone,
        }
    }

    /// What the caches hold, by source (call tracking's for the real number R).
    type Held = (Known<Phone>, Known<Phone>, Known<Phone>);

    fn reader((anonymous, calltracking, real): Held) -> impl FnMut(Ask) -> Known<Phone> {
        move |ask| match ask {
            Ask::Anonymous => anonymous,
            Ask::RealPhone => real,
            Ask::Calltracking(phone) if phone == p(R) => calltracking,
            Ask::Calltracking(_) => Known::NotKnown,
        }
    }

    const MISS: Known<Phone> = Known::NotKnown;
    const NONE: Known<Phone> = Known::No;

    fn has(n: u64) -> Known<Phone> {
        Known::Yes(p(n))
    }

    /// The seller's call tracking: on, off, or not known (the set not loaded).
    const ON: Known<()> = Known::Yes(());
    const OFF: Known<()> = Known::No;
    const UNKNOWN_SET: Known<()> = Known::NotKnown;

    /// Each source's state: anonymous, call tracking, real.
    type Three = (SourceState, SourceState, SourceState);

    /// A row of the start table: the request's category and given phone, the
    /// seller's call tracking and the caches; then the states, what is asked
    /// at once and the decision.
    type Start = (
        u64,
        Option<u64>,
        Known<()>,
        Held,
        Three,
        (bool, Option<u64>, bool),
        Decision,
    );

    /// A row of the deadline table: the category and call tracking, the
    /// caches at start, the answers before the deadline and the stale values
    /// at it; then the states and the decision.
    type AtDeadline = (
        u64,
        Known<()>,
        Held,
        &'static [(Source, SourceState)],
        Held,
        Three,
        Decision,
    );

    fn cached(n: u64) -> SourceState {
        Found(p(n), Origin::Cache)
    }

    fn fetched(n: u64) -> SourceState {
        Found(p(n), Origin::Upstream)
    }

    fn given(n: u64) -> SourceState {
        Found(p(n), Origin::Phone)
    }

    fn stale(n: u64) -> SourceState {
        Found(p(n), Origin::Stale(Failure::Deadline))
    }

    const LATE: SourceState = Undecided(Failure::Deadline);

    const CACHE: Origin = Origin::Cache;
    const UPSTREAM: Origin = Origin::Upstream;
    const STALE: Origin = Origin::Stale(Failure::Deadline);

    #[test]
    fn the_start_table() {
        let (on, off, unknown) = (ON, OFF, UNKNOWN_SET);
        #[rustfmt::skip]
        let table: [Start; 14] = [
            // category   given    tracking  cached (anon, ct, real)      -> states (anon, ct, real)            asks (anon, ct of, real)  decision
            // everything cached: the hit path decides
            (PLAIN_CATEGORY, None, on,  (MISS, has(C), has(R)),   (NotApplicable, cached(C), cached(R)),     (false, None, false),     answer(Calltracking, C, CACHE, &[(Anonymous, NA)])),
            (ANON_CATEGORY,  None, on,  (has(A), MISS, MISS),     (cached(A), Pending, Pending),             (false, None, true),      answer(Anonymous, A, CACHE, &[])),
            (PLAIN_CATEGORY, None, off, (MISS, has(C), has(R)),   (NotApplicable, NotApplicable, cached(R)), (false, None, false),     answer(RealPhone, R, CACHE, &[(Anonymous, NA), (Calltracking, NA)])),
            (ANON_CATEGORY,  None, off, (NONE, MISS, has(R)),     (NotFound, NotApplicable, cached(R)),      (false, None, false),     answer(RealPhone, R, CACHE, &[(Anonymous, NO), (Calltracking, NA)])),
            // the real-then-calltracking chain: nothing cached asks real first
            (PLAIN_CATEGORY, None, on,  (MISS, MISS, MISS),       (NotApplicable, Pending, Pending),         (false, None, true),      Decision::Wait),
            // real cached, its call-tracking number not: call tracking at once
            (PLAIN_CATEGORY, None, on,  (MISS, MISS, has(R)),     (NotApplicable, Pending, cached(R)),       (false, Some(R), false),  Decision::Wait),
            // a given phone saves the real-phone call and feeds call tracking
            (PLAIN_CATEGORY, Some(R), on, (MISS, MISS, MISS),     (NotApplicable, Pending, given(R)),        (false, Some(R), false),  Decision::Wait),
            (PLAIN_CATEGORY, Some(R), on, (MISS, NONE, MISS),     (NotApplicable, NotFound, given(R)),       (false, None, false),     answer(RealPhone, R, Origin::Phone, &[(Anonymous, NA), (Calltracking, NO)])),
            (PLAIN_CATEGORY, Some(R), off, (MISS, MISS, MISS),    (NotApplicable, NotApplicable, given(R)),  (false, None, false),     answer(RealPhone, R, Origin::Phone, &[(Anonymous, NA), (Calltracking, NA)])),
            // a seller with no phone has no call-tracking number either
            (PLAIN_CATEGORY, None, on,  (MISS, MISS, NONE),       (NotApplicable, NotFound, NotFound),       (false, None, false),     Decision::NoPhone),
            // anonymous pending above everything
            (ANON_CATEGORY,  None, on,  (MISS, has(C), has(R)),   (Pending, cached(C), cached(R)),           (true, None, false),      Decision::Wait),
            // the status set not loaded: call tracking unknown, nothing below shown
            (PLAIN_CATEGORY, None, unknown, (MISS, has(C), has(R)), (NotApplicable, Unknown, cached(R)),     (false, None, false),     Decision::Unavailable { fail_closed: None }),
            (PLAIN_CATEGORY, None, unknown, (MISS, MISS, MISS),   (NotApplicable, Unknown, Pending),         (false, None, true),      Decision::Unavailable { fail_closed: None }),
            (ANON_CATEGORY,  None, unknown, (has(A), MISS, MISS), (cached(A), Unknown, Pending),             (false, None, true),      answer(Anonymous, A, CACHE, &[])),
        ];
        let selection = selection();
        for (i, row) in table.into_iter().enumerate() {
            let (category, given, tracking, held, (a, c, r), (ask_a, ask_c, ask_r), want) = row;
            let req = request(category, given.map(p));
            let progress = selection.start(&req, || tracking, reader(held));
            assert_eq!(progress.states, States::new(a, c, r), "row {i}");
            let asks = progress.asks();
            assert_eq!(asks[Anonymous].is_some(), ask_a, "row {i}");
            let ask_c = ask_c.map(|n| Ask::Calltracking(p(n)));
            assert_eq!(asks[Calltracking], ask_c, "row {i}");
            assert_eq!(asks[RealPhone].is_some(), ask_r, "row {i}");
            assert_eq!(selection.decide(&progress), want, "row {i}");
        }
    }

    /// Call tracking out of the order: the status set is not even asked.
    #[test]
    fn a_source_out_of_the_order_is_neither_asked_nor_read() {
        let mut selection = selection();
        selection.rules.order = vec![Anonymous, RealPhone];
        let req = request(PLAIN_CATEGORY, None);
        let tracking = || panic!("tracking asked");
        let progress = selection.start(&req, tracking, reader((MISS, has(C), has(R))));
        let want = answer(RealPhone, R, CACHE, &[(Anonymous, NA)]);
        assert_eq!(selection.decide(&progress), want);
    }

    /// Only real in the order and call tracking off: the real number is not
    /// read for call tracking either.
    #[test]
    fn a_number_no_source_needs_is_not_read() {
        let mut selection = selection();
        selection.rules.order = vec![Anonymous, Calltracking];
        let req = request(ANON_CATEGORY, None);
        let read = |ask| match ask {
            Ask::Anonymous => has(A),
            other => panic!("{other:?} read"),
        };
        let progress = selection.start(&req, || OFF, read);
        let want = answer(Anonymous, A, CACHE, &[]);
        assert_eq!(selection.decide(&progress), want);
    }

    /// Answers as they arrive, for a tracked seller with nothing cached:
    /// undecided against failed, and the real-then-calltracking chain.
    #[test]
    fn the_answer_table() {
        let unavailable = Decision::Unavailable { fail_closed: None };
        let timed_out = Skip::Failed(Failure::Timeout);
        #[rustfmt::skip]
        let table: &[(&[(Source, SourceState)], Decision)] = &[
            // the chain: real found asks call tracking, whose number wins
            (&[(RealPhone, fetched(R)), (Calltracking, fetched(C))],   answer(Calltracking, C, UPSTREAM, &[(Anonymous, NA)])),
            (&[(RealPhone, fetched(R)), (Calltracking, cached(C))],    answer(Calltracking, C, CACHE, &[(Anonymous, NA)])),
            (&[(RealPhone, fetched(R))],                              Decision::Wait),
            (&[(RealPhone, fetched(R)), (Calltracking, NotFound)],     answer(RealPhone, R, UPSTREAM, &[(Anonymous, NA), (Calltracking, NO)])),
            // call tracking failed by its verdict: fall through, the reason says which
            (&[(RealPhone, fetched(R)), (Calltracking, TIMEOUT)],      answer(RealPhone, R, UPSTREAM, &[(Anonymous, NA), (Calltracking, timed_out)])),
            (&[(RealPhone, fetched(R)), (Calltracking, Failed(Failure::Rejected))], answer(RealPhone, R, UPSTREAM, &[(Anonymous, NA), (Calltracking, Skip::Failed(Failure::Rejected))])),
            (&[(RealPhone, Found(p(R), Origin::Stale(Failure::Connect))), (Calltracking, TIMEOUT)], answer(RealPhone, R, Origin::Stale(Failure::Connect), &[(Anonymous, NA), (Calltracking, timed_out)])),
            // no word from the upstream: undecided, never the real number
            (&[(RealPhone, fetched(R)), (Calltracking, BOUND)],        Decision::Undecided(Calltracking)),
            (&[(RealPhone, fetched(R)), (Calltracking, Undecided(Failure::LostTime))], Decision::Undecided(Calltracking)),
            (&[(RealPhone, fetched(R)), (Calltracking, Undecided(Failure::Load))], Decision::Undecided(Calltracking)),
            // the real number undecided: call tracking cannot be asked either
            (&[(RealPhone, BOUND)],                                    Decision::Undecided(Calltracking)),
            // the real number failed by its upstream: call tracking too
            (&[(RealPhone, TIMEOUT)],                                  unavailable),
            (&[(RealPhone, NotFound)],                                 Decision::NoPhone),
        ];
        let selection = selection();
        for (i, (answers, want)) in table.iter().enumerate() {
            let req = request(PLAIN_CATEGORY, None);
            let mut progress = selection.start(&req, || ON, reader((MISS, MISS, MISS)));
            let mut expected_next = None;
            for &(slot, answer) in answers.iter() {
                if slot == Calltracking {
                    assert_eq!(expected_next, Some(Ask::Calltracking(p(R))), "row {i}");
                }
                expected_next = progress.answered(slot, answer);
            }
            assert_eq!(selection.decide(&progress), *want, "row {i}");
        }
        // The anonymous source, above a cached real number: undecided is 503
        // whatever is below it; its upstream's own failure fails it closed.
        let closed = Decision::Unavailable {
            fail_closed: Some(Anonymous),
        };
        #[rustfmt::skip]
        let anonymous: &[(SourceState, Decision)] = &[
            (BOUND,        Decision::Undecided(Anonymous)),
            (TIMEOUT,      closed),
            (fetched(A),   answer(Anonymous, A, UPSTREAM, &[])),
            (NotFound,     answer(RealPhone, R, CACHE, &[(Anonymous, NO), (Calltracking, NA)])),
        ];
        for (i, &(answer, want)) in anonymous.iter().enumerate() {
            let req = request(ANON_CATEGORY, None);
            let mut progress = selection.start(&req, || OFF, reader((MISS, MISS, has(R))));
            let next = progress.answered(Anonymous, answer);
            assert_eq!(next, None, "anonymous row {i}");
            assert_eq!(selection.decide(&progress), want, "anonymous row {i}");
        }
    }

    /// At the deadline: a pending source serves its usable stale value, else
    /// is undecided; it settles only what is still pending.
    #[test]
    fn the_deadline_table() {
        let (on, off, unknown) = (ON, OFF, UNKNOWN_SET);
        let unavailable = Decision::Unavailable { fail_closed: None };
        #[rustfmt::skip]
        let table: [AtDeadline; 16] = [
            // category   tracking cached at start    answered before        stale at the deadline     -> states                                  decision
            (ANON_CATEGORY,  on,  (MISS, MISS, MISS),   &[],                       (has(A), has(C), has(R)), (stale(A), stale(C), stale(R)),         answer(Anonymous, A, STALE, &[])),
            (ANON_CATEGORY,  on,  (MISS, MISS, MISS),   &[],                       (MISS, MISS, MISS),       (LATE, LATE, LATE),                      Decision::Undecided(Anonymous)),
            // the real number known (cached): call tracking's stale value for it
            (PLAIN_CATEGORY, on,  (MISS, MISS, has(R)), &[],                       (MISS, has(C), has(R)),   (NotApplicable, stale(C), cached(R)),    answer(Calltracking, C, STALE, &[(Anonymous, NA)])),
            // call tracking pending at the deadline, nothing stale: never the real number
            (PLAIN_CATEGORY, on,  (MISS, MISS, has(R)), &[],                       (MISS, MISS, has(R)),     (NotApplicable, LATE, cached(R)),        Decision::Undecided(Calltracking)),
            // the real number known: its stale entry is not read again (were it,
            // a stale "no phone" would hide the known number's call tracking)
            (PLAIN_CATEGORY, on,  (MISS, MISS, has(R)), &[],                       (MISS, has(C), NONE),     (NotApplicable, stale(C), cached(R)),    answer(Calltracking, C, STALE, &[(Anonymous, NA)])),
            // a stale "no phone": no call-tracking number either
            (PLAIN_CATEGORY, on,  (MISS, MISS, MISS),   &[],                       (MISS, has(C), NONE),     (NotApplicable, NotFound, NotFound),     Decision::NoPhone),
            // a stale real number alone: call tracking undecided, nothing shown
            (PLAIN_CATEGORY, on,  (MISS, MISS, MISS),   &[],                       (MISS, MISS, has(R)),     (NotApplicable, LATE, stale(R)),         Decision::Undecided(Calltracking)),
            // not tracked: the stale real number is served, standing in for the deadline
            (PLAIN_CATEGORY, off, (MISS, MISS, MISS),   &[],                       (MISS, MISS, has(R)),     (NotApplicable, NotApplicable, stale(R)), answer(RealPhone, R, STALE, &[(Anonymous, NA), (Calltracking, NA)])),
            // call tracking failed by its verdict before the deadline: the cached real number
            (PLAIN_CATEGORY, on,  (MISS, MISS, has(R)), &[(Calltracking, TIMEOUT)], (MISS, MISS, has(R)),   (NotApplicable, TIMEOUT, cached(R)),     answer(RealPhone, R, CACHE, &[(Anonymous, NA), (Calltracking, Skip::Failed(Failure::Timeout))])),
            // the status set not loaded: call tracking unknown, nothing below shown
            (PLAIN_CATEGORY, unknown, (MISS, MISS, MISS), &[],                     (MISS, has(C), has(R)),   (NotApplicable, Unknown, stale(R)),      unavailable),
            (PLAIN_CATEGORY, unknown, (MISS, MISS, MISS), &[],                     (MISS, MISS, MISS),       (NotApplicable, Unknown, LATE),          unavailable),
            (ANON_CATEGORY,  unknown, (MISS, MISS, MISS), &[],                     (has(A), MISS, has(R)),   (stale(A), Unknown, stale(R)),           answer(Anonymous, A, STALE, &[])),
            // an undecided real number: call tracking, which needed it, stays undecided
            (PLAIN_CATEGORY, on,  (MISS, MISS, MISS),   &[(RealPhone, BOUND)],     (MISS, has(C), has(R)),   (NotApplicable, BOUND, BOUND),           Decision::Undecided(Calltracking)),
            (PLAIN_CATEGORY, off, (MISS, MISS, MISS),   &[(RealPhone, BOUND)],     (MISS, MISS, has(R)),     (NotApplicable, NotApplicable, BOUND),   Decision::Undecided(RealPhone)),
            // an undecided anonymous source: 503, whatever the deadline settles below
            (ANON_CATEGORY,  on,  (MISS, MISS, MISS),   &[(Anonymous, BOUND)],     (MISS, MISS, has(R)),     (BOUND, LATE, stale(R)),                 Decision::Undecided(Anonymous)),
            (ANON_CATEGORY,  off, (MISS, MISS, has(R)), &[(Anonymous, BOUND)],     (has(A), MISS, has(R)),   (BOUND, NotApplicable, cached(R)),       Decision::Undecided(Anonymous)),
        ];
        let selection = selection();
        for (i, row) in table.into_iter().enumerate() {
            let (category, tracking, cached, answered, stale, (a, c, r), want) = row;
            let req = request(category, None);
            let mut progress = selection.start(&req, || tracking, reader(cached));
            for &(slot, answer) in answered {
                progress.answered(slot, answer);
            }
            progress.at_deadline(reader(stale));
            assert_eq!(progress.states, States::new(a, c, r), "row {i}");
            assert_eq!(selection.decide(&progress), want, "row {i}");
        }
        // An undecided call tracking stays undecided, a stale value or not.
        let req = request(PLAIN_CATEGORY, None);
        let mut progress = selection.start(&req, || ON, reader((MISS, MISS, has(R))));
        progress.answered(Calltracking, BOUND);
        progress.at_deadline(reader((MISS, has(C), has(R))));
        assert_eq!(progress.states[Calltracking], BOUND);
        let want = Decision::Undecided(Calltracking);
        assert_eq!(selection.decide(&progress), want);
    }
}
