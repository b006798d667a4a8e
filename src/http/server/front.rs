//! What a listener runs for every request, around the router: request tracking,
//! on the admin listener the token and its scope ([`Inner::authorize`]), the
//! header limit, the body buffer and shedding; the public lookup is answered
//! here without the router. Order of answers: docs/admin-access.md, "Scopes";
//! why one hand-written service: docs/design.md, "The hit path".

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
    router: Router,
    /// The header limit on both listeners, and on the public one shedding.
    shed: Shed,
    /// A path's row of the route table, found once per request.
    route_of: fn(&str) -> RouteId,
    /// Set on the public listener: `/v1/public-phone` is answered directly.
    lookup: Option<PublicState>,
    /// Set on the admin listener.
    tokens: Option<Arc<AdminTokens>>,
    /// `tracing.sample_ratio` when spans are exported (`tracing.otlp_endpoint`).
    export_ratio: Option<f64>,
    /// Set on the admin listener: the snapshot's row, whose `PUT` body streams
    /// and is not counted against the body buffer.
    snapshot: Option<RouteId>,
    /// Set on the probe listener: only the open rows are served.
    probes_only: bool,
    durations: Arc<Durations>,
}

impl Front {
    /// The public listener. The tracing settings are given here, not by a
    /// setter: the front is shared (cloned per connection) once built.
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

    /// The admin listener: never shed (`shed` built with `Shed::unlimited`).
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

    /// The probe listener: every path but the open rows a 404; no body read.
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
    /// Takes the `Arc` so the future holds nothing twice (it is boxed per request).
    async fn authorize(self: Arc<Self>, mut request: Request, route: RouteId) -> Response {
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

    /// `request` with its body counted against the listener's and `client`'s
    /// shares, and the reservation its answer is checked against.
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
        // No body: nothing to count, nothing allocated. The snapshot PUT
        // streams its body: it has its own bound.
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
                // Every method here. (Were HEAD served by axum, it would set a
                // Content-Length from the GET body, whose length tells the kind.)
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
    /// Answers `request` from `peer` (its body counts against that client's share),
    /// keeping `held` (the watchdog's count of requests in service) until answered.
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
                // Given twice: refused before anything else (a token too).
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

    /// [`Front::call_holding`] for a sampled request, its span exported. A
    /// future of its own, so without export the hit path's future stays small.
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

/// The 401, closing its connection: a caller without a valid token gets one
/// answer per connection, so it cannot hold an admin listener place (`conns`).
fn unauthorized() -> Response {
    let mut response = ApiError::Unauthorized.into_response();
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// The answer as sent: its request id set, its duration recorded.
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
