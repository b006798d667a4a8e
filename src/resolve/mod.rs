//! Resolving one request: asking the sources (through the caches) concurrently
//! and deciding with [`rules::Rules::decide`] as answers arrive. The pure parts
//! are [`plan`] and [`rules`]; this module keeps the I/O: cache reads and
//! fetches, the futures, the deadline timer, the counters. Order and deadline:
//! docs/rules.md, "Concurrency and the deadline".

pub mod admission;
pub mod fan_out;
pub mod plan;
pub mod rules;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cache::caches::Caches;
use crate::cache::{CacheKey, FetchResult, Lookup, PhoneCache, Via};
use crate::config::Config;
use crate::domain::{Known, OnError, Origin, Phone, Reason, Source, Sources};
use crate::status::StatusSet;
use crate::telemetry::trace::{Incoming, RequestTrace};
use crate::upstream::{Call, Class, Ticket, Upstreams};
pub use fan_out::Batch;
pub use plan::Request;
use plan::{Ask, Progress, Selection};
use rules::{Decision, SourceState, States};

/// The number to show, and why it is of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub kind: Source,
    pub phone: Phone,
    pub reason: Reason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("the seller has no phone")]
    NoPhone,
    #[error("cannot decide safely")]
    Unavailable { fail_closed: Option<Source> },
    /// A source the rules needed was undecided and had no usable stale value.
    #[error("cannot decide now: {} is undecided", .0.as_str())]
    Undecided(Source),
    /// Needs an upstream call while the workers are saturated (`admission`).
    #[error("shed: the workers are saturated and the answer is not cached")]
    Overloaded,
}

type LookupFuture<'a> = Pin<Box<dyn Future<Output = Lookup> + Send + 'a>>;

/// A request the caches could not decide, and the trace its calls continue.
struct Asking<'h> {
    trace: Incoming<'h>,
    progress: Progress,
}

/// Answers every request of a replica; built by [`Parts::build`](crate::app::Parts::build).
pub struct Resolver {
    selection: Selection,
    /// Shared with the fetch tasks the caches spawn, which outlive a request.
    upstreams: Arc<Upstreams>,
    caches: Caches,
    /// Read on every request (not cached), so a change applies to the next.
    status: Arc<StatusSet>,
    counters: Counters,
    /// `server.request_deadline_ms`.
    deadline: std::time::Duration,
    /// Each upstream's `max_in_flight_per_request`: a batch's places.
    fan_out: Sources<usize>,
    next_ticket: AtomicU64,
    /// Cold admission: read only on a miss, so the hit path never pays for it.
    admission: Arc<admission::Admission>,
    /// `tracing.otlp_endpoint` is set: cache outcomes and the decision become
    /// events of the request's span. Off, the hit path does no trace work.
    export_spans: bool,
}

/// Decision metrics, registered once (the hit path increments atomics only).
struct Counters {
    selections: Sources<metrics::Counter>,
    fail_closed: Sources<metrics::Counter>,
    fall_through: Sources<metrics::Counter>,
    no_phone: metrics::Counter,
    unavailable: metrics::Counter,
    undecided: metrics::Counter,
    /// By kind, then by the reason's code ([`Code::ALL`](crate::domain::Code::ALL)).
    answers: Sources<Box<[metrics::Counter]>>,
}

impl Counters {
    fn new() -> Self {
        let by_source = |name: &'static str, label: &'static str| {
            Sources::from_fn(|s| metrics::counter!(name, label => s.as_str()))
        };
        let failure = |reason: &'static str| metrics::counter!("phones_gateway_resolve_failures_total", "reason" => reason);
        Counters {
            selections: by_source("phones_gateway_selections_total", "kind"),
            fail_closed: by_source("phones_gateway_fail_closed_total", "source"),
            fall_through: by_source("phones_gateway_fall_through_total", "source"),
            no_phone: failure("no_phone"),
            unavailable: failure("unavailable"),
            undecided: failure("undecided"),
            answers: Sources::from_fn(|kind| {
                crate::domain::Code::ALL
                    .iter()
                    .map(|&reason| {
                        metrics::counter!("phones_gateway_answers_total", "kind" => kind.as_str(), "reason" => reason)
                    })
                    .collect()
            }),
        }
    }
}

