//! The admin API (docs/api.md): status sync, status lookup, cache invalidation,
//! each behind a token with the route's scope (docs/admin-access.md); and operations.

use std::sync::atomic::Ordering;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::{ApiError, Problem};
use super::extract::{Json, Path, field_error, require_json};
use super::paths;
use super::snapshot;
use super::state::AdminState;
use crate::domain::Applied;
use crate::domain::StatusItem;
use crate::domain::UserId;

/// Items one webhook delivery may hold.
pub const MAX_WEBHOOK_ITEMS: usize = 10_000;
/// Sellers one invalidation may name.
pub const MAX_INVALIDATE_IDS: usize = 10_000;

#[derive(Deserialize, ToSchema)]
pub struct WebhookBody {
    #[schema(min_items = 1, max_items = 10000)]
    items: Vec<StatusItem>,
}

/// A user id in a list: 1..=2^63-1 (documentation only).
pub struct UserIdValue;

impl utoipa::PartialSchema for UserIdValue {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .into()
    }
}

impl ToSchema for UserIdValue {}

/// The snapshot PUT body (streamed; see `http::api::snapshot`).
#[derive(ToSchema)]
#[allow(dead_code)] // documentation only
pub struct SnapshotBody {
    #[schema(minimum = 1)]
    version: i64,
    #[schema(value_type = Vec<UserIdValue>, max_items = 10000000)]
    enabled_user_ids: Vec<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct SnapshotApplied {
    version: u64,
    /// Ids read (duplicates included).
    enabled: usize,
}

#[derive(Serialize, ToSchema)]
pub struct UserStatus {
    #[schema(value_type = i64, minimum = 1)]
    user_id: UserId,
    enabled: bool,
    /// 0 for a user never seen.
    #[schema(value_type = i64, minimum = 0)]
    version: u64,
}

#[derive(Serialize, ToSchema)]
pub struct Invalidated {
    invalidated: usize,
}

#[utoipa::path(
    post,
    path = paths::STATUSES,
    tag = "admin",
    security(("bearer" = [])),
    request_body = WebhookBody,
    responses(
        (status = 200, description = "Stored; what applied and what was ignored", body = Applied),
        (status = 400, description = "Bad JSON or a bad item; nothing applied", body = Problem),
        (status = 401, description = "No or a wrong token", body = Problem),
        (status = 413, description = "Body over server.max_body_bytes", body = Problem),
        (status = 415, description = "The body is not sent as application/json", body = Problem),
        (status = 503, description = "The database cannot take it; nothing applied", body = Problem),
    )
)]
pub async fn post_statuses(
    State(state): State<AdminState>,
    Json(body): Json<WebhookBody>,
) -> Result<Response, ApiError> {
    if body.items.is_empty() || body.items.len() > MAX_WEBHOOK_ITEMS {
        return Err(ApiError::bad_request(format!(
            "items: must hold 1 to {MAX_WEBHOOK_ITEMS} items, got {}",
            body.items.len()
        )));
    }
    let changes = body
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            item.parse()
                .map_err(|e| field_error(&format!("items[{i}].{}", e.field), e.reason))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let applied = state.status.apply_changes(&changes, None).await?;
    tracing::info!(
        applied = applied.applied,
        ignored = applied.ignored,
        "status webhook applied"
    );
    Ok(axum::Json(applied).into_response())
}

/// The snapshot PUT; the body is streamed (see `http::api::snapshot`).
#[utoipa::path(
    put,
    path = paths::STATUSES,
    tag = "admin",
    security(("bearer" = [])),
    request_body = SnapshotBody,
    responses(
        (status = 200, description = "Applied", body = SnapshotApplied),
        (status = 400, description = "Bad JSON, version or id; nothing applied", body = Problem),
        (status = 401, description = "No or a wrong token", body = Problem),
        (status = 408, description = "The body did not arrive in time (server.body_read_timeout_ms between chunks, server.snapshot_body_timeout_ms whole); nothing applied", body = Problem),
        (status = 413, description = "Body over server.max_snapshot_bytes", body = Problem),
        (status = 415, description = "The body is not sent as application/json", body = Problem),
        (status = 503, description = "The database cannot take it, or server.max_snapshot_uploads are in flight; nothing applied", body = Problem),
    )
)]
pub async fn put_statuses(
    State(state): State<AdminState>,
    request: Request,
) -> Result<Response, ApiError> {
    require_json(request.headers())?;
    // Before the body is read; held until the answer.
    let _upload = state.snapshot_uploads.start()?;
    let limit = super::limits::snapshot_body(&state.server);
    let (version, count) = snapshot::load(&state.status, request.into_body(), limit).await?;
    tracing::info!(version, ids = count, "status snapshot applied");
    Ok(axum::Json(SnapshotApplied {
        version,
        enabled: count,
    })
    .into_response())
}

