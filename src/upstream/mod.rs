//! The three upstreams, as typed calls over a keep-alive pool per upstream. A
//! call meets its gates in this order: the seller's place (`limit`), the breaker
//! (`breaker`), the adaptive bound (`limit`), the back-off (`backoff`), the timer
//! (`timer`); then `endpoint` sends the GET on a pooled connection (`pool`). The
//! status feed is an endpoint of its own, so a failing feed opens no breaker that
//! lookups go through. Why no client crate: docs/design.md, "Upstreams".

mod backoff;
mod breaker;
mod ending;
mod endpoint;
mod error;
#[cfg(feature = "test-faults")]
pub mod faults;
mod limit;
mod pool;
mod timer;

use hyper::header::HeaderValue;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

pub use ending::{Line, table};
pub use error::{Class, UpstreamError, UpstreamName};

use crate::config::{BreakerConfig, UpstreamsConfig};
use crate::domain::{AdId, Phone, Source, StatusItem, UserId};
use crate::runtime::lost::{LostTime, PROBE_PERIOD};
use crate::telemetry::trace::{TraceContext, upstream_span};
use backoff::{Judgement, Unsent};
use breaker::{Allow, Breaker, Caller};
use ending::{Ending, Health};
use endpoint::{Endpoint, parse_phone};
use limit::{Adapt, End};
use pool::Phase;

/// The status feed's poller asks for one page at a time; a second place
/// covers a leader hand-over overlapping one poll.
const STATUS_FEED_MAX_IN_FLIGHT: usize = 2;

/// The typed clients of the three upstreams and the status feed.
pub struct Upstreams {
    real_phone: Endpoint,
    anonymous: Endpoint,
    calltracking: Endpoint,
    status_feed: Endpoint,
    /// Fed by the runtime's probe; read by every call whose timer fires.
    lost: std::sync::Arc<LostTime>,
}

#[derive(Deserialize)]
struct PhoneBody {
    phone: String,
}

#[derive(Deserialize)]
struct VirtualPhoneBody {
    virtual_phone: String,
}

/// A page of the status feed; no items means caught up.
#[derive(Debug, Clone, Deserialize)]
pub struct StatusPage {
    pub items: Vec<StatusItem>,
    pub next_cursor: Option<String>,
}

impl Upstreams {
    /// The clients of `[upstreams]`, each with its own breaker and bounds;
    /// `server_max_in_flight` stands in for a `max_in_flight` of 0.
    pub fn new(
        upstreams: &UpstreamsConfig,
        breaker: BreakerConfig,
        server_max_in_flight: usize,
    ) -> Self {
        let endpoint = |source: Source| {
            let upstream = upstreams.of(source);
            let max_in_flight = upstream.max_in_flight_or(server_max_in_flight);
            let need = crate::config::seller_need(source);
            let per_seller = upstream.max_in_flight_per_seller_or(max_in_flight, need);
            let adapt = upstream.adaptive_limit.then_some(Adapt {
                min: upstream.min_in_flight,
                tolerance: upstream.latency_tolerance,
                climb_floor: Adapt::climb_floor(upstream.timeout),
            });
            let name = UpstreamName::Source(source);
            Endpoint::new(
                name,
                upstream,
                Breaker::new(
                    name.as_str(),
                    breaker,
                    breaker.min_sellers,
                    breaker.min_requests,
                ),
                max_in_flight,
                adapt,
                per_seller,
                upstreams.pool_idle_timeout,
            )
        };
        let calltracking = &upstreams.calltracking.upstream;
        Upstreams {
            real_phone: endpoint(Source::RealPhone),
            anonymous: endpoint(Source::Anonymous),
            calltracking: endpoint(Source::Calltracking),
            // No seller: its breaker opens on its own failures alone.
            status_feed: Endpoint::new(
                UpstreamName::StatusFeed,
                calltracking,
                Breaker::new(UpstreamName::StatusFeed.as_str(), breaker, 1, 1),
                STATUS_FEED_MAX_IN_FLIGHT,
                None,
                STATUS_FEED_MAX_IN_FLIGHT,
                upstreams.pool_idle_timeout,
            ),
            lost: std::sync::Arc::new(LostTime::new(upstreams.lost_time_tolerance, PROBE_PERIOD)),
        }
    }

