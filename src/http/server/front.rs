//! What a listener runs for every request, around the router: request tracking
//! (an id, a span, a duration by route and status; an `x-request-id` given
//! twice is a 400, as every header read singly is); on the admin listener the
//! token ([`Inner::authorize`]), checked first for every path but health,
//! readiness and metrics so that without it nothing, not even a 404 or 405,
//! tells what exists, then the route's scope, so a token without it gets a 403
//! before any 404 or 405 of that route, every such call put on record by
//! `access::record`; the header limit; and shedding on the public listener
//! (`shed`). The public lookup, the request a sale day is made of, is answered
//! here without the router. The probe listener (`server.probe_addr`) is the
//! admin listener's open rows alone ([`Front::probes`]).
//!
//! A request's path is matched against the route table once, here
//! (`api::routes::RouteId`): its duration label and, on the admin listener,
//! whether it needs the token come from that one match; the router matches it
//! again to dispatch (the hit path keeps its one equality check instead).
//!
//! Every request body is read through the listener's share of the body buffer
//! (`bodies`): the front wraps a request that has a body (the snapshot PUT's
//! excepted: it streams), and answers 503 for a request whose body went past
//! it. A 401 closes its connection (`Connection: close`): a caller without a
//! token gets one answer per connection, so it cannot keep one of the admin
//! listener's places busy with request after request (`conns`).
//!
//! One hand-written service instead of `from_fn` layers on the router: the hit
//! path pays one boxed future, not a boxed future and a cloned boxed service per
//! layer, and no extractor copies the headers or the query (what those layers
//! cost: docs/performance.md, "The hit path").

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tower_service::Service;
use tracing::Instrument;

use super::bodies::{Reservation, client_of};
use super::shed::Shed;
use crate::config::TracingConfig;
use crate::domain::wall_clock::Stopwatch;
use crate::http::api;
use crate::http::api::access::{self, AdminTokens, Caller};
use crate::http::api::durations::Durations;
use crate::http::api::error::ApiError;
use crate::http::api::extract::single_header;
use crate::http::api::paths::{PUBLIC_PHONE as PUBLIC_PHONE_PATH, STATUSES as SNAPSHOT_PATH};
use crate::http::api::public;
use crate::http::api::routes::RouteId;
use crate::http::api::state::{AdminState, PublicState};
use crate::telemetry;

/// A listener's service: cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Front {
    inner: Arc<Inner>,
}

struct Inner {
    /// The listener's router (`api::public_router` or `api::admin_router`):
    /// every request the front lets through and does not answer itself.
    router: Router,
    /// Before the router: the header limit on both listeners, and on the
    /// public one the bound on requests in flight (shedding).
    shed: Shed,
    /// A path's row of the route table, found once per request: its duration
    /// label, and on the admin listener whether it needs the token.
    route_of: fn(&str) -> RouteId,
    /// Set on the public listener: `/v1/public-phone` is answered directly,
    /// every method (the router has no entry for it).
    lookup: Option<PublicState>,
    /// Set on the admin listener: the bearer tokens, one of which every
    /// `/admin/` path needs (with the route's scope).
    tokens: Option<Arc<AdminTokens>>,
    /// `tracing.sample_ratio` when `tracing.otlp_endpoint` is set: a sampled
    /// request's span is exported. Otherwise (and for unsampled requests) the
    /// span is the log's alone and the trace headers wait for an upstream call.
    export_ratio: Option<f64>,
    /// Set on the admin listener: the snapshot's row, whose `PUT` body streams
    /// into its parser and is not counted against the body buffer (`bodies`).
    snapshot: Option<RouteId>,
    /// Set on the probe listener (`server.probe_addr`): only the admin
    /// listener's open rows (`/healthz`, `/readyz`, `/metrics`) are served,
    /// every other path is a 404.
    probes_only: bool,
    /// The app's request-duration histogram, which both fronts record into.
    durations: Arc<Durations>,
}

impl Front {
    /// The public listener: shedding, the lookup answered directly, the rest
    /// by `api::public_router` over `state`. With
    /// `tracing.otlp_endpoint` set the span of each sampled request is
    /// exported, sampled at `tracing.sample_ratio` unless the caller's
    /// `traceparent` decides. Given here, not by a setter: the front is shared
    /// (cloned per connection) as soon as it is built.
    pub fn public(
        state: PublicState,
        shed: Shed,
        tracing: &TracingConfig,
        durations: Arc<Durations>,
    ) -> Self {
        let inner = Inner {
            router: api::public_router(state.clone()),
            shed,
            route_of: RouteId::public,
            lookup: Some(state),
            tokens: None,
            // Read once here: the hit path asks one `Option`.
            export_ratio: tracing.exports().then_some(tracing.sample_ratio),
            snapshot: None,
            probes_only: false,
            durations,
        };
        Front {
            inner: Arc::new(inner),
        }
    }