impl Resolver {
    pub fn new(
        config: &Config,
        upstreams: Arc<Upstreams>,
        caches: Caches,
        status: Arc<StatusSet>,
    ) -> Self {
        Resolver {
            selection: Selection::new(&config.selection, config.upstreams.policies()),
            caches,
            status,
            counters: Counters::new(),
            deadline: config.request_deadline(),
            fan_out: Sources::from_fn(|source| {
                config.upstreams.of(source).max_in_flight_per_request
            }),
            next_ticket: AtomicU64::new(1),
            admission: Arc::new(admission::Admission::new(
                config.server.max_queue_delay,
                upstreams.lost_time(),
            )),
            upstreams,
            export_spans: config.tracing.exports(),
        }
    }

    fn next_ticket(&self) -> Ticket {
        Ticket(self.next_ticket.fetch_add(1, Ordering::Relaxed))
    }

    /// What the items of one batch share: one request.
    pub fn batch(&self) -> Batch {
        Batch::new(
            self.next_ticket(),
            tokio::time::Instant::now() + self.deadline,
            self.fan_out,
        )
    }

    /// Counts an answer shown (not HEAD) by its kind and its reason's code.
    pub fn count_answer(&self, resolved: &Resolved) {
        if let Some(counter) =
            self.counters.answers[resolved.kind].get(resolved.reason.code().index())
        {
            counter.increment(1);
        }
    }

    pub fn admission(&self) -> Arc<admission::Admission> {
        self.admission.clone()
    }

    /// The result, if decided; counts the decision and every source it fell through.
    fn finish(&self, states: &States) -> Option<Result<Resolved, ResolveError>> {
        let rules = &self.selection.rules;
        let decision = rules.decide(states);
        let counters = &self.counters;
        let stop_at = match decision {
            Decision::Wait => return None,
            Decision::Answer(kind, _, _) => {
                counters.selections[kind].increment(1);
                Some(kind)
            }
            Decision::NoPhone => {
                counters.no_phone.increment(1);
                None
            }
            Decision::Unavailable { fail_closed } => {
                match fail_closed {
                    Some(source) => counters.fail_closed[source].increment(1),
                    None => counters.unavailable.increment(1),
                }
                fail_closed
            }
            Decision::Undecided(source) => {
                counters.undecided.increment(1);
                Some(source)
            }
        };
        for &source in &rules.order {
            if Some(source) == stop_at {
                break;
            }
            if matches!(states[source], SourceState::Failed(_))
                && rules.policy[source] == OnError::FallThrough
            {
                counters.fall_through[source].increment(1);
            }
        }
        finished(decision)
    }

    /// The number to show for `req`. Its upstream calls continue the request's
    /// `trace` (`None`: a new trace), parsed only when a call is made.
    pub async fn resolve(
        &self,
        req: &Request,
        trace: Option<&RequestTrace<'_>>,
    ) -> Result<Resolved, ResolveError> {
        self.resolve_in(req, trace, None).await
    }

    /// [`Resolver::resolve`] for an item of `batch` (`None`: a request of its own).
    pub async fn resolve_in(
        &self,
        req: &Request,
        trace: Option<&RequestTrace<'_>>,
        batch: Option<&Batch>,
    ) -> Result<Resolved, ResolveError> {
        let result = self.decide(req, trace, batch).await;
        if self.export_spans {
            trace_decision(&result);
        }
        match &result {
            Ok(r) => tracing::debug!(
                user_id = %req.user, ad_id = %req.ad, kind = r.kind.as_str(),
                phone = %r.phone.masked(), "resolved"
            ),
            Err(ResolveError::Unavailable {
                fail_closed: Some(source),
            }) => tracing::warn!(
                user_id = %req.user, ad_id = %req.ad, source = source.as_str(),
                "source failed closed; answering 503"
            ),
            Err(ResolveError::Undecided(source)) => tracing::debug!(
                user_id = %req.user, ad_id = %req.ad, source = source.as_str(),
                "source undecided (no word from its upstream); answering 503"
            ),
            Err(e) => tracing::debug!(user_id = %req.user, ad_id = %req.ad, "{e}"),
        }
        result
    }