#[utoipa::path(
    get,
    path = paths::STATUS_OF_USER,
    tag = "admin",
    security(("bearer" = [])),
    params(("user_id" = i64, Path, minimum = 1)),
    responses(
        (status = 200, description = "The stored status", body = UserStatus),
        (status = 400, description = "A bad user id", body = Problem),
        (status = 401, description = "No or a wrong token", body = Problem),
    )
)]
pub async fn get_status(
    State(state): State<AdminState>,
    Path(user_id): Path<String>,
) -> Result<Response, ApiError> {
    let user = UserId::parse(&user_id).map_err(|e| field_error("user_id", e))?;
    let status = state.status.set().get(user);
    Ok(axum::Json(UserStatus {
        user_id: user,
        enabled: status.enabled,
        version: status.version,
    })
    .into_response())
}

#[derive(Deserialize, ToSchema)]
pub struct InvalidateBody {
    #[schema(value_type = Vec<UserIdValue>, min_items = 1, max_items = 10000)]
    user_ids: Vec<u64>,
}

#[utoipa::path(
    post,
    path = paths::INVALIDATE,
    tag = "admin",
    security(("bearer" = [])),
    request_body = InvalidateBody,
    responses(
        (status = 200, description = "Every cached number of those sellers dropped", body = Invalidated),
        (status = 400, description = "Bad JSON or a bad id", body = Problem),
        (status = 401, description = "No or a wrong token", body = Problem),
        (status = 413, description = "Body over server.max_body_bytes", body = Problem),
        (status = 415, description = "The body is not sent as application/json", body = Problem),
        (status = 503, description = "The invalidation could not be recorded for the other replicas (this one dropped its entries): retry", body = Problem),
    )
)]
pub async fn invalidate(
    State(state): State<AdminState>,
    Json(body): Json<InvalidateBody>,
) -> Result<Response, ApiError> {
    if body.user_ids.is_empty() || body.user_ids.len() > MAX_INVALIDATE_IDS {
        return Err(field_error(
            "user_ids",
            format!("must hold 1 to {MAX_INVALIDATE_IDS} ids"),
        ));
    }
    let users = body
        .user_ids
        .iter()
        .enumerate()
        .map(|(i, id)| UserId::new(*id).map_err(|e| field_error(&format!("user_ids[{i}]"), e)))
        .collect::<Result<Vec<_>, _>>()?;
    // This replica's entries go at once; the others' once the record is durable.
    if let Err(error) = state.status.invalidate(&users).await {
        tracing::error!(%error, sellers = users.len(), "invalidation not recorded; dropped here only");
        return Err(ApiError::Unavailable {
            detail: "the invalidation could not be recorded for the other replicas \
                     (this replica dropped its entries): retry",
        });
    }
    tracing::info!(sellers = users.len(), "caches invalidated on every replica");
    Ok(axum::Json(Invalidated {
        invalidated: users.len(),
    })
    .into_response())
}

#[utoipa::path(get, path = paths::HEALTHZ, tag = "operations",
    responses((status = 200, description = "The process runs", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Ready once the status set is loaded (after the start's migrations that
/// answering needs, which the 503's detail names while one runs; and, with
/// viewer budgets on, the refusals in force), and no longer once shutdown has
/// begun. The reveal log's own migrations run beside the answers: the 200's
/// body names them while they run.
#[utoipa::path(get, path = paths::READYZ, tag = "operations",
    responses(
        (status = 200, description = "Ready (`ready`, and what the reveal log's migrations do while they run beside the answers)", body = String, content_type = "text/plain"),
        (status = 503, description = "Not loaded yet, or shutting down", body = Problem),
    ))]
pub async fn readyz(State(state): State<AdminState>) -> Response {
    if state.shutting_down.load(Ordering::Acquire) {
        return ApiError::Unavailable {
            detail: "shutting down",
        }
        .into_response();
    }
    if !state.status.is_loaded() {
        let unavailable = ApiError::Unavailable {
            detail: "the call-tracking status set is not loaded yet",
        };
        // A migration under way says which, and for how long.
        let Some(migrating) = state.migrations.describe() else {
            return unavailable.into_response();
        };
        let mut problem = unavailable.problem();
        problem.detail = format!("migrating the database: {migrating}");
        let mut response = unavailable.into_response();
        *response.body_mut() = serde_json::to_vec(&problem).unwrap_or_default().into();
        return response;
    }
    if state.budgets.as_ref().is_some_and(|b| !b.is_primed()) {
        return ApiError::Unavailable {
            detail: "the viewer budgets' refusals in force are not loaded yet",
        }
        .into_response();
    }
    match state.migrations.describe() {
        Some(migrating) => (
            StatusCode::OK,
            format!(
                "ready; the reveal log's migrations run beside the answers \
                 (reveals wait in memory): {migrating}"
            ),
        )
            .into_response(),
        None => (StatusCode::OK, "ready").into_response(),
    }
}

#[utoipa::path(get, path = paths::METRICS, tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub async fn metrics(State(state): State<AdminState>) -> Response {
    // The recorder is the process's; what follows is this app's own: gauges
    // its owners compute now, and the request durations.
    let mut text = state.metrics.render();
    state.status.render_gauges(&mut text);
    state.caches.render_gauges(&mut text);
    if let Some(reveals) = &state.reveals {
        reveals.render_gauges(&mut text);
    }
    state.durations.render(&mut text);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
