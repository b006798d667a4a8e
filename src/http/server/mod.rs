//! The hand-built HTTP server the listeners run (public, admin, and the
//! probes' own when `server.probe_addr` is set), for the limits and costs
//! `axum::serve` does not cover (docs/design.md, "The hit path"):
//! - [`serve`]: connections through hyper, head deadline, graceful shutdown;
//! - [`front`]: the service every request meets (tracking, token, limits,
//!   shedding, the public lookup);
//! - [`shed`]: the header limit and load shedding;
//! - [`conns`]: the cap on each listener's open connections;
//! - [`rewrite`]: hyper's own bare 400/414/431 answers as problem documents;
//! - [`bodies`]: the bound on request bodies held in memory.
//!
//! It imports the API, never the reverse. `[server]` (`ServerConfig`) is read
//! where each value is used: `serve`, the states (`http::api::limits`),
//! `app::Parts::public_front`, `App::build`, `App::run` (`start_shutdown`).

pub mod bodies;
pub mod conns;
pub mod front;
pub mod rewrite;
pub mod serve;
pub mod shed;
