//! The path of every route of both listeners, written once and named by the
//! route table ([`routes`](super::routes)) and the handlers' `#[utoipa::path]`.
//! A leaf, so the table and its handlers need not import each other for them.

pub const PUBLIC_PHONE: &str = "/v1/public-phone";
pub const BATCH: &str = "/v1/public-phones/batch";

pub const STATUSES: &str = "/admin/v1/calltracking/statuses";
pub const STATUS_OF_USER: &str = "/admin/v1/calltracking/statuses/{user_id}";
pub const INVALIDATE: &str = "/admin/v1/cache/invalidate";
pub const PROFILE: &str = "/admin/v1/debug/pprof/profile";
pub const REVEALS: &str = "/admin/v1/reveals";
pub const REVEALS_OF_AD: &str = "/admin/v1/ads/{ad_id}/reveals";
pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";
pub const OPENAPI_PUBLIC: &str = "/openapi/public.json";
pub const OPENAPI_ADMIN: &str = "/openapi/admin.json";
