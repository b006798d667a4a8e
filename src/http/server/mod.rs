//! The hand-built HTTP server the listeners run (public, admin, and the
//! probes' own when `server.probe_addr` is set), for the limits and costs
//! `axum::serve` does not cover (docs/design.md, "The hit path"):
//! - [`serve`]: connections through hyper directly, with a head deadline and a
//!   head size bound `axum::serve` does not expose, and graceful shutdown;
//! - [`front`]: the service every request meets: request tracking (id, span,
//!   duration by route), the admin token and its scope, the header limit,
//!   shedding, and the public lookup answered without the router;
//! - [`shed`]: the header limit and load shedding;
//! - [`conns`]: the cap on each listener's open connections, which keeps a
//!   reserve of file descriptors for the process's own calls, and accepting
//!   under it;
//! - [`rewrite`]: hyper's own bare 400/414/431 answers as problem documents;
//! - [`bodies`]: the bound on request bodies held in memory, both listeners
//!   together (`server.max_body_buffer_bytes`), and each public client's
//!   share of it (`server.max_body_buffer_per_client_bytes`).
//!
//! It imports the API (the routers and their states, the route table,
//! `ApiError`, the admin tokens and their record, the duration histogram, the
//! lookup), never the reverse.
//!
//! `[server]` (`ServerConfig`) is read where each value is used: `serve` its
//! head deadline and bounds, the routers' states their request limits
//! (`http::api::limits`), `app::Parts::public_front` the shedding,
//! `App::build` the connection cap and the body buffer, and `App::run`
//! (`start_shutdown`) the shutdown timings.

pub mod bodies;
pub mod conns;
pub mod front;
pub mod rewrite;
pub mod serve;
pub mod shed;