    async fn decide(
        &self,
        req: &Request,
        trace: Option<&RequestTrace<'_>>,
        batch: Option<&Batch>,
    ) -> Result<Resolved, ResolveError> {
        // Moved into the boxed future within this statement, so the request's
        // future holds a pointer across the await, not a plan.
        let asking = match self.plan(req, trace) {
            Ok(done) => return done,
            // Only what needs an upstream call can be shed for CPU: a hit costs
            // about what a shed does.
            Err(_) if !self.admission.admit() => return Err(ResolveError::Overloaded),
            // Boxed: the hit path then neither builds nor moves it.
            Err(asking) => Box::pin(self.ask(req, asking, batch)),
        };
        asking.await
    }

    /// The decision when the caches suffice (the hit path), else what to ask.
    fn plan<'h>(
        &self,
        req: &Request,
        request_trace: Option<&'h RequestTrace<'h>>,
    ) -> Result<Result<Resolved, ResolveError>, Asking<'h>> {
        // Parsed only if an upstream call is made: one trace per request.
        let trace = Incoming::new(request_trace, self.export_spans);
        let exported = trace.exported();
        let now = self.caches.clock.now();
        // A hit near expiry also starts a background refresh of its key.
        let fresh = |ask: Ask| {
            let (cache, key) = self.cache_of(req, ask);
            // A refresh ahead is a request of its own to the breaker.
            let refresh = || self.fetch(req, ask, &trace, self.next_ticket(), None);
            let cached = cache.get_fresh_refreshing(&key, now, refresh);
            if exported && cached != Known::NotKnown {
                trace_cache(cache.name(), Via::Hit);
            }
            cached
        };
        let progress = self
            .selection
            .start(req, || self.status.tracking(req.user), fresh);
        match self.finish(&progress.states) {
            Some(done) => Ok(done),
            None => Err(Asking { trace, progress }),
        }
    }

    async fn ask(
        &self,
        req: &Request,
        asking: Asking<'_>,
        batch: Option<&Batch>,
    ) -> Result<Resolved, ResolveError> {
        let Asking {
            trace,
            mut progress,
        } = asking;
        let trace = &trace;
        let (ticket, deadline) = match batch {
            Some(batch) => (batch.ticket, batch.deadline),
            None => (
                self.next_ticket(),
                tokio::time::Instant::now() + self.deadline,
            ),
        };
        let asks = progress.asks();
        let start =
            |slot: Source| asks[slot].map(|ask| self.lookup(req, ask, trace, ticket, batch));
        let mut anonymous = start(Source::Anonymous);
        let mut real = start(Source::RealPhone);
        let mut calltracking = start(Source::Calltracking);
        // Time the gateway loses is given back (docs/rules.md, "Whose time").
        let lost = self.upstreams.lost();
        let (mut mark, mut given) = (lost.mark(), std::time::Duration::ZERO);
        let deadline = tokio::time::sleep_until(deadline);
        tokio::pin!(deadline);
        loop {
            let next = tokio::select! {
                () = &mut deadline => {
                    let lost_now = lost.since(mark);
                    if lost_now > lost.tolerance() && given < self.deadline {
                        let back = lost_now.min(self.deadline - given);
                        given += back;
                        mark = lost.mark();
                        deadline.as_mut().reset(tokio::time::Instant::now() + back);
                        continue;
                    }
                    tracing::debug!(user_id = %req.user, ad_id = %req.ad, "request deadline reached");
                    progress.at_deadline(|ask| self.stale(req, ask));
                    (anonymous, real, calltracking) = (None, None, None);
                    None
                }
                lookup = poll_some(&mut anonymous), if anonymous.is_some() => {
                    anonymous = None;
                    progress.answered(Source::Anonymous, state_of(&lookup))
                }
                lookup = poll_some(&mut real), if real.is_some() => {
                    real = None;
                    progress.answered(Source::RealPhone, state_of(&lookup))
                }
                lookup = poll_some(&mut calltracking), if calltracking.is_some() => {
                    calltracking = None;
                    progress.answered(Source::Calltracking, state_of(&lookup))
                }
                else => {
                    // Unreachable: a pending state always has its future.
                    // Fail closed rather than loop.
                    tracing::error!(states = ?progress.states, "resolve: pending source without a call");
                    return Err(ResolveError::Unavailable { fail_closed: None });
                }
            };
            // What an answer leads to takes the slot of its source.
            if let Some(ask) = next {
                let lookup = Some(self.lookup(req, ask, trace, ticket, batch));
                match ask.source() {
                    Source::Anonymous => anonymous = lookup,
                    Source::Calltracking => calltracking = lookup,
                    Source::RealPhone => real = lookup,
                }
            }
            if let Some(done) = self.finish(&progress.states) {
                return done;
            }
        }
    }

    /// A usable stale answer to `ask`, read at the deadline.
    fn stale(&self, req: &Request, ask: Ask) -> Known<Phone> {
        let (cache, key) = self.cache_of(req, ask);
        cache.get_stale(&key)
    }

    fn cache_of(&self, req: &Request, ask: Ask) -> (&PhoneCache, CacheKey) {
        let phones = &self.caches.phones;
        match ask {
            Ask::Anonymous => (&phones[Source::Anonymous], CacheKey::ad(req.user, req.ad)),
            Ask::RealPhone => (&phones[Source::RealPhone], CacheKey::ad(req.user, req.ad)),
            Ask::Calltracking(real) => (
                &phones[Source::Calltracking],
                CacheKey::real_phone(req.user, real),
            ),
        }
    }

    /// `ask` through its cache: the cached answer, or the upstream's
    /// (coalesced); an item of `batch` takes its place first (`fan_out`).
    fn lookup<'a>(
        &'a self,
        req: &'a Request,
        ask: Ask,
        trace: &'a Incoming<'_>,
        ticket: Ticket,
        batch: Option<&'a Batch>,
    ) -> LookupFuture<'a> {
        let (cache, key) = self.cache_of(req, ask);
        let exported = trace.exported();
        let Some(batch) = batch else {
            let fetch = self.fetch(req, ask, trace, ticket, None);
            let lookup = cache.get_or_fetch(key, move || fetch);
            if !exported {
                return Box::pin(lookup);
            }
            return Box::pin(async move {
                let lookup = lookup.await;
                trace_cache(cache.name(), lookup.via);
                lookup
            });
        };
        let fetch = move |place| self.fetch(req, ask, trace, ticket, place);
        Box::pin(async move {
            let place = batch.place(ask.source()).await;
            let fetch = fetch(place);
            let lookup = cache.get_or_fetch(key, move || fetch).await;
            if exported {
                trace_cache(cache.name(), lookup.via);
            }
            lookup
        })
    }

    /// The upstream call answering `ask`, run in the cache's own task and
    /// holding `place` until it ends; a coalesced fetch carries the ticket,
    /// id and trace of the request that started it.
    fn fetch(
        &self,
        req: &Request,
        ask: Ask,
        trace: &Incoming<'_>,
        ticket: Ticket,
        place: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> impl Future<Output = FetchResult> + Send + use<> {
        let (user, ad) = (req.user, req.ad);
        let upstreams = self.upstreams.clone();
        let request_id = crate::telemetry::current_request_id();
        let trace = Some(trace.context().clone());
        // Boxed once here: the call's future is large, and unboxed it was
        // copied whole into the lookup, the task and its every stage change.
        Box::pin(async move {
            let call = Call {
                ticket,
                batch_item: place.is_some(),
                request_id: request_id.as_ref(),
                trace: trace.as_ref(),
            };
            let _place = place;
            match ask {
                Ask::Anonymous => upstreams.anonymous(user, ad, call).await,
                Ask::RealPhone => upstreams.real_phone(user, ad, call).await,
                Ask::Calltracking(real) => upstreams.virtual_number(user, real, call).await,
            }
        })
    }
}

