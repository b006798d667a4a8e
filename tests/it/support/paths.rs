//! The routes the tests call, typed once, written out rather than taken from
//! the crate (docs/api.md), so that a route moved in the code fails the tests.

pub const PUBLIC_PHONE: &str = "/v1/public-phone";
pub const BATCH: &str = "/v1/public-phones/batch";
/// The call-tracking status webhook (POST) and snapshot (PUT).
pub const STATUSES: &str = "/admin/v1/calltracking/statuses";
pub const INVALIDATE: &str = "/admin/v1/cache/invalidate";
pub const REVEALS: &str = "/admin/v1/reveals";
pub const PROFILE: &str = "/admin/v1/debug/pprof/profile";
/// The operations routes on the admin listener, open without the token.
pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";
/// The OpenAPI documents (the admin one behind the token).
pub const OPENAPI_PUBLIC: &str = "/openapi/public.json";
pub const OPENAPI_ADMIN: &str = "/openapi/admin.json";

/// The public lookup of `user`'s number on `ad` in `category`, with its query.
pub fn phone_path(user: u64, ad: u64, category: u64) -> String {
    format!("{PUBLIC_PHONE}?user_id={user}&ad_id={ad}&category_id={category}")
}

/// One seller's call-tracking status.
pub fn status_path(user: impl std::fmt::Display) -> String {
    format!("{STATUSES}/{user}")
}

/// The reveal log of one ad.
pub fn ad_reveals_path(ad: impl std::fmt::Display) -> String {
    format!("/admin/v1/ads/{ad}/reveals")
}
