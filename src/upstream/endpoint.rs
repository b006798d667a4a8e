//! One upstream's endpoint: its address, its connections and the gates a
//! call meets, and the GET itself with its answer validated.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{HeaderName, HeaderValue, USER_AGENT};
use serde::de::DeserializeOwned;

use super::backoff::Backoff;
use super::breaker::Breaker;
use super::ending::{Outcome, Row};
use super::error::{UpstreamError, UpstreamName};
use super::limit::{Adapt, Bound, PerSeller};
use super::pool::{Phase, Pool};
use crate::config::UpstreamConfig;
use crate::domain::Phone;
use crate::telemetry::trace::{TRACEPARENT, TRACESTATE, TraceContext, call_headers};

/// Largest upstream body read; a status page of 10,000 items is under a MiB.
const MAX_BODY_BYTES: usize = 4 << 20;
/// Idle connections kept per upstream.
const POOL_MAX_IDLE: usize = 512;

pub(super) struct Endpoint {
    pub(super) name: UpstreamName,
    /// The base URL's path without its trailing `/`; calls go to paths under it.
    pub(super) path: String,
    pub(super) pool: Pool,
    pub(super) timeout: Duration,
    pub(super) breaker: Breaker,
    pub(super) in_flight: Bound,
    pub(super) per_seller: PerSeller,
    pub(super) backoff: Backoff,
    pub(super) metrics: CallMetrics,
}

/// The call counters and duration histogram of one upstream, registered once
/// (a labelled `counter!` per call builds and hashes its key: the cold path's
/// CPU), and the WARN log of its failures, at most one line per [`WARN_EVERY`].
pub(super) struct CallMetrics {
    upstream: &'static str,
    /// In [`Outcome::ALL`]'s order.
    outcomes: [metrics::Counter; Outcome::ALL.len()],
    duration: metrics::Histogram,
    /// Failures not yet logged, and when the last line was written
    /// (milliseconds after `epoch`).
    unlogged: AtomicU64,
    logged_ms: AtomicU64,
    epoch: Instant,
}

const WARN_EVERY: Duration = Duration::from_secs(10);

impl CallMetrics {
    fn new(upstream: &'static str) -> Self {
        CallMetrics {
            upstream,
            outcomes: Outcome::ALL.map(|outcome| {
                metrics::counter!("phones_gateway_upstream_requests_total", "upstream" => upstream, "outcome" => outcome.as_str())
            }),
            duration: metrics::histogram!("phones_gateway_upstream_request_duration_seconds", "upstream" => upstream),
            unlogged: AtomicU64::new(0),
            logged_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Counts and times a call that ended as `row` after `took`.
    pub(super) fn ended(&self, row: Row, error: Option<&UpstreamError>, took: Duration) {
        let at = Outcome::ALL
            .iter()
            .position(|o| *o == row.outcome)
            .unwrap_or(0);
        self.outcomes[at].increment(1);
        self.duration.record(took.as_secs_f64());
        let Some(error) = error else { return };
        let upstream = self.upstream;
        tracing::debug!(upstream, %error, "upstream call failed");
        let failed = self.unlogged.fetch_add(1, Ordering::Relaxed) + 1;
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.logged_ms.load(Ordering::Relaxed);
        let every = u64::try_from(WARN_EVERY.as_millis()).unwrap_or(u64::MAX);
        if (last == 0 || now >= last + every)
            && self
                .logged_ms
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let count = failed.max(self.unlogged.swap(0, Ordering::Relaxed));
            let outcome = row.outcome.as_str();
            tracing::warn!(upstream, outcome, count, %error, "upstream calls failed (count since the last such line; this one's outcome)");
        }
    }
}

impl Endpoint {
    pub(super) fn new(
        name: UpstreamName,
        config: &UpstreamConfig,
        breaker: Breaker,
        max_in_flight: usize,
        adapt: Option<Adapt>,
        max_in_flight_per_seller: usize,
        idle_timeout: Duration,
    ) -> Self {
        // Checked at start (`config::upstreams`); were it not, every call would
        // fail to connect to a name that never resolves (RFC 6761 `.invalid`).
        let base = hyper::Uri::try_from(config.base_url.as_str()).ok();
        let authority = base
            .as_ref()
            .and_then(hyper::Uri::authority)
            .cloned()
            .unwrap_or(hyper::http::uri::Authority::from_static("base-url.invalid"));
        let spread = breaker.spread();
        Endpoint {
            name,
            path: base
                .as_ref()
                .map_or("", |b| b.path().trim_end_matches('/'))
                .to_owned(),
            pool: Pool::new(&authority, idle_timeout, POOL_MAX_IDLE),
            timeout: config.timeout,
            breaker,
            in_flight: Bound::new(
                max_in_flight,
                adapt,
                metrics::gauge!("phones_gateway_upstream_limit", "upstream" => name.as_str()),
            ),
            per_seller: PerSeller::new(max_in_flight_per_seller),
            backoff: Backoff::new(config.timeout, spread),
            metrics: CallMetrics::new(name.as_str()),
        }
    }

    /// The call itself, once its places are taken; `phase` tells when the
    /// upstream is asked.
    pub(super) async fn get<T: DeserializeOwned>(
        &self,
        url: String,
        request_id: Option<&HeaderValue>,
        trace: Option<&TraceContext>,
        span: tracing::Span,
        phase: &Phase,
    ) -> Result<Option<T>, UpstreamError> {
        // The base URL was checked at start and the rest is ids and digits,
        // so this cannot fail; if it did, the call fails without a panic.
        let uri = hyper::Uri::try_from(url).map_err(|_| UpstreamError::Request)?;
        let request = get_request(uri.clone(), request_id, trace, &span)?;
        let mut conn = self.pool.take(phase).await?;
        let again = || get_request(uri, request_id, trace, &span);
        let response = self.pool.send(&mut conn, request, phase, again).await?;
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

/// The GET of `url` with our agent, the request's id and the trace headers.
pub(super) fn get_request(
    uri: hyper::Uri,
    request_id: Option<&HeaderValue>,
    trace: Option<&TraceContext>,
    span: &tracing::Span,
) -> Result<hyper::Request<Empty<hyper::body::Bytes>>, UpstreamError> {
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

/// A status the contract does not allow: a load refusal (429, or 503 with
/// `Retry-After`, RFC 9110 section 15.6.4), or the upstream's verdict.
pub(super) fn status_error<B>(response: &hyper::Response<B>) -> UpstreamError {
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
pub(super) fn decode_kind(error: &serde_json::Error) -> &'static str {
    match error.classify() {
        serde_json::error::Category::Data => "body does not match the contract",
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            "invalid JSON body"
        }
        serde_json::error::Category::Io => "body could not be read",
    }
}

pub(super) fn parse_phone(text: &str) -> Result<Phone, UpstreamError> {
    Phone::parse(text).map_err(|_| UpstreamError::Decode("phone does not normalise"))
}
