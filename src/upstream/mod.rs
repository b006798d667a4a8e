//! The three upstreams, as typed calls over one pooled HTTP/1.1 client.
//!
//! Every call is bounded by its upstream's timeout (connect, headers and body
//! together) and every answer is validated: the status the contract allows, a JSON
//! body of the right shape, a phone that normalises. Anything else is an
//! [`UpstreamError`]. Nothing here caches or decides; see `resolve`.
//!
//! Calls in flight are bounded per upstream (`upstreams.<name>.max_in_flight`,
//! a limit that adapts below it when the upstream refuses load or slows down,
//! see `limit`):
//! a fetch outlives the request that started it (the cache runs it in its own
//! task, to its timeout), so clients that send and reset at once would otherwise
//! drive the upstream's concurrency at the raw request rate, past anything
//! `server.max_in_flight` lets in. They are bounded per seller too
//! (`upstreams.<name>.max_in_flight_per_seller`, see `limit`), so that one
//! caller flooding one seller cannot take every place. A call over either bound
//! is not made: it fails at once as [`UpstreamError::Saturated`] or
//! [`UpstreamError::SellerSaturated`], a refusal of the gateway's own: the
//! source is undecided, not failed, and its `on_error` does not apply
//! (docs/rules.md).
//!
//! Every error has a code and a class ([`UpstreamError::failure`],
//! [`UpstreamError::class`]): the upstream's verdict, or undecided (the
//! gateway's own trouble, or the upstream refusing load: 429, or 503 with
//! `Retry-After`). A call's timeout counts only the time the upstream had
//! (`lost`): time the gateway lost is given back once, and a call that loses
//! more is undecided. A health failure of a call sent while the gateway was
//! sending that upstream more than it has been is load of the gateway's own
//! making (`load`): undecided too. Only signs of the upstream's health reach
//! the breaker, each with the seller it was about and the request it came
//! from, so that one seller's failing calls, or one caller's batch, cannot
//! open it for everyone (`breaker`).
//!
//! The status feed is an endpoint of its own, on call tracking's base URL and
//! timeout: its own connections, its own breaker and its own bound (it polls one
//! page at a time), and its own `upstream="status_feed"` series. A failing feed
//! therefore opens no breaker that number lookups go through, and its polls take
//! no place a lookup needs.
//!
//! The client is hyper's connection API with a pool per upstream (`pool`), used
//! directly rather than through reqwest or hyper-util's pooled client: measured
//! on the cold path (`benches/load/harness.py --cold`), reqwest spent more CPU per
//! call than the whole rest of the call, most of it parsing each URL with the
//! `url` crate (IDNA host mapping included), its redirect and timeout layers, and
//! boxing; hyper-util's pool is costed in `pool`'s doc. Here the URI is
//! formatted and parsed once by `http::Uri`, in origin form onto the base URL's
//! path (base URLs are checked to be plain ASCII `http://` at start), and the
//! guarantees reqwest gave are kept by hand: pooled keep-alive connections with an
//! idle timeout, no Nagle, one timeout over connect, head and body, a bounded
//! body, no redirects followed (a 3xx is an unexpected status, as the contract
//! allows none).

mod breaker;
mod error;
#[cfg(feature = "test-faults")]
pub mod faults;
mod limit;
mod load;
mod lost;
mod pool;

use std::future::Future;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{HeaderName, HeaderValue, USER_AGENT};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

pub use error::{Class, UpstreamError, UpstreamName};
pub use lost::{LostTime, lateness};

use crate::config::{BreakerConfig, UpstreamConfig, UpstreamsConfig};
use crate::domain::{AdId, Phone, Source, StatusItem, UserId};
use crate::telemetry::trace::{TRACEPARENT, TRACESTATE, TraceContext, call_headers, upstream_span};
use breaker::{Allow, Breaker, Caller};
use limit::{Adapt, Bound, End, PerSeller};
use load::SendRate;
use pool::{Phase, Pool};

