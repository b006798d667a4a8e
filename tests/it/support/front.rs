//! The public listener's service (`Front`) without sockets, built as
//! benches/hot_path.rs builds it: the router and the front over a resolver whose
//! upstreams are never asked, for contract cases decided before any upstream
//! call (a route, a method, a content type, a parameter). Driven with
//! `tower::ServiceExt::oneshot`; `Front` is a hyper service, so it is wrapped in
//! `tower::service_fn`. The one place to follow when the parts' constructors
//! change.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, Response};
use hyper::service::Service as _;
use phones_gateway::cache::caches::Caches;
use phones_gateway::config::Config;
use phones_gateway::http::api::public_router;
use phones_gateway::http::api::state::PublicState;
use phones_gateway::http::server::front::Front;
use phones_gateway::http::server::shed::Shed;
use phones_gateway::resolve::Resolver;
use phones_gateway::status::StatusSet;
use phones_gateway::upstream::Upstreams;
use tower::ServiceExt;

use super::app::Answer;

/// The public front on the default configuration, no viewer budgets, no reveal log.
pub fn public_front() -> Front {
    let config = Config::from_toml("").expect("the defaults are valid");
    let upstreams = Arc::new(Upstreams::new(
        &config.upstreams,
        config.breaker,
        config.server.max_in_flight,
    ));
    let caches = Caches::new(&config.cache);
    let status = Arc::new(StatusSet::default());
    let resolver = Arc::new(Resolver::new(&config, upstreams, caches, status));
    let state = PublicState {
        resolver,
        budgets: None,
        reveals: None,
        server: config.server,
    };
    Front::public(
        public_router(state.clone()),
        state,
        Shed::new(config.server.max_in_flight, config.server.max_header_bytes),
        // No export: `tracing.otlp_endpoint` is empty by default.
        &config.tracing,
    )
}

/// Sends one request through `front` (no socket) and reads its answer whole.
pub async fn oneshot(front: &Front, request: Request<Body>) -> Answer {
    let front = front.clone();
    let service = tower::service_fn(move |request: Request<Body>| front.call(request));
    let response: Response<Body> = service
        .oneshot(request)
        .await
        .unwrap_or_else(|never: Infallible| match never {});
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    Answer::new(
        status,
        &headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}
