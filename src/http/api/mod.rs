//! The API both listeners serve: the route table ([`routes`]), the two routers
//! built from it, public (docs/api.md) and admin (docs/api.md), their handlers,
//! extractors, problem documents ([`error`]), the OpenAPI documents and the
//! request-duration histogram labelled by route ([`durations`]). It does not know
//! how it is served (`crate::http::server` imports it, not the reverse).
//!
//! Every error on either router is an `ApiError` problem document, unknown routes
//! and methods included; so are the answers hyper makes before any route is
//! chosen (`server::rewrite`).
//!
//! An unknown method that is a valid token (`FOO`, `BREW`) reaches the router like
//! any other: on an existing route it is a 405 with `Allow`, the answer to a
//! method the route lacks (RFC 9110 permits a 501 for a method the server does
//! not recognise, but 405 with `Allow` tells the client what to send instead, and
//! docs/api.md lists no 5xx for bad input); on no route, a 404. A method that is not a
//! token is a malformed request line: a 400. Each
//! listener serves its router through a `server::front::Front`
//! (`server::serve::serve`), which tracks and checks every request and answers
//! the public lookup itself.
//!
//! The route table ([`routes`]) names each route's handlers ([`public`],
//! [`admin`], [`reveals`], [`profile`], [`openapi`]); the handlers name their
//! path's constant there, and the OpenAPI documents and the duration
//! histogram ([`durations`]) are read from its rows. Beside them: the admin
//! tokens and their record ([`access`]), the extractors ([`extract`]) and the
//! batch body's items ([`batch_items`]), the
//! problem documents ([`error`]), the listeners' states ([`state`]) and the
//! request limits ([`limits`]).

pub mod access;
pub mod admin;
pub mod batch_items;
pub mod budget;
pub mod durations;
pub mod error;
pub mod extract;
pub mod limits;
pub mod openapi;
pub mod paths;
pub mod profile;
pub mod public;
pub mod reveals;
pub mod routes;
pub mod snapshot;
pub mod state;

use axum::Router;
use axum::extract::DefaultBodyLimit;

use state::{AdminState, PublicState};

/// The public routes ([`routes::PUBLIC`]) but the lookup, which
/// `server::front::Front` answers before this router (with request tracking
/// and shedding around both).
pub fn public_router(state: PublicState) -> Router {
    let max_body = state.server.max_body_bytes;
    router_of(routes::PUBLIC, state, max_body)
}

/// The admin routes ([`routes::ADMIN`]). `server::front::Front` tracks requests, applies the header limit
/// and checks the token for every path under `/admin/` before this router runs
/// (its fallbacks included: without the token, no 404 or 405 tells what exists).
pub fn admin_router(state: AdminState) -> Router {
    // Bounds what the JSON extractor reads; the snapshot streams its body and
    // bounds it itself (`server.max_snapshot_bytes`).
    let max_body = state.server.max_body_bytes;
    router_of(routes::ADMIN, state, max_body)
}

/// A router of one table's rows: the body limit, and problem documents for an
/// unknown path (404) or method (405).
fn router_of<S: Clone + Send + Sync + 'static>(
    table: &[routes::Route<S>],
    state: S,
    max_body_bytes: usize,
) -> Router {
    table
        .iter()
        .filter_map(|route| Some((route.path, route.handlers?)))
        .fold(Router::new(), |router, (path, handlers)| {
            router.route(path, handlers())
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .fallback(error::route_not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .with_state(state)
}