/// Largest upstream body read; a phone answer is tens of bytes, a status page of
/// 10,000 items under a megabyte.
const MAX_BODY_BYTES: usize = 4 << 20;
/// Below the keep-alive of common upstream servers (60 s and up), so the pool
/// drops a connection before the server does and never sends on a dead one.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Idle connections kept per upstream: enough for thousands of requests a
/// second at tens of milliseconds each.
const POOL_MAX_IDLE: usize = 512;
/// The status feed's calls in flight: its poller asks for one page at a time; a
/// second place covers a leader hand-over on this replica overlapping one poll.
const STATUS_FEED_MAX_IN_FLIGHT: usize = 2;

/// One upstream's address and limits.
struct Endpoint {
    name: UpstreamName,
    /// The base URL's path without its trailing `/`; calls go to paths under it.
    path: String,
    pool: Pool,
    timeout: Duration,
    breaker: Breaker,
    /// Calls under way, and the most allowed at once.
    in_flight: Bound,
    /// Each seller's calls under way, and the most one seller may have.
    per_seller: PerSeller,
    /// The calls sent, now and before any trouble: whether a call goes out
    /// hot (`load`).
    send_rate: SendRate,
    /// Its series, registered once: a labelled `counter!` per call builds and
    /// hashes its key and looks it up in the registry (the cold path's CPU).
    metrics: CallMetrics,
}

/// `phones_gateway_upstream_requests_total{upstream, outcome}` per outcome and
/// `phones_gateway_upstream_request_duration_seconds{upstream}` of one upstream.
struct CallMetrics {
    ok: metrics::Counter,
    not_found: metrics::Counter,
    timeout: metrics::Counter,
    circuit_open: metrics::Counter,
    saturated: metrics::Counter,
    seller_saturated: metrics::Counter,
    load_refused: metrics::Counter,
    load: metrics::Counter,
    lost_time: metrics::Counter,
    local: metrics::Counter,
    error: metrics::Counter,
    duration: metrics::Histogram,
}

impl CallMetrics {
    fn new(upstream: &'static str) -> Self {
        let outcome = |outcome: &'static str| metrics::counter!("phones_gateway_upstream_requests_total", "upstream" => upstream, "outcome" => outcome);
        CallMetrics {
            ok: outcome("ok"),
            not_found: outcome("not_found"),
            timeout: outcome("timeout"),
            circuit_open: outcome("circuit_open"),
            saturated: outcome("saturated"),
            seller_saturated: outcome("seller_saturated"),
            load_refused: outcome("load_refused"),
            load: outcome("load"),
            lost_time: outcome("lost_time"),
            local: outcome("local"),
            error: outcome("error"),
            duration: metrics::histogram!("phones_gateway_upstream_request_duration_seconds", "upstream" => upstream),
        }
    }

    /// The counter of `result`'s outcome.
    fn outcome<T>(&self, result: &Result<Option<T>, UpstreamError>) -> &metrics::Counter {
        match result {
            Ok(Some(_)) => &self.ok,
            Ok(None) => &self.not_found,
            Err(error) => match error {
                UpstreamError::Timeout => &self.timeout,
                UpstreamError::CircuitOpen => &self.circuit_open,
                UpstreamError::Saturated => &self.saturated,
                UpstreamError::SellerSaturated => &self.seller_saturated,
                UpstreamError::LoadRefused(_) => &self.load_refused,
                UpstreamError::Load => &self.load,
                UpstreamError::LostTime => &self.lost_time,
                // The gateway's own trouble before or while connecting.
                UpstreamError::Local(_)
                | UpstreamError::LocalTimeout
                | UpstreamError::Request => &self.local,
                UpstreamError::Connect(_)
                | UpstreamError::Status(_)
                | UpstreamError::Decode(_)
                // Never returned by a call (the cache's task ends them).
                | UpstreamError::Panicked
                | UpstreamError::Cancelled => &self.error,
            },
        }
    }
}

