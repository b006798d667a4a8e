//! The HTTP edge: [`server`], the hand-built server (connections, the front
//! every request meets), and [`api`], what it answers (routes, handlers, problem
//! documents, OpenAPI). The server imports the API, never the reverse
//! (`tests/imports.rs` holds it).

pub mod api;
pub mod server;