    /// The admin listener: the tokens of `state` on `/admin/` paths, the
    /// header limit and the body buffer (`shed`, built with `Shed::unlimited`),
    /// never shed; the routes by `api::admin_router` over `state`.
    pub fn admin(state: AdminState, shed: Shed) -> Self {
        let inner = Inner {
            tokens: Some(state.tokens.clone()),
            durations: state.durations.clone(),
            router: api::admin_router(state),
            shed,
            route_of: RouteId::admin,
            lookup: None,
            export_ratio: None,
            snapshot: Some(RouteId::admin(SNAPSHOT_PATH)),
            probes_only: false,
        };
        Front {
            inner: Arc::new(inner),
        }
    }

    /// The probe listener (`server.probe_addr`): the admin listener's open
    /// rows over `state` (health, readiness, metrics), every other path a
    /// 404 whatever its token; the header limit (`shed`), no body read.
    pub fn probes(state: AdminState, shed: Shed) -> Self {
        let inner = Inner {
            tokens: None,
            durations: state.durations.clone(),
            router: api::admin_router(state),
            shed,
            route_of: RouteId::admin,
            lookup: None,
            export_ratio: None,
            snapshot: None,
            probes_only: true,
        };
        Front {
            inner: Arc::new(inner),
        }
    }
}

impl Inner {
    /// The token and its scope (the admin listener), then the answer.
    /// Takes the `Arc` so the future holds nothing twice (it is boxed per request).
    async fn authorize(self: Arc<Self>, mut request: Request, route: RouteId) -> Response {
        // docs/api.md: the token before anything else, whatever the method and whether
        // or not the route exists; then the route's scope, before its 404 or 405.
        if let Some(tokens) = &self.tokens {
            if route.needs_token() {
                let method = request.method().clone();
                // One `Authorization` header: of two, which would the caller mean?
                let given =
                    single_header(request.headers(), header::AUTHORIZATION, "Authorization")
                        .map(|_| tokens.check(request.headers()));
                let (name, response) = match given {
                    Err(repeated) => (access::NO_TOKEN.into(), repeated.into_response()),
                    Ok(None) => (access::NO_TOKEN.into(), unauthorized()),
                    Ok(Some(id)) => {
                        let name = tokens.name(id).clone();
                        match route.scope() {
                            Some(scope) if !tokens.allows(id, scope) => {
                                (name, ApiError::Forbidden(scope).into_response())
                            }
                            _ => {
                                request
                                    .extensions_mut()
                                    .insert(Caller { name: name.clone() });
                                (name, self.answer(request).await)
                            }
                        }
                    }
                };
                access::record(&name, &method, route.label(), response.status().as_u16());
                return response;
            }
        } else if self.probes_only && route.needs_token() {
            return ApiError::RouteNotFound.into_response();
        }
        self.answer(request).await
    }

    /// `request` with its body as the handlers read it: counted against the
    /// listener's share of the body buffer when it has one, and on the public
    /// listener against the share of `client` (the connection's peer, when
    /// known), with the reservation the answer is checked against; as it is
    /// otherwise.
    fn counted<B>(
        &self,
        request: axum::http::Request<B>,
        route: RouteId,
        client: Option<IpAddr>,
    ) -> (Request, Option<Reservation>)
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        // No body (the lookup, every GET): nothing to count, nothing allocated.
        // The snapshot PUT streams its body: it has its own bound.
        let uncounted = request.body().is_end_stream()
            || (request.method() == axum::http::Method::PUT && self.snapshot == Some(route));
        let counted = match self.shed.bodies() {
            // Each client's share on the public listener only: the admin
            // listener reads a body after its token.
            Some((buffer, share)) if !uncounted => {
                let client = client.filter(|_| self.lookup.is_some()).map(client_of);
                Some(Reservation::new(buffer, share, client))
            }
            _ => None,
        };
        match counted {
            None => (request.map(Body::new), None),
            Some(reservation) => {
                let request = request.map(|body| reservation.count(Body::new(body)));
                (request, Some(reservation))
            }
        }
    }

    /// The header limit and shedding, then the answer: the lookup directly,
    /// anything else by the router.
    async fn answer(&self, request: Request) -> Response {
        if let Err(refused) = self.shed.check_head(&request) {
            return refused.into_response();
        }
        let _permit = match self.shed.permit() {
            Ok(permit) => permit,
            Err(refused) => return refused.into_response(),
        };
        if let Some(state) = &self.lookup {
            if request.uri().path() == PUBLIC_PHONE_PATH {
                // Every method here: the router has no entry for the lookup.
                // (Were HEAD served by axum, it would set a Content-Length
                // from the GET body, whose length tells the kind.)
                let (method, headers, query) =
                    (request.method(), request.headers(), request.uri().query());
                return public::public_phone(state, method, headers, query).await;
            }
        }
        // Boxed: the router's future would otherwise make every request's boxed
        // future larger, the lookup's included.
        match Box::pin(self.router.clone().call(request)).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

impl<B> hyper::service::Service<axum::http::Request<B>> for Front
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: axum::http::Request<B>) -> Self::Future {
        self.call_holding(request, (), None)
    }
}