impl Endpoint {
    fn new(
        name: UpstreamName,
        config: &UpstreamConfig,
        breaker: Breaker,
        max_in_flight: usize,
        adapt: Option<Adapt>,
        max_in_flight_per_seller: usize,
    ) -> Self {
        // Checked at start to be an http:// URL naming a host
        // (`config::upstreams`); were it not, every call would fail to
        // connect to a name that never resolves (RFC 6761 `.invalid`).
        let base = hyper::Uri::try_from(config.base_url.as_str()).ok();
        let authority = base
            .as_ref()
            .and_then(hyper::Uri::authority)
            .cloned()
            .unwrap_or(hyper::http::uri::Authority::from_static("base-url.invalid"));
        Endpoint {
            name,
            path: base
                .as_ref()
                .map_or("", |b| b.path().trim_end_matches('/'))
                .to_owned(),
            pool: Pool::new(&authority, POOL_IDLE_TIMEOUT, POOL_MAX_IDLE),
            timeout: config.timeout,
            breaker,
            in_flight: Bound::new(
                max_in_flight,
                adapt,
                metrics::gauge!("phones_gateway_upstream_limit", "upstream" => name.as_str()),
            ),
            per_seller: PerSeller::new(max_in_flight_per_seller),
            send_rate: SendRate::new(),
            metrics: CallMetrics::new(name.as_str()),
        }
    }

    /// The call itself, once its places are taken: sends the GET on a pooled
    /// connection and reads the answer (200 -> parsed body, 404 -> `None`);
    /// `phase` tells when the upstream is asked.
    async fn get<T: DeserializeOwned>(
        &self,
        url: String,
        request_id: Option<&HeaderValue>,
        trace: Option<&TraceContext>,
        span: tracing::Span,
        phase: &Phase,
    ) -> Result<Option<T>, UpstreamError> {
        let request = get_request(url, request_id, trace, &span)?;
        let mut conn = self.pool.take(phase).await?;
        let response = self.pool.send(&mut conn, request, phase).await?;
        let status = response.status().as_u16();
        span.record("http.response.status_code", status);
        if status != 200 && status != 404 {
            // Its body is not read: the connection is dropped, not reused.
            return Err(status_error(&response));
        }
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await;
        // Reused only once its answer was read to the end.
        if body.is_ok() {
            self.pool.put_back(conn);
        }
        if status == 404 {
            return Ok(None);
        }
        let body = body
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    UpstreamError::Decode("body too large")
                } else {
                    UpstreamError::Connect("the body could not be read".into())
                }
            })?
            .to_bytes();
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| UpstreamError::Decode(decode_kind(&e)))
    }
}

const AGENT: HeaderValue =
    HeaderValue::from_static(concat!("phones-gateway/", env!("CARGO_PKG_VERSION")));
const REQUEST_ID: HeaderName = HeaderName::from_static(crate::telemetry::REQUEST_ID_HEADER);

/// The typed clients of the three upstreams and the status feed; share it
/// behind an `Arc`.
pub struct Upstreams {
    real_phone: Endpoint,
    anonymous: Endpoint,
    calltracking: Endpoint,
    /// Call tracking's base URL and timeout, everything else its own.
    status_feed: Endpoint,
    /// Time the gateway lost, fed by the runtime's probe (`resolve::admission`),
    /// read by every call whose timer fires.
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
    /// As delivered: each is checked with [`StatusItem::parse`].
    pub items: Vec<StatusItem>,
    pub next_cursor: Option<String>,
}

