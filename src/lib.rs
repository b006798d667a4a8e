//! phones-gateway decides which phone number a buyer sees for a classified ad:
//! a paid anonymous number, a call-tracking number or the seller's real number.
//! The map of the code (what it does: `docs/README.md`; which way imports go:
//! docs/development.md, "Layout"):
//!
//! - [`app`]: builds the parts ([`app::Parts`]), runs both listeners, owns the tasks.
//! - [`http`]: the server imports the API, never the reverse.
//!   - [`http::server`]: the hand-built hyper server and each listener's front.
//!   - [`http::api`]: the route table, handlers, extractors, problem documents.
//! - [`resolve`]: one request's answer: plan, rule table, fan-out, cold admission.
//! - [`cache`]: the number caches, one per upstream; invalidation by seller.
//! - [`upstream`]: typed calls to the three upstreams and the status feed.
//! - [`status`]: the call-tracking status set, its sync and feed loops.
//! - [`reveals`]: the reveal log: the request path's buffer, flush, retention.
//! - [`budget`]: the viewers' budgets and their exchange with the fleet.
//! - [`store`]: everything that speaks SQL (the only importer of sqlx).
//! - [`domain`]: phones, ids, sources, status, reveals, `Known`; no I/O.
//! - [`config`]: the configuration tree, a file per section.
//! - [`telemetry`]: logs, metrics, request ids, and [`telemetry::trace`].
//! - [`runtime`]: lost time, worker threads, background threads' priority.
//! - [`sim`]: the upstream simulator for the demo, the tests and load runs.
//!
//! The binary (`src/main.rs`) is the command line.

#![forbid(unsafe_code)]

pub mod app;
pub mod budget;
pub mod cache;
pub mod config;
pub mod domain;
pub mod http;
pub mod resolve;
pub mod reveals;
pub mod runtime;
pub mod sim;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod upstream;
