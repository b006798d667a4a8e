//! The two routers: public (SPEC 2) and admin (SPEC 3). Every error on either is
//! an `ApiError` problem document, unknown routes and methods included; so are
//! the answers hyper makes before any route is chosen ([`rewrite`]).
//!
//! An unknown method that is a valid token (`FOO`, `BREW`) reaches the router like
//! any other: on an existing route it is a 405 with `Allow`, the answer to a
//! method the route lacks (RFC 9110 permits a 501 for a method the server does
//! not recognise, but 405 with `Allow` tells the client what to send instead, and
//! SPEC 2 lists no 5xx for bad input); on no route, a 404. A method that is not a
//! token is a malformed request line: a 400. Each
//! listener serves its router through a [`front::Front`] ([`serve::serve`]),
//! which tracks and admits every request and answers the public lookup itself.

pub mod admin;
pub mod durations;
pub mod error;
pub mod extract;
pub mod front;
pub mod openapi;
pub mod profile;
pub mod public;
pub mod ratelimit;
pub mod reveals;
pub mod rewrite;
pub mod serve;
pub mod shed;
pub mod snapshot;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::{self, Next};
use axum::routing::{MethodRouter, get, post, put};

use admin::AdminState;
use extract::BodyLimit;
use public::PublicState;

/// Applies a body limit and records it so the extractors can apply it and a 413
/// can name it. Applied to one route's handler it overrides the router's, since
/// the innermost setting is the one the extractor sees.
fn body_limit<S: Clone + Send + Sync + 'static>(
    route: MethodRouter<S>,
    limit: BodyLimit,
) -> MethodRouter<S> {
    route
        .layer(DefaultBodyLimit::max(limit.max_bytes))
        .layer(middleware::from_fn(
            move |mut request: Request, next: Next| async move {
                request.extensions_mut().insert(limit);
                next.run(request).await
            },
        ))
}

/// Limits both routers apply to every request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_snapshot_bytes: usize,
    pub max_header_bytes: usize,
    pub body_read_timeout: std::time::Duration,
}

impl Limits {
    fn body(&self) -> BodyLimit {
        BodyLimit {
            max_bytes: self.max_body_bytes,
            read_timeout: self.body_read_timeout,
        }
    }
    fn snapshot(&self) -> BodyLimit {
        BodyLimit {
            max_bytes: self.max_snapshot_bytes,
            read_timeout: self.body_read_timeout,
        }
    }
}

/// The public routes. Request tracking and shedding wrap it in [`front::Front`],
/// which also answers `GET /v1/public-phone` without it.
pub fn public_router(state: PublicState, limits: Limits) -> Router {
    Router::new()
        .route(public::PUBLIC_PHONE_PATH, get(public::public_phone))
        .route(
            "/v1/public-phones/batch",
            body_limit(post(public::batch), limits.body()),
        )
        .fallback(error::route_not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .with_state(state)
}

/// The admin routes. [`front::Front`] tracks requests, applies the header limit
/// and checks the token for every path under `/admin/` before this router runs
/// (its fallbacks included: without the token, no 404 or 405 tells what exists).
pub fn admin_router(state: AdminState, limits: Limits) -> Router {
    Router::new()
        .route("/healthz", get(admin::healthz))
        .route("/readyz", get(admin::readyz))
        .route("/metrics", get(admin::metrics))
        .route("/openapi/public.json", get(openapi::public_json))
        .route("/openapi/admin.json", get(openapi::admin_json))
        .route(
            "/admin/v1/calltracking/statuses",
            body_limit(put(admin::put_statuses), limits.snapshot())
                .merge(body_limit(post(admin::post_statuses), limits.body())),
        )
        .route(
            "/admin/v1/calltracking/statuses/{user_id}",
            get(admin::get_status),
        )
        .route("/admin/v1/debug/pprof/profile", get(profile::profile))
        .route("/admin/v1/reveals", get(reveals::list))
        .route("/admin/v1/ads/{ad_id}/reveals", get(reveals::ad_counts))
        .route(
            "/admin/v1/cache/invalidate",
            body_limit(post(admin::invalidate), limits.body()),
        )
        .fallback(error::route_not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .with_state(state)
}