impl Upstreams {
    /// The clients of `[upstreams]`, each with its own breaker (`[breaker]`)
    /// and bound on calls in flight: its `max_in_flight`, or when that is 0,
    /// `server_max_in_flight` (`server.max_in_flight`, the one value of another
    /// section they need), and its bound per seller. The status feed's client
    /// has a breaker of its own and a small fixed bound. The time the gateway
    /// loses is kept here ([`Upstreams::lost_time`]), with
    /// `upstreams.lost_time_tolerance_ms`.
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
            )
        };
        let calltracking = &upstreams.calltracking.upstream;
        Upstreams {
            real_phone: endpoint(Source::RealPhone),
            anonymous: endpoint(Source::Anonymous),
            calltracking: endpoint(Source::Calltracking),
            // No seller: the per-seller bound is never asked, and its breaker
            // opens on its own failures alone (`breaker`'s doc says why).
            status_feed: Endpoint::new(
                UpstreamName::StatusFeed,
                calltracking,
                Breaker::new(UpstreamName::StatusFeed.as_str(), breaker, 1, 1),
                STATUS_FEED_MAX_IN_FLIGHT,
                None,
                STATUS_FEED_MAX_IN_FLIGHT,
            ),
            lost: std::sync::Arc::new(LostTime::new(upstreams.lost_time_tolerance)),
        }
    }

    /// The running total of time the gateway lost, for the probe that feeds it.
    pub fn lost_time(&self) -> std::sync::Arc<LostTime> {
        self.lost.clone()
    }

    /// The seller's real number; `None` when the seller has no phone (404).
    ///
    /// # Errors
    /// Any answer but 200 with a valid phone or 404.
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
    ///
    /// # Errors
    /// Any answer but 200 with a valid phone or 404.
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

    /// A `{"phone": ...}` answer at `url` of `endpoint` about `seller`: the
    /// real and the anonymous number differ only in where they are asked.
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
    ///
    /// # Errors
    /// Any answer but 200 with a valid phone or 404.
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

    /// The most calls allowed in flight now to `source`'s upstream: its
    /// adaptive limit, or its fixed bound.
    pub fn limit(&self, source: Source) -> usize {
        match source {
            Source::RealPhone => &self.real_phone,
            Source::Anonymous => &self.anonymous,
            Source::Calltracking => &self.calltracking,
        }
        .in_flight
        .limit()
    }

    /// One page of the status feed after `cursor` (from the start when `None`),
    /// through the feed's own endpoint.
    ///
    /// # Errors
    /// Any answer but 200 with a page; a 404 is a failure here too.
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

    /// GET `url` about `seller`'s numbers (none: the status feed), bounded by
    /// the endpoint's places, its breaker and its timeout: 200 -> parsed body,
    /// 404 -> `None`, anything else -> error. Counted and timed either way.
    async fn get_json<T: DeserializeOwned>(
        &self,
        endpoint: &Endpoint,
        seller: Option<UserId>,
        url: String,
        call: Call<'_>,
    ) -> Result<Option<T>, UpstreamError> {
        // Wall time: the call's real duration, for its histogram.
        #[allow(clippy::disallowed_types)]
        let start = std::time::Instant::now();
        // The seller's place first: a seller over its bound then never holds,
        // even for a moment, a place of the upstream's that others need. Then
        // the breaker: an open one answers without a call, so it takes no
        // place either (a hanging upstream's probes may hold them all), and a
        // half-open one's would-be probe that finds no place is not called
        // because the breaker is not closed.
        let seller_slot = seller.map(|user| endpoint.per_seller.slot(user));
        let caller = Caller {
            seller: seller.map_or(0, UserId::get),
            request: call.request,
        };
        let mut slot = None;
        let allowed = if matches!(seller_slot, Some(None)) {
            Allow::No
        } else {
            endpoint.breaker.allow(caller.seller)
        };
        let result = if matches!(seller_slot, Some(None)) {
            Err(UpstreamError::SellerSaturated)
        } else if allowed == Allow::No {
            Err(UpstreamError::CircuitOpen)
        } else {
            // However the call ends, the breaker hears of it: a call that
            // panics or is dropped (its task cancelled) is recorded as such on
            // the way out, so a half-open breaker's probe never stays taken.
            let told = Told {
                breaker: &endpoint.breaker,
                caller,
                told: false,
            };
            slot = endpoint.in_flight.slot();
            if slot.is_none() {
                told.record(&Err::<(), _>(UpstreamError::Saturated));
                Err(match allowed {
                    Allow::Probe => UpstreamError::CircuitOpen,
                    Allow::Closed | Allow::No => UpstreamError::Saturated,
                })
            } else {
                #[cfg(feature = "test-faults")]
                faults::panic_for(seller);
                // Runs under the call's own span: exported, it is the parent of
                // what the upstream does, and `traceparent` names it (docs/tracing.md).
                let span = upstream_span(endpoint.name.as_str());
                let phase = Phase::default();
                // One clock reading for the send rate and the call's timer.
                let now = tokio::time::Instant::now();
                let hot = endpoint.send_rate.sent(now);
                let sent = endpoint.get(url, call.request_id, call.trace, span.clone(), &phase);
                let result = self
                    .timed(endpoint, sent.instrument(span), &phase, now)
                    .await;
                let result = match result {
                    Err(error) if error.health_failure() => {
                        endpoint.send_rate.trouble(tokio::time::Instant::now());
                        // Load of the gateway's own making, not the upstream's word.
                        Err(if hot { UpstreamError::Load } else { error })
                    }
                    other => other,
                };
                told.record(&result);
                result
            }
        };
        endpoint.metrics.outcome(&result).increment(1);
        endpoint
            .metrics
            .duration
            .record(start.elapsed().as_secs_f64());
        if let Some(slot) = slot {
            // What the adaptive bound learns from how the call ended (`limit`).
            // Exhaustive, like the errors' class: a new way to end is decided
            // here too.
            slot.finish(match &result {
                Ok(_) | Err(UpstreamError::Status(_) | UpstreamError::Decode(_)) => End::Answered,
                Err(UpstreamError::LoadRefused(_) | UpstreamError::Load) => End::LoadRefused,
                Err(
                    UpstreamError::Timeout
                    | UpstreamError::Connect(_)
                    | UpstreamError::CircuitOpen
                    | UpstreamError::LocalTimeout
                    | UpstreamError::LostTime
                    | UpstreamError::Local(_)
                    | UpstreamError::Saturated
                    | UpstreamError::SellerSaturated
                    | UpstreamError::Panicked
                    | UpstreamError::Cancelled
                    | UpstreamError::Request,
                ) => End::Unknown,
            });
        }
        drop(seller_slot);
        if let Err(error) = &result {
            let upstream = endpoint.name.as_str();
            tracing::debug!(upstream, %error, "upstream call failed");
        }
        result
    }

    /// `call` bounded by the endpoint's timeout, counting only the time the
    /// upstream had (`lost`): when the timer fires, the time the gateway lost
    /// meanwhile (the probe's running total or the timer's own lateness,
    /// whichever is more, and the wait before the upstream was asked) is given
    /// back once if it is beyond the tolerance. At the end of that extension a
    /// call that lost more than half of it again (or more than the tolerance,
    /// if that is more: the gateway paused again) is undecided; one that lost
    /// less had its timeout of the gateway's attention, within what a busy
    /// machine's scheduling takes, and its timeout is the upstream's. `sent`
    /// is when the call began.
    async fn timed<T>(
        &self,
        endpoint: &Endpoint,
        call: impl Future<Output = Result<Option<T>, UpstreamError>>,
        phase: &Phase,
        sent: tokio::time::Instant,
    ) -> Result<Option<T>, UpstreamError> {
        let lost = &*self.lost;
        let mut mark = lost.mark();
        let mut due = sent + endpoint.timeout;
        // The time given back, once given.
        let mut extension: Option<Duration> = None;
        let timer = tokio::time::sleep_until(due);
        tokio::pin!(call, timer);
        loop {
            tokio::select! {
                // The answer first: after a pause it may be ready together
                // with the timer.
                biased;
                result = &mut call => return result,
                () = &mut timer => {
                    if !phase.asked() {
                        return Err(UpstreamError::LocalTimeout);
                    }
                    let now = tokio::time::Instant::now();
                    let lost_now = lost.since(mark).max(lost::lateness(due, now));
                    if let Some(given) = extension {
                        return Err(if lost.beyond_tolerance(lost_now) && lost_now > given / 2 {
                            UpstreamError::LostTime
                        } else {
                            UpstreamError::Timeout
                        });
                    }
                    let lost_now = lost_now + phase.waited();
                    if !lost.beyond_tolerance(lost_now) {
                        return Err(UpstreamError::Timeout);
                    }
                    extension = Some(lost_now);
                    mark = lost.mark();
                    due = now + lost_now;
                    timer.as_mut().reset(due);
                }
            }
        }
    }
}

