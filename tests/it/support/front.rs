//! The public listener's service (`Front`) without sockets, built by the app's
//! own builder (`app::Parts`) over upstreams never asked, for contract cases
//! decided before any upstream call; driven by `tower::ServiceExt::oneshot`.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{Request, Response};
use hyper::service::Service as _;
use phones_gateway::app::Parts;
use phones_gateway::config::Config;
use phones_gateway::http::server::front::Front;
use tower::ServiceExt;

use super::app::Answer;

/// The public front on the default configuration.
pub fn public_front() -> Front {
    let config = Config::from_toml("").expect("the defaults are valid");
    Parts::build(&config).public_front(&config, None)
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
