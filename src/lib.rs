//! phones-gateway decides which phone number a buyer sees for a classified ad:
//! a paid anonymous number, a call-tracking number or the seller's real number.
//!
//! The map, top down. Arrows point one way, http -> resolve -> (cache, upstream,
//! status) -> store -> domain, and http -> (budget, reveals) -> store; and
//! `tests/arrows.rs` fails on a cycle:
//! - [`config`]: the configuration tree, defaults, loading and validation.
//! - [`app`]: builds the parts from a `Config`, runs both listeners and owns
//!   every background task (one cancellation token, also when dropped).
//! - [`http`]: two rooms, `server -> api`. [`http::server`]: connection serving
//!   through hyper (hyper's own rejections rewritten as problems), each
//!   listener's front service (request tracking, admission, the hit path
//!   without the router), shedding. [`http::api`]: the route table that drives
//!   the routers, duration labels, token check and OpenAPI check; handlers,
//!   extractors, errors as problem+json, the OpenAPI documents, the
//!   request-duration histogram.
//! - [`resolve`]: the selection plan and rules (pure, in `resolve::plan` and
//!   `resolve::rules`) and the concurrent fan-out to the sources.
//! - [`cache`]: TTL'd, coalescing, stale-if-error caches with O(1) invalidation,
//!   keyed by a `Key` that carries the seller, and `Caches`, a replica's three.
//! - [`upstream`]: typed clients of the three upstreams over one pooled client.
//! - [`budget`]: the viewers' budgets, the fleet's: a ledger per viewer that
//!   decides without waiting, and the exchange that adds each replica's spends
//!   to the fleet's totals in the database and learns who is refused elsewhere.
//! - [`reveals`]: the reveal log: a lock-free buffer on the request path, the
//!   batch flush with per-ad counts, retention.
//! - [`status`]: the in-memory call-tracking status set, its write path, the
//!   replica sync loop and the status-feed puller.
//! - [`store`]: everything that speaks SQL (the only module that imports sqlx):
//!   SQLite or PostgreSQL opened once as a `Database`, and a narrow handle per
//!   capability, each with its own error: `StatusStore` (the status set and its
//!   change log, invalidations included) for the status service, `RevealStore`
//!   for the reveal flush, retention and routes, `Leadership` for the feed loop,
//!   `ChangeHints` for the sync loop. Files by capability, both dialects in each.
//! - [`domain`]: `Phone`, ids, sources (and `Sources<T>`, one value per source),
//!   the status model and reveal records: valid values only, parsed once at the
//!   edge, and the rules that need no I/O.
//! - [`telemetry`]: logs, the metrics recorder, request ids; in `trace`, W3C
//!   trace context (`trace::context`) and the span export (`trace::export`).
//! - [`runtime`]: tokio worker threads sized to the container's CPU quota.
//! - [`sim`]: the upstream simulator for the demo, tests and load runs.

#![forbid(unsafe_code)]

pub mod app;
pub mod budget;
pub mod cache;
pub mod config;
pub mod domain;
pub mod http;
// No module is allowed a lint of Cargo.toml or clippy.toml whole: an `#[allow]`
// sits beside the item that needs it, with its reason.
pub mod resolve;
pub mod reveals;
pub mod runtime;
pub mod sim;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod upstream;