/// A call the breaker let through, until the breaker is told how it ended.
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

/// What a call carries from the request it serves: the request's sequence
/// number (the breaker tells requests apart by it; 0: none), its
/// `x-request-id` and its trace context (forwarded upstream).
#[derive(Debug, Clone, Copy, Default)]
pub struct Call<'a> {
    /// The gateway's own sequence number of the request (a batch is one
    /// request), never a header a caller sets.
    pub request: u64,
    pub request_id: Option<&'a HeaderValue>,
    pub trace: Option<&'a TraceContext>,
}

/// The GET of `url` with our agent, the request's id and the trace headers
/// naming `span` as the parent.
fn get_request(
    url: String,
    request_id: Option<&HeaderValue>,
    trace: Option<&TraceContext>,
    span: &tracing::Span,
) -> Result<hyper::Request<Empty<hyper::body::Bytes>>, UpstreamError> {
    // The base URL was checked at start and the rest is ids and digits, so
    // this cannot fail; if it did, the call fails without a panic.
    let uri = hyper::Uri::try_from(url).map_err(|_| UpstreamError::Request)?;
    let mut request = hyper::Request::get(uri)
        .header(USER_AGENT, AGENT)
        .body(Empty::new())
        .map_err(|_| UpstreamError::Request)?;
    let headers = request.headers_mut();
    if let Some(id) = request_id {
        headers.insert(REQUEST_ID, id.clone());
    }
    let (traceparent, tracestate) = call_headers(span, trace);
    headers.insert(TRACEPARENT, traceparent);
    if let Some(state) = tracestate {
        headers.insert(TRACESTATE, state);
    }
    Ok(request)
}

