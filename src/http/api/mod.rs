//! The API both listeners serve (docs/api.md): the route table ([`routes`]),
//! the two routers built from it, their handlers ([`public`], [`admin`],
//! [`reveals`], [`profile`], [`openapi`]), the admin tokens ([`access`]), the
//! extractors ([`extract`], [`batch_items`]), problem documents ([`error`]),
//! the states ([`state`]), the request limits ([`limits`]) and the duration
//! histogram ([`durations`]). It does not know how it is served
//! (`crate::http::server` imports it, not the reverse).
//!
//! Every error on either router is an `ApiError` problem document, unknown
//! routes and methods included. An unknown method that is a valid token
//! (`BREW`) is a 405 with `Allow` on an existing route, not a 501: it tells the
//! client what to send, and docs/api.md lists no 5xx for bad input.

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
/// `server::front::Front` answers before this router.
pub fn public_router(state: PublicState) -> Router {
    let max_body = state.server.max_body_bytes;
    router_of(routes::PUBLIC, state, max_body)
}

/// The admin routes ([`routes::ADMIN`]). The front checks the token before
/// this router runs (its fallbacks included).
pub fn admin_router(state: AdminState) -> Router {
    // Bounds what the JSON extractor reads; the snapshot bounds its own.
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
