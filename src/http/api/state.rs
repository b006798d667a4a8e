//! The two listeners' states: what the public handlers reach (the resolver,
//! the viewer budgets, the reveal buffer) and what the admin handlers reach
//! (the status service, the caches' gauges, the reveal log, readiness,
//! metrics): the public one built by `Parts::public_front` (for the app, the
//! whole-app tests and the benches), the admin one by `App::build`. Each field
//! says what it holds and who reads it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::access::AdminTokens;
use super::durations::Durations;
use super::snapshot::Uploads;
use crate::budget::Budgets;
use crate::cache::caches::Caches;
use crate::config::ServerConfig;
use crate::resolve::Resolver;
use crate::reveals::Reveals;
use crate::status::StatusService;
use crate::store::RevealStore;

/// What the public routes reach: the resolver, the viewer budgets, the reveal
/// log and the request limits. Cloned per request by axum, so every field is
/// cheap to clone (`Arc`s and handles).
#[derive(Clone)]
pub struct PublicState {
    /// Decides the number to show (the caches, the upstreams, the rules): the
    /// one thing `GET /v1/public-phone` and the batch ask, and the hit path in
    /// `server::front` asks it too, without the router.
    pub resolver: Arc<Resolver>,
    /// The per-viewer budgets (per minute and per day, the fleet's), checked
    /// before resolving (`budget::check`) so a viewer past one gets a 429
    /// without costing a lookup; `None` when both budgets are 0.
    pub budgets: Option<Arc<Budgets>>,
    /// The reveal log's buffer: each number shown by GET is recorded here
    /// before it is answered (with `on_overflow = "refuse"`, a full buffer is a
    /// 503); `None` when `reveals.enabled` is false.
    pub reveals: Option<Reveals>,
    /// `[server]`, for its request limits: the router's body limit, and the
    /// JSON extractor's (through `FromRef`) for the batch.
    pub server: ServerConfig,
}

impl axum::extract::FromRef<PublicState> for ServerConfig {
    fn from_ref(state: &PublicState) -> Self {
        state.server
    }
}

/// What the admin routes may reach: the write side of the status set, the caches
/// (to invalidate), the reveal log, the tokens, readiness and the metrics
/// renderer. Not the resolver: nothing on the admin listener looks a number up.
#[derive(Clone)]
pub struct AdminState {
    /// The call-tracking status set's write side: the webhook and the snapshot
    /// write through it, the status lookup reads it, an invalidation is
    /// announced through it to every replica, `/readyz` waits for it to be
    /// loaded and `/metrics` asks it for its gauges.
    pub status: StatusService,
    /// This replica's number caches, for their gauges on `/metrics` (an
    /// invalidation reaches them through `status`, which tells the fleet).
    pub caches: Caches,
    /// The app's request-duration histogram, which its fronts record into and
    /// `/metrics` renders.
    pub durations: Arc<Durations>,
    /// The admin tokens (`admin.token`, `[[admin.tokens]]`). No handler reads
    /// them: the admin listener's front checks them before routing (and hands
    /// the handlers the caller's name), `App::build` hands them over from here
    /// so the state and the front hold the same set, and the app's background
    /// task re-reads their files.
    pub tokens: Arc<AdminTokens>,
    /// Set when shutdown begins: `/readyz` then answers 503, so the load
    /// balancer stops sending traffic before the listeners close.
    pub shutting_down: Arc<AtomicBool>,
    /// The migration the start runs, if one does: `/readyz` names it.
    pub migrations: crate::store::Migrations,
    /// The Prometheus recorder's renderer: `/metrics` renders it, then appends
    /// the request-duration histogram (`durations`), kept apart from the
    /// recorder.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// The reveal log's buffer (for its gauge); `None` when `reveals.enabled` is
    /// false, and then the reveal routes answer 404.
    pub reveals: Option<Reveals>,
    /// The reveal log in the database, read by the reveal routes (only while
    /// `reveals` is some).
    pub reveal_store: RevealStore,
    /// The viewer budgets, when on: `/readyz` answers 503 until the refusals in
    /// force are loaded.
    pub budgets: Option<Arc<Budgets>>,
    /// `[server]`, for its request limits: the router's body limit, the JSON
    /// extractor's (through `FromRef`) and the snapshot's own, which the
    /// snapshot route streams against.
    pub server: ServerConfig,
    /// The snapshot uploads in flight (`server.max_snapshot_uploads`): the
    /// snapshot PUT takes a place before it reads its body.
    pub snapshot_uploads: Uploads,
}

impl axum::extract::FromRef<AdminState> for ServerConfig {
    fn from_ref(state: &AdminState) -> Self {
        state.server
    }
}
