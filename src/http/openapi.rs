//! The OpenAPI documents of both listeners, generated from the handlers'
//! annotations (utoipa) and served on the admin listener:
//! `/openapi/public.json` and `/openapi/admin.json`. CI runs schemathesis against
//! them on a live service (`scripts/schemathesis`).

use axum::Json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{admin, error, profile, public, reveals};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "phones-gateway public API",
        description = "Which phone number a buyer sees for an ad."
    ),
    paths(public::public_phone, public::batch),
    components(schemas(
        public::PublicPhone,
        public::BatchBody,
        public::BatchResults,
        public::BatchResult,
        error::Problem,
        crate::domain::Source
    ))
)]
pub struct PublicApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "phones-gateway admin API", description = "Status sync, cache invalidation, operations."),
    paths(
        admin::post_statuses,
        admin::put_statuses,
        admin::get_status,
        admin::invalidate,
        reveals::list,
        reveals::ad_counts,
        profile::profile,
        admin::healthz,
        admin::readyz,
        admin::metrics
    ),
    components(schemas(
        admin::WebhookBody,
        admin::SnapshotBody,
        admin::SnapshotApplied,
        admin::UserStatus,
        admin::InvalidateBody,
        admin::Invalidated,
        admin::UserIdValue,
        reveals::RevealPage,
        reveals::RevealItem,
        reveals::AdReveals,
        reveals::ByKind,
        crate::domain::StatusItem,
        crate::domain::Applied,
        error::Problem
    )),
    modifiers(&Bearer)
)]
pub struct AdminApi;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
            );
        }
    }
}

pub async fn public_json() -> Json<utoipa::openapi::OpenApi> {
    Json(PublicApi::openapi())
}

pub async fn admin_json() -> Json<utoipa::openapi::OpenApi> {
    Json(AdminApi::openapi())
}
