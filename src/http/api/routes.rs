//! Every route path, once. The routers and the request-duration labels use these
//! constants; the OpenAPI annotations must spell paths as literals, so a test
//! (`openapi::tests`) holds the documents to this list.

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

/// The public listener's routes.
pub const PUBLIC: [&str; 2] = [PUBLIC_PHONE, BATCH];

/// The admin listener's routes.
pub const ADMIN: [&str; 11] = [
    STATUSES,
    STATUS_OF_USER,
    INVALIDATE,
    PROFILE,
    REVEALS,
    REVEALS_OF_AD,
    HEALTHZ,
    READYZ,
    METRICS,
    OPENAPI_PUBLIC,
    OPENAPI_ADMIN,
];