/// A status the contract does not allow: the upstream refusing load (429, or
/// 503 with `Retry-After`, RFC 9110 section 15.6.4) says nothing of the seller,
/// any other is the upstream's verdict.
fn status_error<B>(response: &hyper::Response<B>) -> UpstreamError {
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key(hyper::header::RETRY_AFTER);
    match status {
        429 => UpstreamError::LoadRefused(status),
        503 if retry_after => UpstreamError::LoadRefused(status),
        _ => UpstreamError::Status(status),
    }
}

/// What kind of body failed to decode. serde's message quotes the body (a
/// bare-number `phone` would be logged whole), so only its category is kept.
fn decode_kind(error: &serde_json::Error) -> &'static str {
    match error.classify() {
        serde_json::error::Category::Data => "body does not match the contract",
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            "invalid JSON body"
        }
        serde_json::error::Category::Io => "body could not be read",
    }
}

fn parse_phone(text: &str) -> Result<Phone, UpstreamError> {
    Phone::parse(text).map_err(|_| UpstreamError::Decode("phone does not normalise"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::config::Config;

    /// A keep-alive upstream for the real number, counting the requests it
    /// read. What it answers depends on the seller (`/v1/users/<id>/`):
    /// 500, 422, 429 and 503 answer that status (503 with `Retry-After`,
    /// 5030 without), 7 a phone that does not normalise, 9 never answers;
    /// any other, 200 with a phone.
    async fn upstream() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    while let Some(head) = pool::read_head(&mut socket, &mut buffer).await {
                        count.fetch_add(1, Ordering::SeqCst);
                        let user = head
                            .split("/v1/users/")
                            .nth(1)
                            .and_then(|rest| rest.split('/').next())
                            .unwrap_or("");
                        let (status, extra, body) = match user {
                            "500" => ("500 Internal Server Error", "", "{}"),
                            "422" => ("422 Unprocessable Content", "", "{}"),
                            "429" => ("429 Too Many Requests", "", "{}"),
                            "503" => ("503 Service Unavailable", "retry-after: 1\r\n", "{}"),
                            "5030" => ("503 Service Unavailable", "", "{}"),
                            "7" => ("200 OK", "", r#"{"phone": "not a phone"}"#),
                            "9" => {
                                // Holds the connection and never answers.
                                let _ = socket.read(&mut [0u8; 1]).await;
                                return;
                            }
                            _ => ("200 OK", "", r#"{"phone": "+79161234567"}"#),
                        };
                        let reply = format!(
                            "HTTP/1.1 {status}\r\n{extra}content-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (address, requests)
    }

    /// The clients, the real number's upstream at `address`, with `overlay`
    /// added to the config.
    fn upstreams(address: &str, overlay: &str) -> Upstreams {
        let config = Config::from_toml(&format!(
            "[upstreams.real_phone]\nbase_url = \"http://{address}\"\n{overlay}"
        ))
        .unwrap();
        Upstreams::new(&config.upstreams, config.breaker, 1024)
    }

    /// The real number of seller `user`, in request `request`.
    async fn real_phone(
        upstreams: &Upstreams,
        user: u64,
        request: u64,
    ) -> Result<Option<Phone>, UpstreamError> {
        let call = Call {
            request,
            ..Call::default()
        };
        let (user, ad) = (UserId::new(user).unwrap(), AdId::new(1).unwrap());
        upstreams.real_phone(user, ad, call).await
    }

    fn answer(status: u16, retry_after: bool) -> hyper::Response<()> {
        let mut response = hyper::Response::builder().status(status);
        if retry_after {
            response = response.header(hyper::header::RETRY_AFTER, "1");
        }
        response.body(()).unwrap()
    }

    /// A status the contract does not allow: 429, and 503 with `Retry-After`,
    /// refuse load; any other (503 without it, 500 with it) is a status.
    #[test]
    fn load_refusals_are_429_and_503_with_retry_after() {
        let table = [
            (429, false, UpstreamError::LoadRefused(429)),
            (429, true, UpstreamError::LoadRefused(429)),
            (503, true, UpstreamError::LoadRefused(503)),
            (503, false, UpstreamError::Status(503)),
            (500, true, UpstreamError::Status(500)),
            (502, false, UpstreamError::Status(502)),
            (422, false, UpstreamError::Status(422)),
            (302, false, UpstreamError::Status(302)),
        ];
        for (status, retry_after, error) in table {
            assert_eq!(
                status_error(&answer(status, retry_after)),
                error,
                "{status}, Retry-After {retry_after}"
            );
        }
    }

    /// Each answer as the call classifies it, over the wire.
    #[tokio::test]
    async fn a_call_classifies_what_the_upstream_answered() {
        let (address, requests) = upstream().await;
        let upstreams = upstreams(&address, "");
        assert!(real_phone(&upstreams, 1, 1).await.unwrap().is_some());
        let table = [
            (500, UpstreamError::Status(500)),
            (422, UpstreamError::Status(422)),
            (429, UpstreamError::LoadRefused(429)),
            (503, UpstreamError::LoadRefused(503)),
            (5030, UpstreamError::Status(503)),
            (7, UpstreamError::Decode("phone does not normalise")),
        ];
        for (user, error) in table {
            assert_eq!(real_phone(&upstreams, user, 1).await, Err(error), "{user}");
        }
        assert_eq!(requests.load(Ordering::SeqCst), 7);
    }

    /// The timeout runs from the call's start: an answer within it is taken,
    /// and an upstream that holds the call past it timed out, the upstream's
    /// verdict. The tolerance for lost time is set wider than the timeout,
    /// so that nothing is ever given back here (and a busy machine's late
    /// timers change nothing).
    #[tokio::test]
    async fn the_timeout_runs_from_the_calls_start() {
        let (address, _) = upstream().await;
        let upstreams = upstreams(
            &address,
            "timeout_ms = 1000\n[upstreams]\nlost_time_tolerance_ms = 2000",
        );
        assert!(real_phone(&upstreams, 1, 1).await.unwrap().is_some());
        assert_eq!(
            real_phone(&upstreams, 9, 2).await,
            Err(UpstreamError::Timeout)
        );
    }

    /// The upstream's health failures reach its breaker, with their sellers
    /// and requests: failures for two sellers in two requests open one that
    /// needs two of each, and the next call is not made.
    #[tokio::test]
    async fn health_failures_reach_the_breaker() {
        let (address, requests) = upstream().await;
        let upstreams = upstreams(
            &address,
            "[breaker]\nconsecutive_failures = 2\nmin_sellers = 2\nmin_requests = 2",
        );
        assert_eq!(
            real_phone(&upstreams, 500, 1).await,
            Err(UpstreamError::Status(500))
        );
        assert_eq!(
            real_phone(&upstreams, 5030, 2).await,
            Err(UpstreamError::Status(503))
        );
        assert_eq!(
            real_phone(&upstreams, 1, 3).await,
            Err(UpstreamError::CircuitOpen)
        );
        assert_eq!(requests.load(Ordering::SeqCst), 2, "called while open");
    }

    /// A half-open breaker's probe whose call is dropped (its task
    /// cancelled) frees its place at once: the next call goes out as a probe
    /// and closes the breaker, long before a lost probe is replaced.
    #[tokio::test]
    async fn a_dropped_probe_frees_its_place() {
        let (address, requests) = upstream().await;
        let open = Duration::from_millis(1500);
        let upstreams = upstreams(
            &address,
            &format!(
                "[breaker]\nconsecutive_failures = 1\nmin_sellers = 1\nmin_requests = 1\nopen_ms = {}",
                open.as_millis()
            ),
        );
        assert_eq!(
            real_phone(&upstreams, 500, 1).await,
            Err(UpstreamError::Status(500))
        );
        assert_eq!(
            real_phone(&upstreams, 1, 2).await,
            Err(UpstreamError::CircuitOpen)
        );
        tokio::time::sleep(open).await;
        // The probe: sent, then dropped while the upstream holds it.
        let mut probe = Box::pin(real_phone(&upstreams, 9, 3));
        let sent = async {
            while requests.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            _ = &mut probe => panic!("the held probe was answered"),
            () = sent => {}
        }
        drop(probe);
        assert!(
            real_phone(&upstreams, 1, 4).await.unwrap().is_some(),
            "the dropped probe kept its place"
        );
        assert!(
            real_phone(&upstreams, 2, 5).await.unwrap().is_some(),
            "closed"
        );
    }

    /// A health failure of a call sent hot (well above the usual send rate,
    /// `load`) is load of the gateway's own making, undecided; any other
    /// error sent hot stays what it was.
    #[tokio::test]
    async fn a_health_failure_sent_hot_is_load() {
        let (address, _) = upstream().await;
        let upstreams = upstreams(&address, "");
        // The send rate's history: one call, then two seconds and more of
        // quiet; a baseline of one call per bucket.
        assert!(real_phone(&upstreams, 1, 1).await.unwrap().is_some());
        tokio::time::sleep(load::BUCKET * (load::WARM_UP + 1)).await;
        // A burst, sent at once: from its 11th call on (above twice the
        // baseline plus the slack) each is hot.
        let hot_from = (2.0 * 1.0 + load::SLACK) as u64 + 1;
        let mut calls: Vec<_> = (0..hot_from)
            .map(|i| real_phone(&upstreams, 100 + i, 2))
            .collect();
        calls.push(real_phone(&upstreams, 500, 2));
        calls.push(real_phone(&upstreams, 422, 2));
        let mut ends = futures_util::future::join_all(calls).await;
        assert_eq!(ends.pop(), Some(Err(UpstreamError::Status(422))));
        assert_eq!(ends.pop(), Some(Err(UpstreamError::Load)));
        assert!(
            ends.iter().all(|end| matches!(end, Ok(Some(_)))),
            "{ends:?}"
        );
    }
}