    pub fn lost(&self) -> &LostTime {
        &self.lost
    }

    /// For the probe that feeds it.
    pub fn lost_time(&self) -> std::sync::Arc<LostTime> {
        self.lost.clone()
    }

    /// The seller's real number; `None` when the seller has no phone (404).
    pub async fn real_phone(
        &self,
        user: UserId,
        ad: AdId,
        call: Call<'_>,
    ) -> Result<Option<Phone>, UpstreamError> {
        let url = format!("{}/v1/users/{user}/phone?ad_id={ad}", self.real_phone.path);
        self.phone(&self.real_phone, user, url, call).await
    }

    /// The ad's anonymous number; `None` when none is connected (404).
    pub async fn anonymous(
        &self,
        user: UserId,
        ad: AdId,
        call: Call<'_>,
    ) -> Result<Option<Phone>, UpstreamError> {
        let url = format!(
            "{}/v1/anonymous-numbers?user_id={user}&ad_id={ad}",
            self.anonymous.path
        );
        self.phone(&self.anonymous, user, url, call).await
    }

    async fn phone(
        &self,
        endpoint: &Endpoint,
        seller: UserId,
        url: String,
        call: Call<'_>,
    ) -> Result<Option<Phone>, UpstreamError> {
        let body: Option<PhoneBody> = self.get_json(endpoint, Some(seller), url, call).await?;
        body.map(|b| parse_phone(&b.phone)).transpose()
    }

    /// The call-tracking number for the seller's real number; `None` on 404.
    pub async fn virtual_number(
        &self,
        user: UserId,
        phone: Phone,
        call: Call<'_>,
    ) -> Result<Option<Phone>, UpstreamError> {
        // `+` must be escaped in a query; the rest of a normalised phone is digits.
        let url = format!(
            "{}/v1/virtual-numbers?user_id={user}&phone=%2B{}",
            self.calltracking.path,
            phone.to_u64()
        );
        let body: Option<VirtualPhoneBody> = self
            .get_json(&self.calltracking, Some(user), url, call)
            .await?;
        body.map(|b| parse_phone(&b.virtual_phone)).transpose()
    }

    /// Its adaptive limit, or its fixed bound.
    pub fn limit(&self, source: Source) -> usize {
        match source {
            Source::RealPhone => &self.real_phone,
            Source::Anonymous => &self.anonymous,
            Source::Calltracking => &self.calltracking,
        }
        .in_flight
        .limit()
    }

