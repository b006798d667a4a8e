//! The HTTP edge, in two modules, the server importing the API and never the
//! reverse (`tests/imports.rs` holds it):
//! - [`server`]: the hand-built HTTP server: serving connections through hyper
//!   with our own connection limits, the front service every request meets
//!   (request tracking, the admin token, the header limit, shedding, the
//!   lookup answered without the router), and hyper's own rejections rewritten
//!   as problem documents. From the API it takes the routers and their
//!   states, the route table, the problem type, the admin tokens and their
//!   record, the request-duration histogram and the lookup it answers.
//! - [`api`]: what the service answers: the route table, the public and admin
//!   routers built from it, handlers, extractors, problem documents, the OpenAPI
//!   documents and the request-duration histogram labelled by route. Its
//!   contract is tested through the public front (`tests/it/api_contract.rs`,
//!   with `oneshot` where no socket is needed) and over real sockets.

pub mod api;
pub mod server;
