//! The API both listeners serve (docs/api.md): the route table ([`routes`]),
//! the routers built from it and their handlers, tokens ([`access`]), extractors,
//! problem documents ([`error`]), states, limits and the duration histogram. It
//! does not know how it is served (`crate::http::server` imports it).
//!
//! Every error on either router is an `ApiError` problem document; an unknown
//! method that is a valid token (`BREW`) is a 405 with `Allow`, not a 501.

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

/// The admin routes ([`routes::ADMIN`]); the front checks the token before this router.
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
