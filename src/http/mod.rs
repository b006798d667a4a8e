//! The HTTP edge, in two modules, the server importing the API and never the
//! reverse (`tests/arrows.rs` holds it):
//! - [`server`]: the hand-built HTTP server: serving connections through hyper
//!   with our own connection limits, the front service every request meets
//!   (request tracking, admission, the hit path without the router), shedding,
//!   and hyper's own rejections rewritten as problem documents. It knows the API
//!   only through the route table, the problem type and the lookup it answers
//!   directly.
//! - [`api`]: what the service answers: the route table, the public and admin
//!   routers built from it, handlers, extractors, problem documents, the OpenAPI
//!   documents and the request-duration histogram labelled by route.
//!
//! The server imports the API, not the other way, because the server's one reason
//! to exist is to run the API fast; the API does not know how it is served, so
//! its handlers are tested with `oneshot` on the routers alone.

pub mod api;
pub mod server;