/// An answer as the state it settles, by the error's class: only its
/// upstream's verdict fails the source; anything else leaves it undecided.
fn state_of(lookup: &Lookup) -> SourceState {
    match &lookup.answer {
        Ok(Some(phone)) => SourceState::Found(
            *phone,
            match lookup.via {
                Via::Hit => Origin::Cache,
                Via::Miss | Via::Coalesced => Origin::Upstream,
                Via::Stale(failure) => Origin::Stale(failure),
            },
        ),
        Ok(None) => SourceState::NotFound,
        Err(error) => match error.class() {
            Class::Verdict => SourceState::Failed(error.failure()),
            Class::Undecided => SourceState::Undecided(error.failure()),
        },
    }
}

#[cold]
#[inline(never)]
fn trace_cache(cache: &'static str, via: Via) {
    let outcome = match via {
        Via::Hit => "hit",
        Via::Miss => "miss",
        Via::Coalesced => "coalesced",
        Via::Stale(_) => "stale",
    };
    crate::telemetry::trace::event("cache", &[("cache", cache), ("outcome", outcome)]);
}

/// The decision, as an event of the exported request span; never the number.
#[cold]
#[inline(never)]
fn trace_decision(result: &Result<Resolved, ResolveError>) {
    let event = |attributes: &[(&'static str, &'static str)]| {
        crate::telemetry::trace::event("decision", attributes);
    };
    match result {
        Ok(resolved) => event(&[("outcome", "answered"), ("kind", resolved.kind.as_str())]),
        Err(ResolveError::NoPhone) => event(&[("outcome", "no_phone")]),
        Err(ResolveError::Unavailable {
            fail_closed: Some(source),
        }) => event(&[("outcome", "fail_closed"), ("source", source.as_str())]),
        Err(ResolveError::Unavailable { fail_closed: None }) => {
            event(&[("outcome", "unavailable")])
        }
        Err(ResolveError::Overloaded) => event(&[("outcome", "shed")]),
        Err(ResolveError::Undecided(source)) => {
            event(&[("outcome", "undecided"), ("source", source.as_str())]);
        }
    }
}

