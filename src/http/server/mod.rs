//! The hand-built HTTP server both listeners run (about a thousand lines that
//! `axum::serve` would be, were it not for the limits and costs below):
//! - [`serve`]: connections through hyper directly, with a head deadline and a
//!   head size bound `axum::serve` does not expose, and graceful shutdown;
//! - [`front`]: the service every request meets: request tracking (id, span,
//!   duration by route), admission (the admin token, the header limit,
//!   shedding), and the public lookup answered without the router;
//! - [`shed`]: the header limit and load shedding;
//! - [`conns`]: the cap on each listener's open connections, which keeps a
//!   reserve of file descriptors for the process's own calls, and accepting
//!   under it;
//! - [`rewrite`]: hyper's own bare 400/414/431 answers as problem documents.
//!
//! It imports the API (the route table, `ApiError`, the lookup), never the
//! reverse.
//!
//! [`ServeSettings`] reads `[server]` once (`App::build`): the routers' request
//! limits, each connection's limits, the public listener's shedding and the
//! shutdown timings, each part handed its own value from there.

pub mod conns;
pub mod front;
pub mod rewrite;
pub mod serve;
pub mod shed;

use std::time::Duration;

use crate::config::ServerConfig;
use crate::http::api::RequestLimits;
use serve::ConnLimits;
use shed::Shed;

/// What `[server]` says about serving, read from the section in one place.
/// (The listen addresses are bound by `App::build` itself; the queue delay is
/// cold admission's, in `resolve`.)
#[derive(Debug, Clone, Copy)]
pub struct ServeSettings {
    /// The routers' request limits (body, snapshot, header size, body read).
    pub limits: RequestLimits,
    /// Each connection's head deadline and hard head bound ([`serve::serve`]).
    pub conn: ConnLimits,
    /// `server.max_in_flight`: public requests in flight at once.
    pub max_in_flight: usize,
    /// `server.max_connections` as it applies ([`conns::max_connections`]):
    /// the public listener's open connections at most.
    pub max_connections: usize,
    /// `server.shutdown_pause_ms`: `/readyz` answers 503 this long before the
    /// listeners close.
    pub shutdown_pause: Duration,
    /// `server.drain_timeout_ms`: in-flight requests get this long to finish.
    pub drain_timeout: Duration,
}

impl ServeSettings {
    /// `server` with `max_connections`, `server.max_connections` as it applies
    /// (derived from the open-files limit when 0: [`conns::max_connections`]).
    pub fn of(server: &ServerConfig, max_connections: usize) -> Self {
        ServeSettings {
            limits: RequestLimits::from(server),
            conn: ConnLimits::from(server),
            max_in_flight: server.max_in_flight,
            max_connections,
            shutdown_pause: server.shutdown_pause,
            drain_timeout: server.drain_timeout,
        }
    }

    /// The public listener's admission: the header limit and shedding past
    /// `max_in_flight` (the admin listener has the header limit only).
    pub fn public_shed(&self) -> Shed {
        Shed::new(self.max_in_flight, self.limits.max_header_bytes)
    }
}
