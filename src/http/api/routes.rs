//! The route table: the handlers of every row of both listeners
//! ([`super::paths`]), at the top of the API: it names the handlers, and
//! nothing below it names the table. The routers ([`super::public_router`],
//! [`super::admin_router`]) are folds over [`PUBLIC`] and [`ADMIN`].
//!
//! A new route is its path's constant and its row in [`super::paths`] (which
//! the handler's `#[utoipa::path(path = ...)]` names: utoipa wants a path per
//! handler, and the constant keeps the literal in one place, which
//! `tests/arrows.rs` checks), and its handlers here, in the same place of the
//! same listener's table: a compile-time check holds each table to its rows,
//! one for one and in order.
//!
//! The path constants, `RouteId` and `LABELS` are re-exported here from
//! [`super::paths`], so a caller that named them through this module still does.

use axum::routing::{MethodRouter, get, post, put};

use super::paths::{self, Row};
pub use super::paths::{
    BATCH, HEALTHZ, INVALIDATE, LABELS, METRICS, OPENAPI_ADMIN, OPENAPI_PUBLIC, PROFILE,
    PUBLIC_PHONE, READYZ, REVEALS, REVEALS_OF_AD, RouteId, STATUS_OF_USER, STATUSES,
};
use super::state::{AdminState, PublicState};
use super::{admin, openapi, profile, public, reveals};

/// The public listener's handlers, row by row of [`paths::PUBLIC`].
pub const PUBLIC: &[Route<PublicState>] = &[
    Route::new(PUBLIC_PHONE, || get(public::public_phone)),
    Route::new(BATCH, || post(public::batch)),
    Route::new(OPENAPI_PUBLIC, || get(openapi::public_json)),
];

/// The admin listener's handlers, row by row of [`paths::ADMIN`].
pub const ADMIN: &[Route<AdminState>] = &[
    Route::new(STATUSES, || {
        put(admin::put_statuses).post(admin::post_statuses)
    }),
    Route::new(STATUS_OF_USER, || get(admin::get_status)),
    Route::new(INVALIDATE, || post(admin::invalidate)),
    Route::new(PROFILE, || get(profile::profile)),
    Route::new(REVEALS, || get(reveals::list)),
    Route::new(REVEALS_OF_AD, || get(reveals::ad_counts)),
    Route::new(HEALTHZ, || get(admin::healthz)),
    Route::new(READYZ, || get(admin::readyz)),
    Route::new(METRICS, || get(admin::metrics)),
    Route::new(OPENAPI_ADMIN, || get(openapi::admin_json)),
];

const _: () = assert!(
    follows(PUBLIC, paths::PUBLIC),
    "routes::PUBLIC must follow paths::PUBLIC row by row"
);
const _: () = assert!(
    follows(ADMIN, paths::ADMIN),
    "routes::ADMIN must follow paths::ADMIN row by row"
);

/// The handlers of one row.
pub struct Route<S> {
    /// The row's path ([`Row::path`]).
    pub path: &'static str,
    /// The handlers by method, as the router takes them.
    pub handlers: fn() -> MethodRouter<S>,
}

impl<S> Route<S> {
    const fn new(path: &'static str, handlers: fn() -> MethodRouter<S>) -> Self {
        Route { path, handlers }
    }
}

/// Whether `table` has a route for each of `rows`, with the same path, in the
/// same order.
const fn follows<S>(table: &[Route<S>], rows: &[Row]) -> bool {
    if table.len() != rows.len() {
        return false;
    }
    let mut i = 0;
    while i < table.len() {
        if !same(table[i].path, rows[i].path) {
            return false;
        }
        i += 1;
    }
    true
}

/// `a == b`, in a `const fn`.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_check_compares_whole_paths() {
        assert!(same(STATUSES, STATUSES));
        assert!(!same(STATUSES, STATUS_OF_USER));
        assert!(!same(HEALTHZ, READYZ));
        let swapped = [
            Route::<AdminState>::new(READYZ, || get(admin::readyz)),
            Route::new(HEALTHZ, || get(admin::healthz)),
        ];
        assert!(follows(&ADMIN[6..8], &paths::ADMIN[6..8]));
        assert!(!follows(&swapped, &paths::ADMIN[6..8]));
        assert!(!follows(&ADMIN[..1], &paths::ADMIN[..2]));
    }
}
