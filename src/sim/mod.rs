//! The upstream simulator: all three upstreams and the status feed on one
//! listener, with configurable latency, failures and hangs, for the demo, load
//! runs and tests. Its data is a function of the ids ([`real_phone`] and others).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{RngCore as _, SeedableRng as _};
use serde::Deserialize;
use tokio::net::TcpListener;

/// Simulator settings; also the `simulate` command's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SimConfig {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub addr: std::net::SocketAddr,
    /// Latency of every upstream answer, milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Overrides latency_ms for the real-phone upstream.
    #[arg(long)]
    pub real_latency_ms: Option<u64>,
    /// Overrides latency_ms for the anonymous upstream.
    #[arg(long)]
    pub anonymous_latency_ms: Option<u64>,
    /// Overrides latency_ms for the call-tracking upstream.
    #[arg(long)]
    pub calltracking_latency_ms: Option<u64>,
    /// Share of answers that are a 500 (0.0 to 1.0).
    #[arg(long, default_value_t = 0.0)]
    pub failure_rate: f64,
    /// Share of requests accepted and never answered (0.0 to 1.0).
    #[arg(long, default_value_t = 0.0)]
    pub hang_rate: f64,
    /// Sellers with call tracking on in the status feed.
    #[arg(long, default_value_t = 12_000)]
    pub statuses: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            addr: ([127, 0, 0, 1], 0).into(),
            latency_ms: 0,
            real_latency_ms: None,
            anonymous_latency_ms: None,
            calltracking_latency_ms: None,
            failure_rate: 0.0,
            hang_rate: 0.0,
            statuses: 12_000,
        }
    }
}

/// How long a hung request is held before the connection is dropped: far past any
/// upstream timeout, yet bounded so a forgotten simulator ends its tasks.
const HANG: Duration = Duration::from_secs(600);

#[derive(Clone)]
struct Sim {
    config: Arc<SimConfig>,
    sequence: Arc<AtomicU64>,
}

/// SplitMix64's first output for `x`: a well-spread hash for deterministic choices.
fn mix(x: u64) -> u64 {
    SplitMix64::seed_from_u64(x).next_u64()
}

/// The simulated real number of a seller, if any.
pub fn real_phone(user_id: u64) -> Option<String> {
    (user_id % 50 != 0).then(|| format!("+7916{:07}", mix(user_id) % 10_000_000))
}

/// The simulated anonymous number of an ad, if any.
pub fn anonymous_phone(user_id: u64, ad_id: u64) -> Option<String> {
    (user_id.wrapping_add(ad_id) % 3 == 0)
        .then(|| format!("+7800{:07}", mix(user_id ^ mix(ad_id)) % 10_000_000))
}

/// The simulated virtual number for a seller's real number.
pub fn virtual_phone(user_id: u64, phone: &str) -> String {
    let digits: u64 = phone.bytes().filter(u8::is_ascii_digit).fold(0, |a, b| {
        a.wrapping_mul(10).wrapping_add(u64::from(b - b'0'))
    });
    format!("+7495{:07}", mix(user_id ^ digits) % 10_000_000)
}

/// Whether the simulated feed lists a seller as enabled.
pub fn calltracking_enabled(user_id: u64, statuses: u64) -> bool {
    user_id % 4 == 0 && user_id / 4 >= 1 && user_id / 4 <= statuses
}

impl Sim {
    /// Latency, then maybe a hang or a 500; `None` means answer normally.
    async fn misbehave(&self, latency_ms: Option<u64>) -> Option<Response> {
        let latency = latency_ms.unwrap_or(self.config.latency_ms);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        let roll =
            (mix(self.sequence.fetch_add(1, Ordering::Relaxed)) >> 11) as f64 / (1u64 << 53) as f64;
        if roll < self.config.hang_rate {
            tokio::time::sleep(HANG).await;
            return Some(StatusCode::GATEWAY_TIMEOUT.into_response());
        }
        if roll < self.config.hang_rate + self.config.failure_rate {
            return Some(StatusCode::INTERNAL_SERVER_ERROR.into_response());
        }
        None
    }
}

fn phone_or_404(field: &'static str, phone: Option<String>) -> Response {
    match phone {
        Some(phone) => axum::Json(serde_json::json!({ field: phone })).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[derive(Deserialize)]
struct AdQuery {
    ad_id: u64,
}

async fn real(
    State(sim): State<Sim>,
    Path(user_id): Path<u64>,
    Query(q): Query<AdQuery>,
) -> Response {
    let _ = q.ad_id;
    if let Some(r) = sim.misbehave(sim.config.real_latency_ms).await {
        return r;
    }
    phone_or_404("phone", real_phone(user_id))
}

#[derive(Deserialize)]
struct AnonymousQuery {
    user_id: u64,
    ad_id: u64,
}

async fn anonymous(State(sim): State<Sim>, Query(q): Query<AnonymousQuery>) -> Response {
    if let Some(r) = sim.misbehave(sim.config.anonymous_latency_ms).await {
        return r;
    }
    phone_or_404("phone", anonymous_phone(q.user_id, q.ad_id))
}

#[derive(Deserialize)]
struct VirtualQuery {
    user_id: u64,
    phone: String,
}

async fn virtual_numbers(State(sim): State<Sim>, Query(q): Query<VirtualQuery>) -> Response {
    if let Some(r) = sim.misbehave(sim.config.calltracking_latency_ms).await {
        return r;
    }
    phone_or_404("virtual_phone", Some(virtual_phone(q.user_id, &q.phone)))
}

#[derive(Deserialize)]
struct FeedQuery {
    after: Option<String>,
    limit: Option<u64>,
}

async fn statuses(State(sim): State<Sim>, Query(q): Query<FeedQuery>) -> Response {
    let start: u64 = match q.after.as_deref().map(str::parse).transpose() {
        Ok(start) => start.unwrap_or(0),
        Err(_) => return StatusCode::BAD_REQUEST.into_response(),
    };
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    let end = (start + limit).min(sim.config.statuses);
    let items: Vec<_> = (start..end)
        .map(|i| serde_json::json!({ "user_id": (i + 1) * 4, "enabled": true, "version": 1 }))
        .collect();
    let next = end.max(start).to_string();
    axum::Json(serde_json::json!({ "items": items, "next_cursor": next })).into_response()
}

pub fn router(config: SimConfig) -> Router {
    Router::new()
        .route("/v1/users/{user_id}/phone", get(real))
        .route("/v1/anonymous-numbers", get(anonymous))
        .route("/v1/virtual-numbers", get(virtual_numbers))
        .route("/v1/statuses", get(statuses))
        .with_state(Sim {
            config: Arc::new(config),
            sequence: Arc::new(AtomicU64::new(0)),
        })
}

/// Serves the simulator on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    config: SimConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(config))
        .with_graceful_shutdown(shutdown)
        .await
}