fn finished(decision: Decision) -> Option<Result<Resolved, ResolveError>> {
    match decision {
        Decision::Wait => None,
        Decision::Answer(kind, phone, reason) => Some(Ok(Resolved {
            kind,
            phone,
            reason,
        })),
        Decision::NoPhone => Some(Err(ResolveError::NoPhone)),
        Decision::Unavailable { fail_closed } => {
            Some(Err(ResolveError::Unavailable { fail_closed }))
        }
        Decision::Undecided(source) => Some(Err(ResolveError::Undecided(source))),
    }
}

/// Awaits the future in `slot`; only polled when the slot is full (select guard).
async fn poll_some(slot: &mut Option<LookupFuture<'_>>) -> Lookup {
    match slot {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::domain::{AdId, CategoryId, Failure, UserId};
    use crate::upstream::UpstreamError;
    use std::time::Duration;

    fn phone(text: &str) -> Phone {
        Phone::parse(text).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_deadline_pending_sources_serve_usable_stale_values_or_fail() {
        let toml = "[cache.real_phone]\ncapacity = 100\n[cache.anonymous]\ncapacity = 100\n\
             [cache.calltracking]\ncapacity = 100";
        let config = Config::from_toml(toml).unwrap();
        let caches = Caches::new(&config.cache);
        let status = Arc::new(StatusSet::default());
        status.mark_loaded();
        let bound = config.server.max_in_flight;
        let upstreams = Arc::new(Upstreams::new(&config.upstreams, config.breaker, bound));
        let resolver = Resolver::new(&config, upstreams, caches.clone(), status);
        let real = phone("+79161234567");
        let (virtual_number, anonymous) = (phone("+74951234567"), phone("+78001112233"));
        let user = UserId::new(42).unwrap();
        let req = Request {
            user,
            ad: AdId::new(1).unwrap(),
            category: CategoryId::new(9).unwrap(),
            phone: None,
        };
        let ad = CacheKey::ad(user, req.ad);
        caches.phones[Source::RealPhone].insert(ad, Some(real));
        caches.phones[Source::Calltracking]
            .insert(CacheKey::real_phone(user, real), Some(virtual_number));
        caches.phones[Source::Anonymous].insert(ad, Some(anonymous));
        // Past every TTL, within max_stale.
        tokio::time::advance(Duration::from_secs(1000)).await;
        // A tracked seller whose sources are all pending reaches the deadline.
        let at_deadline = |req: &Request, real: Option<Phone>| {
            let mut progress = resolver.selection.start(
                req,
                || Known::Yes(()),
                |ask| match (ask, real) {
                    (Ask::RealPhone, Some(phone)) => Known::Yes(phone),
                    _ => Known::NotKnown,
                },
            );
            progress.at_deadline(|ask| resolver.stale(req, ask));
            progress.states
        };
        let stale = |phone| SourceState::Found(phone, Origin::Stale(Failure::Deadline));
        let all_stale = States::new(stale(anonymous), stale(virtual_number), stale(real));
        assert_eq!(at_deadline(&req, None), all_stale);
        // The real number already known: call tracking's stale value for it.
        let states = at_deadline(&req, Some(real));
        assert_eq!(states[Source::Calltracking], stale(virtual_number));
        // Nothing usable (another seller): everything pending is undecided.
        let other = Request {
            user: UserId::new(43).unwrap(),
            ..req
        };
        let late = SourceState::Undecided(Failure::Deadline);
        assert_eq!(at_deadline(&other, None), States::new(late, late, late));
        // Past max_stale: undecided too.
        tokio::time::advance(Duration::from_secs(3600)).await;
        let states = at_deadline(&req, None);
        assert_eq!(states[Source::RealPhone], late);
        assert_eq!(states[Source::Calltracking], late);
    }

    /// Every upstream error by its code and class, and a number by its origin.
    #[test]
    fn an_answer_is_a_state_by_its_code() {
        let found = phone("+79161234567");
        let lookup = |answer, via| Lookup { answer, via };
        #[rustfmt::skip]
        let numbers = [
            (Via::Hit,                             Origin::Cache),
            (Via::Miss,                            Origin::Upstream),
            (Via::Coalesced,                       Origin::Upstream),
            (Via::Stale(Failure::Timeout),         Origin::Stale(Failure::Timeout)),
            (Via::Stale(Failure::LoadRefused),     Origin::Stale(Failure::LoadRefused)),
        ];
        for (via, origin) in numbers {
            let state = state_of(&lookup(Ok(Some(found)), via));
            assert_eq!(state, SourceState::Found(found, origin), "{via:?}");
            let none = state_of(&lookup(Ok(None), via));
            assert_eq!(none, SourceState::NotFound, "{via:?}");
        }
        use SourceState::{Failed, Undecided};
        #[rustfmt::skip]
        let table = [
            (UpstreamError::Status(500),               Failed(Failure::ErrorStatus)),
            (UpstreamError::Status(422),               Failed(Failure::Rejected)),
            (UpstreamError::Timeout,                   Failed(Failure::Timeout)),
            (UpstreamError::CircuitOpen,               Failed(Failure::CircuitOpen)),
            (UpstreamError::Connect("reset".into()),   Failed(Failure::Connect)),
            (UpstreamError::Decode("not json"),        Failed(Failure::Invalid)),
            (UpstreamError::Request,                   Undecided(Failure::Gateway)),
            (UpstreamError::Saturated,                 Undecided(Failure::Bound)),
            (UpstreamError::SellerSaturated,           Undecided(Failure::Bound)),
            (UpstreamError::LoadRefused(429),          Undecided(Failure::LoadRefused)),
            (UpstreamError::LoadRefused(503),          Undecided(Failure::LoadRefused)),
            (UpstreamError::Load,                      Undecided(Failure::Load)),
            (UpstreamError::LostTime,                  Undecided(Failure::LostTime)),
            (UpstreamError::Local("EMFILE".into()),    Undecided(Failure::Gateway)),
            (UpstreamError::LocalTimeout,              Undecided(Failure::Gateway)),
            (UpstreamError::Panicked,                  Undecided(Failure::Gateway)),
            (UpstreamError::Cancelled,                 Undecided(Failure::Gateway)),
        ];
        for (error, want) in table {
            let label = format!("{error:?}");
            assert_eq!(state_of(&lookup(Err(error), Via::Miss)), want, "{label}");
        }
    }
}
