//! The HTTP edge, in two modules, the server importing the API and never the
//! reverse (`tests/imports.rs` holds it):
//! - [`server`]: the hand-built HTTP server: connections, the front service
//!   every request meets, and hyper's own rejections as problem documents;
//! - [`api`]: what the service answers: the route table, routers, handlers,
//!   extractors, problem documents, the OpenAPI documents. Its contract is
//!   tested through the public front (`tests/it/api_contract.rs`).

pub mod api;
pub mod server;
