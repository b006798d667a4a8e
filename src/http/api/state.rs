//! The two listeners' states: what the public handlers reach (built by
//! `Parts::public_front`) and what the admin handlers reach (by `App::build`).

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

/// What the public routes reach. Cloned per request by axum, so every field is
/// cheap to clone (`Arc`s and handles).
#[derive(Clone)]
pub struct PublicState {
    /// Also asked by the hit path in `server::front`, without the router.
    pub resolver: Arc<Resolver>,
    /// Checked before resolving (a 429 costs no lookup); `None` when both are 0.
    pub budgets: Option<Arc<Budgets>>,
    /// Each number shown is recorded first; `None` when `reveals.enabled` is false.
    pub reveals: Option<Reveals>,
    /// For its request limits (also the JSON extractor's, through `FromRef`).
    pub server: ServerConfig,
}

impl axum::extract::FromRef<PublicState> for ServerConfig {
    fn from_ref(state: &PublicState) -> Self {
        state.server
    }
}

/// What the admin routes reach; not the resolver: nothing there looks a number up.
#[derive(Clone)]
pub struct AdminState {
    /// The status set's write side; also announces invalidations to every
    /// replica, and `/readyz` waits for it to be loaded.
    pub status: StatusService,
    /// For their gauges on `/metrics` (invalidations go through `status`).
    pub caches: Caches,
    pub durations: Arc<Durations>,
    /// No handler reads them: the front checks them before routing. Held here
    /// so that the state and the front hold the same set (`App::build`).
    pub tokens: Arc<AdminTokens>,
    /// Set when shutdown begins: `/readyz` then answers 503.
    pub shutting_down: Arc<AtomicBool>,
    /// The migration the start runs, if one does: `/readyz` names it.
    pub migrations: crate::store::Migrations,
    /// `/metrics` renders it, then appends `durations`.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// `None` when `reveals.enabled` is false: the reveal routes answer 404.
    pub reveals: Option<Reveals>,
    /// Read by the reveal routes (only while `reveals` is some).
    pub reveal_store: RevealStore,
    /// When on, `/readyz` answers 503 until the refusals in force are loaded.
    pub budgets: Option<Arc<Budgets>>,
    /// For its request limits, the snapshot's own included.
    pub server: ServerConfig,
    /// The snapshot PUT takes a place before it reads its body.
    pub snapshot_uploads: Uploads,
}

impl axum::extract::FromRef<AdminState> for ServerConfig {
    fn from_ref(state: &AdminState) -> Self {
        state.server
    }
}