impl Front {
    /// Answers `request` from `peer` (the connection's, when known: its body
    /// counts against that client's share, `bodies`), keeping `held` until the
    /// answer is made (the connection's watchdog counts the request in
    /// service meanwhile).
    ///
    /// Request tracking: an id (the caller's or a new one; its span carries it
    /// onto every log line, it is forwarded upstream and answered back), the
    /// trace context upstream calls continue (docs/tracing.md), and the
    /// duration by route and status.
    pub fn call_holding<B, H>(
        &self,
        request: axum::http::Request<B>,
        held: H,
        peer: Option<IpAddr>,
    ) -> Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
        H: Send + 'static,
    {
        let start = Stopwatch::start();
        let route = (self.inner.route_of)(request.uri().path());
        let id = match telemetry::request_id_of(request.headers()) {
            Ok(id) => id,
            Err(made) => {
                // Given twice: refused, as any header read singly is, before
                // anything else (a token too) is looked at.
                let refused = api::extract::repeated_header(telemetry::REQUEST_ID_HEADER);
                let response = answered(
                    refused.into_response(),
                    made,
                    route,
                    start,
                    &self.inner.durations,
                );
                return Box::pin(async move {
                    drop(held);
                    Ok(response)
                });
            }
        };
        if let Some(ratio) = self.inner.export_ratio {
            if telemetry::trace::sampled(request.headers(), ratio) {
                return self.call_exported(request, held, peer, start, id, route);
            }
        }
        let span = tracing::info_span!(
            "request",
            request_id = id.to_str().unwrap_or_default(),
            route = route.label()
        );
        let (request, reservation) = self.inner.counted(request, route, peer);
        let answer = telemetry::with_request_id(
            id.clone(),
            Inner::authorize(self.inner.clone(), request, route),
        )
        .instrument(span);
        let durations = self.inner.durations.clone();
        Box::pin(async move {
            let mut response = answer.await;
            drop(held);
            if let Some(reservation) = reservation {
                response = reservation.answer(response);
            }
            Ok(answered(response, id, route, start, &durations))
        })
    }

    /// [`Front::call_holding`] for a sampled request: its span is exported,
    /// continues the caller's trace and records the status. A future of its own, so that
    /// without export the hit path's future stays as small as it was.
    #[cold]
    #[inline(never)]
    fn call_exported<B, H>(
        &self,
        request: axum::http::Request<B>,
        held: H,
        peer: Option<IpAddr>,
        start: Stopwatch,
        id: axum::http::HeaderValue,
        route: RouteId,
    ) -> Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
        H: Send + 'static,
    {
        let span = tracing::info_span!(
            "request",
            request_id = id.to_str().unwrap_or_default(),
            route = route.label(),
            otel.kind = "server",
            http.request.method = request.method().as_str(),
            http.response.status_code = tracing::field::Empty,
        );
        telemetry::trace::continue_trace(&span, request.headers());
        let (request, reservation) = self.inner.counted(request, route, peer);
        let answer = telemetry::with_request_id(
            id.clone(),
            Inner::authorize(self.inner.clone(), request, route),
        )
        .instrument(span.clone());
        let durations = self.inner.durations.clone();
        Box::pin(async move {
            let mut response = answer.await;
            drop(held);
            if let Some(reservation) = reservation {
                response = reservation.answer(response);
            }
            span.record("http.response.status_code", response.status().as_u16());
            Ok(answered(response, id, route, start, &durations))
        })
    }
}

/// The 401 of a request without a valid token, closing its connection: such a
/// caller gets one answer per connection, so it cannot hold one of the admin
/// listener's places with request after request, nor pipeline them (`conns`
/// makes room at the cap by closing idle connections, and a connection
/// answering request after request is seldom idle).
fn unauthorized() -> Response {
    let mut response = ApiError::Unauthorized.into_response();
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// The answer as sent: its request id set, its duration recorded by route and
/// status.
fn answered(
    mut response: Response,
    id: axum::http::HeaderValue,
    route: RouteId,
    start: Stopwatch,
    durations: &Durations,
) -> Response {
    response
        .headers_mut()
        .insert(telemetry::REQUEST_ID_HEADER, id);
    durations.record(route.index(), response.status().as_u16(), start.elapsed());
    response
}