    /// One page of the status feed after `cursor` (from the start when
    /// `None`); a 404 is a failure here.
    pub async fn status_page(
        &self,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<StatusPage, UpstreamError> {
        let mut url = format!("{}/v1/statuses?limit={limit}", self.status_feed.path);
        if let Some(cursor) = cursor {
            url.push_str("&after=");
            url.extend(form_urlencoded::byte_serialize(cursor.as_bytes()));
        }
        self.get_json(&self.status_feed, None, url, Call::default())
            .await?
            .ok_or(UpstreamError::Status(404))
    }

    /// GET `url` about `seller`'s numbers through the gates; 200 -> parsed
    /// body, 404 -> `None`, anything else -> error.
    async fn get_json<T: DeserializeOwned>(
        &self,
        endpoint: &Endpoint,
        seller: Option<UserId>,
        url: String,
        call: Call<'_>,
    ) -> Result<Option<T>, UpstreamError> {
        let start = tokio::time::Instant::now();
        let result = self.gates(endpoint, seller, url, call).await;
        let row = Ending::of(&result).row();
        endpoint
            .metrics
            .ended(row, result.as_ref().err(), start.elapsed());
        result
    }

    async fn gates<T: DeserializeOwned>(
        &self,
        endpoint: &Endpoint,
        seller: Option<UserId>,
        url: String,
        call: Call<'_>,
    ) -> Result<Option<T>, UpstreamError> {
        // The seller's place first: a seller over its bound then never holds,
        // even for a moment, a place of the upstream's that others need.
        let _seller_slot = match seller.map(|user| endpoint.per_seller.slot(user)) {
            Some(None) => return Err(UpstreamError::SellerSaturated),
            taken => taken.flatten(),
        };
        let caller = Caller {
            seller: seller.map_or(0, UserId::get),
            ticket: call.ticket,
        };
        // An open breaker answers without a call and takes no place (a hanging
        // upstream's probes may hold them all).
        let allowed = endpoint.breaker.allow(caller.seller);
        match allowed {
            Allow::No => return Err(UpstreamError::CircuitOpen),
            Allow::Wait => return Err(UpstreamError::HalfOpen),
            Allow::Closed | Allow::Probe => {}
        }
        // A call that panics or is dropped is recorded on the way out, so a
        // half-open breaker's probe never stays taken.
        let told = Told {
            breaker: &endpoint.breaker,
            caller,
            told: false,
        };
        // A would-be probe that finds no place is not sent; the breaker's
        // word stands.
        let slot = if call.batch_item {
            endpoint.in_flight.batch_slot()
        } else {
            endpoint.in_flight.slot()
        };
        let Some(slot) = slot else {
            if allowed == Allow::Probe {
                told.release();
                return Err(if endpoint.breaker.probes_undecided() {
                    UpstreamError::HalfOpen
                } else {
                    UpstreamError::CircuitOpen
                });
            }
            told.record(&Err::<(), _>(UpstreamError::Saturated));
            return Err(UpstreamError::Saturated);
        };
        let now = tokio::time::Instant::now();
        let result = match endpoint.backoff.send(now) {
            Err(Unsent::Held) => Err(UpstreamError::BackingOff),
            // Judged failing for everyone: its verdict, as an open breaker's.
            Err(Unsent::Failing) => Err(UpstreamError::CircuitOpen),
            Ok(sent) => {
                #[cfg(feature = "test-faults")]
                faults::panic_for(seller);
                let span = upstream_span(endpoint.name.as_str());
                let phase = Phase::default();
                let get = endpoint.get(url, call.request_id, call.trace, span.clone(), &phase);
                let result = timer::timed(
                    &self.lost,
                    endpoint.timeout,
                    get.instrument(span),
                    &phase,
                    now,
                )
                .await;
                endpoint.judge(result, sent, caller)
            }
        };
        let row = Ending::of(&result).row();
        slot.finish(row.limit);
        told.record(&result);
        result
    }
}

impl Endpoint {
    fn judge<T>(
        &self,
        result: Result<T, UpstreamError>,
        sent: backoff::Sent,
        caller: Caller,
    ) -> Result<T, UpstreamError> {
        let now = tokio::time::Instant::now();
        let row = match &result {
            Ok(_) => Ending::Answered.row(),
            Err(error) => Ending::Failed(error).row(),
        };
        match row.health {
            Health::Down => match self.backoff.failed(sent, now, caller) {
                Judgement::Verdict => result,
                Judgement::Load => Err(UpstreamError::Load),
            },
            Health::Up => {
                self.backoff.answered(now);
                result
            }
            Health::Silent => {
                if row.limit == End::Answered {
                    self.backoff.answered(now);
                }
                result
            }
        }
    }
}

struct Told<'a> {
    breaker: &'a Breaker,
    caller: Caller,
    told: bool,
}

impl Told<'_> {
    fn record<T>(mut self, result: &Result<T, UpstreamError>) {
        self.breaker.record(result, self.caller);
        self.told = true;
    }

    /// A call not sent after all: the breaker learns nothing.
    fn release(mut self) {
        self.breaker.release(self.caller.seller);
        self.told = true;
    }
}

impl Drop for Told<'_> {
    fn drop(&mut self) {
        if !self.told {
            let ended = if std::thread::panicking() {
                UpstreamError::Panicked
            } else {
                UpstreamError::Cancelled
            };
            self.breaker.record(&Err::<(), _>(ended), self.caller);
        }
    }
}

/// The gateway's own sequence number of a request (a batch is one request),
/// by which the breaker tells requests apart; never a header a caller sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ticket(pub u64);

impl Ticket {
    pub const NONE: Ticket = Ticket(0);
}

/// What a call carries from the request it serves (forwarded upstream).
#[derive(Debug, Clone, Copy, Default)]
pub struct Call<'a> {
    pub ticket: Ticket,
    /// An item of a batch (its place on the bound: `Bound::batch_slot`).
    pub batch_item: bool,
    pub request_id: Option<&'a HeaderValue>,
    pub trace: Option<&'a TraceContext>,
}

#[cfg(test)]
mod tests;
