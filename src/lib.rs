//! phones-gateway decides which phone number a buyer sees for a classified ad:
//! a paid anonymous number, a call-tracking number or the seller's real number.
//! What it does for clients and operators is in `docs/` (`docs/README.md` lists
//! the pages); this is the one map of the code.
//!
//! # The map, top down
//!
//! Imports go one way: `http -> resolve -> (cache, upstream, status) ->
//! store -> domain` (`status` also imports `cache`, to invalidate, and
//! `upstream`, for the feed), and `http -> (budget, reveals) -> store`;
//! [`app`] wires the parts; [`config`], [`telemetry`] and [`domain`] import
//! nothing above them.
//! Inside a folder, files may use one another both ways: a folder is one
//! module to the rest of the crate. `tests/imports.rs` fails on a cycle between
//! top-level modules, on a cycle between the files of `http::api` (the route
//! table names its handlers, which take their paths from the leaf
//! `http::api::paths`), on a file outside `store` that names sqlx, on
//! `http::api` importing `http::server`, and on a file of `src/` over 800
//! lines (unit tests included).
//!
//! - [`app`]: builds the parts from the configuration ([`app::Parts`], which
//!   the whole-app tests and the benches build too), runs both listeners and
//!   owns every background task (one cancellation token and task tracker:
//!   stopped on shutdown, and when the app is dropped). It opens one database
//!   and hands each owner its store handle. Each part is built from its own
//!   section of the configuration (`&XConfig`; a background task takes an
//!   owned copy), a value of another section passed as its own argument.
//! - [`http`]: two modules, and the server imports the API, never the reverse.
//!   - [`http::server`]: the hand-built HTTP server: connections through hyper
//!     (a head deadline and a size bound `axum::serve` does not expose; hyper's
//!     own rejections rewritten as problem documents), each listener's front
//!     service (request tracking, the admin token, shedding, and the public
//!     lookup answered without the router: the hit path).
//!   - [`http::api`]: the route table (one row a route: path, access, scope,
//!     handlers (none for the lookup), OpenAPI entries), from which the routers, the OpenAPI
//!     documents, the duration labels and the token check are derived; the
//!     handlers, extractors, problem documents and the request-duration
//!     histogram; `state` (each listener's state) and `limits` (the request
//!     limits).
//! - [`resolve`]: one request's answer. The selection plan (what applies, what
//!   is asked before what, what the deadline means) and the rule table, both
//!   pure; the concurrent fan-out to the sources through the caches; cold
//!   admission, which sheds uncached requests while ready work waits too long
//!   for a worker.
//! - [`cache`]: the number caches, one per upstream: TTLs, coalescing,
//!   stale-if-error, refresh ahead, invalidation by seller in O(1) (which
//!   [`status`] calls); and the three of a replica together.
//! - [`upstream`]: typed calls to the three upstreams (and the status feed) over
//!   a keep-alive pool of our own per upstream; each call meets its gates in
//!   order (the seller's place, the breaker, the adaptive bound, the back-off,
//!   the timer), and one table says what follows from how it ended.
//! - [`status`]: the in-memory call-tracking status set, its write path, the
//!   replica sync loop and the status-feed puller; and cache invalidation by
//!   seller, which travels the same change log (it imports [`cache`]).
//! - [`reveals`]: the reveal log: a lock-free buffer on the request path, the
//!   batch flush with per-ad counts, retention.
//! - [`budget`]: the viewers' budgets, the fleet's: a ledger per viewer that
//!   decides without waiting, the sliding minute and the shares (pure), the
//!   exchange that adds each replica's spends to the fleet's totals and learns
//!   who is refused elsewhere, and retention of expired rows.
//! - [`store`]: everything that speaks SQL, the only module that imports sqlx.
//!   SQLite or PostgreSQL opened once (bounds, migrations, the pooler check),
//!   then one narrow handle per capability, each a folder (its interface, then
//!   the SQL of each dialect it has): the status set and its
//!   change log (invalidations included) for [`status`], the reveal log (with
//!   its SQLite indexes) for [`reveals`], the fleet's budget totals for
//!   [`budget`], change hints and the feed's lease (PostgreSQL only) for the
//!   sync and feed loops.
//!   Beside the handles, the shared pool and error, and the database, which
//!   opens SQLite or PostgreSQL and builds the handles.
//! - [`domain`]: phones, ids, the sources (and one value per source), the status
//!   model and its version rule, reveal records, and what is known without
//!   asking (`Known`): valid values only, parsed once at the edge, no I/O.
//! - [`config`]: the configuration tree, its defaults and layering; a file per
//!   section, which holds the section's keys, defaults and validation.
//! - [`telemetry`]: logs, the metrics recorder, request ids; [`telemetry::trace`]:
//!   W3C trace context in and out (with the mark of an exported span), and the
//!   OTLP span export, which reads the context.
//! - [`runtime`]: how late the runtime runs (the lost-time probe, which
//!   upstream calls' timers and cold admission read), tokio worker threads
//!   sized to the container's CPU quota, and the background threads' priority.
//! - [`sim`]: the upstream simulator for the demo, the tests and load runs.
//!
//! The binary (`src/main.rs`) is the command line: `demo`, `serve`,
//! `simulate`, `migrate`, `check-config`.

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
