//! The route table of both listeners, one row per route: its path, who may call
//! it, its handlers by method and its OpenAPI entries. The routers, the OpenAPI
//! documents, the front's [`RouteId`] and the duration series ([`LABELS`]) are
//! all read from here. Two tables, not one with a listener column: each router
//! has its own state type, so a handler cannot land on the wrong listener.

use axum::routing::{MethodRouter, get, post, put};
use utoipa::openapi::OpenApi;

use super::paths::*;
use super::state::{AdminState, PublicState};
use super::{admin, openapi, profile, public, reveals};
use crate::config::Scope;

/// The public listener's routes; its API's description is open.
pub const PUBLIC: &[Route<PublicState>] = &[
    // Answered by the front (`server::front`), every method, before the router.
    Route::front(PUBLIC_PHONE).doc(&[doc::<public::__path_public_phone>]),
    Route::open(BATCH, || post(public::batch)).doc(&[doc::<public::__path_batch>]),
    Route::open(OPENAPI_PUBLIC, || get(public_json)),
];

/// The admin listener's routes. Only the operations are open (a caller without a
/// token learns nothing); the others name their scope (docs/admin-access.md, "Scopes").
pub const ADMIN: &[Route<AdminState>] = &[
    Route::token(STATUSES, Scope::StatusesWrite, || {
        put(admin::put_statuses).post(admin::post_statuses)
    })
    .doc(&[
        doc::<admin::__path_put_statuses>,
        doc::<admin::__path_post_statuses>,
    ]),
    Route::token(STATUS_OF_USER, Scope::StatusesRead, || {
        get(admin::get_status)
    })
    .doc(&[doc::<admin::__path_get_status>]),
    Route::token(INVALIDATE, Scope::CacheInvalidate, || {
        post(admin::invalidate)
    })
    .doc(&[doc::<admin::__path_invalidate>]),
    Route::token(PROFILE, Scope::Debug, || get(profile::profile))
        .doc(&[doc::<profile::__path_profile>]),
    Route::token(REVEALS, Scope::RevealsRead, || get(reveals::list))
        .doc(&[doc::<reveals::__path_list>]),
    Route::token(REVEALS_OF_AD, Scope::RevealsRead, || {
        get(reveals::ad_counts)
    })
    .doc(&[doc::<reveals::__path_ad_counts>]),
    Route::open(HEALTHZ, || get(admin::healthz)).doc(&[doc::<admin::__path_healthz>]),
    Route::open(READYZ, || get(admin::readyz)).doc(&[doc::<admin::__path_readyz>]),
    Route::open(METRICS, || get(admin::metrics)).doc(&[doc::<admin::__path_metrics>]),
    Route::token(OPENAPI_ADMIN, Scope::Debug, || get(admin_json)),
];

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Open,
    /// An admin bearer token carrying this scope, checked by the front.
    Token(Scope),
}

/// One row of a table.
pub struct Route<S> {
    /// The axum path; a `{name}` segment matches one non-empty segment.
    pub path: &'static str,
    pub access: Access,
    /// `None` for the route the front answers itself (the router has no entry
    /// for it, so nothing there could be skipped in production).
    pub handlers: Option<fn() -> MethodRouter<S>>,
    /// The handlers' OpenAPI entries ([`doc`]); none for the documents.
    pub docs: &'static [fn(&mut OpenApi)],
}

impl<S> Route<S> {
    const fn open(path: &'static str, handlers: fn() -> MethodRouter<S>) -> Self {
        Route {
            handlers: Some(handlers),
            ..Route::front(path)
        }
    }

    /// An open route answered by the listener's front, not by the router.
    const fn front(path: &'static str) -> Self {
        Route {
            path,
            access: Access::Open,
            handlers: None,
            docs: &[],
        }
    }

    const fn token(path: &'static str, scope: Scope, handlers: fn() -> MethodRouter<S>) -> Self {
        Route {
            access: Access::Token(scope),
            ..Route::open(path, handlers)
        }
    }

    const fn doc(self, docs: &'static [fn(&mut OpenApi)]) -> Self {
        Route { docs, ..self }
    }

    pub fn documented(&self) -> bool {
        !self.docs.is_empty()
    }

    pub fn entry(&self) -> openapi::Entry {
        openapi::Entry {
            path: self.path,
            scope: match self.access {
                Access::Token(scope) => Some(scope),
                Access::Open => None,
            },
            docs: self.docs,
        }
    }

    /// A `{name}` segment matches one non-empty segment. Nothing is allocated.
    fn matches(&self, path: &str) -> bool {
        let (mut want, mut got) = (self.path.split('/'), path.split('/'));
        loop {
            match (want.next(), got.next()) {
                (None, None) => return true,
                (Some(w), Some(g)) if w.starts_with('{') && !g.is_empty() => {}
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    }
}

/// Routes of both listeners, and "unmatched".
const COUNT: usize = PUBLIC.len() + ADMIN.len() + 1;

/// Every route label, by [`RouteId`]: public paths, admin paths, "unmatched".
pub const LABELS: [&str; COUNT] = {
    let mut all = ["unmatched"; COUNT];
    let mut i = 0;
    while i < PUBLIC.len() {
        all[i] = PUBLIC[i].path;
        i += 1;
    }
    let mut j = 0;
    while j < ADMIN.len() {
        all[PUBLIC.len() + j] = ADMIN[j].path;
        j += 1;
    }
    all
};

/// A request's row, found once per request by the front: an index into
/// [`LABELS`], so the duration series is found by index too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteId(usize);

impl RouteId {
    pub const UNMATCHED: RouteId = RouteId(COUNT - 1);

    /// Its paths have no parameter (a test holds it): an equality per row.
    pub fn public(path: &str) -> RouteId {
        PUBLIC
            .iter()
            .position(|route| route.path == path)
            .map_or(RouteId::UNMATCHED, RouteId)
    }

    pub fn admin(path: &str) -> RouteId {
        ADMIN
            .iter()
            .position(|route| route.matches(path))
            .map_or(RouteId::UNMATCHED, |i| RouteId(PUBLIC.len() + i))
    }

    /// The duration histogram's `route` label: the path as written in the table.
    pub fn label(self) -> &'static str {
        LABELS[self.0]
    }

    pub fn index(self) -> usize {
        self.0
    }

    /// On the admin listener: every row but the open ones, and every unmatched
    /// path, so that without the token no 404 or 405 tells what exists.
    pub fn needs_token(self) -> bool {
        match self.admin_row() {
            Some(route) => route.access != Access::Open,
            None => true,
        }
    }

    /// `None` for the open rows and unmatched paths (any valid token, then a 404 or 405).
    pub fn scope(self) -> Option<Scope> {
        match self.admin_row()?.access {
            Access::Token(scope) => Some(scope),
            Access::Open => None,
        }
    }

    fn admin_row(self) -> Option<&'static Route<AdminState>> {
        self.0.checked_sub(PUBLIC.len()).and_then(|i| ADMIN.get(i))
    }
}

/// Not an `async fn`: its future's hidden type would name the table it is a row of.
fn public_json() -> std::future::Ready<axum::Json<OpenApi>> {
    std::future::ready(axum::Json(openapi::public_api(
        PUBLIC.iter().map(Route::entry),
    )))
}

fn admin_json() -> std::future::Ready<axum::Json<OpenApi>> {
    std::future::ready(axum::Json(openapi::admin_api(
        ADMIN.iter().map(Route::entry),
    )))
}

/// A handler's OpenAPI entry from what `#[utoipa::path]` generated, as
/// `#[derive(OpenApi)]` adds it. `Tags` and `SchemaReferences` are utoipa's hidden
/// traits: `Cargo.lock` pins utoipa, and the documents' tests catch a move.
fn doc<P>(api: &mut OpenApi)
where
    P: utoipa::Path + for<'t> utoipa::__dev::Tags<'t> + utoipa::__dev::SchemaReferences,
{
    let mut operation = P::operation();
    let tags = operation.tags.get_or_insert_with(Vec::new);
    tags.extend(P::tags().into_iter().map(str::to_owned));
    api.paths
        .add_path_operation(P::path(), P::methods(), operation);
    let mut schemas = Vec::new();
    P::schemas(&mut schemas);
    let components = api
        .components
        .get_or_insert_with(utoipa::openapi::Components::new);
    components.schemas.extend(schemas);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_routes_by_listener_and_path() {
        let label = |route: RouteId| route.label();
        let user = STATUS_OF_USER.replace("{user_id}", "42");
        let ad = REVEALS_OF_AD.replace("{ad_id}", "7");
        assert_eq!(label(RouteId::public(PUBLIC_PHONE)), PUBLIC_PHONE);
        let slashed = format!("{PUBLIC_PHONE}/");
        assert_eq!(label(RouteId::public(&slashed)), "unmatched");
        assert_eq!(label(RouteId::public(HEALTHZ)), "unmatched");
        assert_eq!(label(RouteId::admin(PUBLIC_PHONE)), "unmatched");
        assert_eq!(label(RouteId::admin(HEALTHZ)), HEALTHZ);
        assert_eq!(label(RouteId::admin(STATUSES)), STATUSES);
        assert_eq!(label(RouteId::admin(&user)), STATUS_OF_USER);
        assert_eq!(label(RouteId::admin(STATUS_OF_USER)), STATUS_OF_USER);
        assert_eq!(label(RouteId::admin(&format!("{STATUSES}/"))), "unmatched");
        assert_eq!(label(RouteId::admin(&format!("{user}/2"))), "unmatched");
        assert_eq!(label(RouteId::admin(&ad)), REVEALS_OF_AD);
        let no_ad = REVEALS_OF_AD.replace("{ad_id}", "");
        assert_eq!(label(RouteId::admin(&no_ad)), "unmatched");
        assert_eq!(label(RouteId::admin(&format!("{ad}/x"))), "unmatched");
    }

    #[test]
    fn the_public_listener_has_no_parameter_and_no_token() {
        for route in PUBLIC {
            assert!(!route.path.contains('{'), "{}", route.path);
            assert_eq!(route.access, Access::Open, "{}", route.path);
        }
    }

    /// docs/api.md: the token guards everything but health, readiness, metrics.
    #[test]
    fn the_token_guards_everything_but_the_operations() {
        let open: Vec<_> = ADMIN
            .iter()
            .filter(|route| route.access == Access::Open)
            .map(|route| route.path)
            .collect();
        assert_eq!(open, [HEALTHZ, READYZ, METRICS]);
        let needs = |path: &str| RouteId::admin(path).needs_token();
        assert!(needs(STATUSES) && needs(&STATUS_OF_USER.replace("{user_id}", "1")));
        assert!(needs("/admin") && needs("/admin/") && needs("/admin/nothing/here"));
        assert!(needs(OPENAPI_ADMIN) && needs(OPENAPI_PUBLIC));
        assert_eq!(RouteId::public(OPENAPI_PUBLIC).label(), OPENAPI_PUBLIC);
        assert!(needs("/administrator") && needs("/nothing") && needs(""));
        assert!(!needs(HEALTHZ) && !needs(READYZ) && !needs(METRICS));
    }

    /// docs/admin-access.md: each admin route's scope, and every scope used.
    #[test]
    fn each_admin_route_needs_its_scope() {
        let scope = |path: &str| RouteId::admin(path).scope();
        assert_eq!(scope(STATUSES), Some(Scope::StatusesWrite));
        let status = scope("/admin/v1/calltracking/statuses/42");
        assert_eq!(status, Some(Scope::StatusesRead));
        assert_eq!(scope(INVALIDATE), Some(Scope::CacheInvalidate));
        assert_eq!(scope(REVEALS), Some(Scope::RevealsRead));
        assert_eq!(scope("/admin/v1/ads/7/reveals"), Some(Scope::RevealsRead));
        assert_eq!(scope(PROFILE), Some(Scope::Debug));
        assert_eq!(scope(OPENAPI_ADMIN), Some(Scope::Debug));
        assert_eq!(scope("/admin/nothing"), None);
        assert_eq!(scope(HEALTHZ), None);
        for wanted in Scope::ALL {
            let guards = ADMIN.iter().any(|r| r.access == Access::Token(wanted));
            assert!(guards, "{wanted} guards no route");
        }
    }

    #[test]
    fn every_path_is_one_row() {
        let mut paths: Vec<_> = LABELS.to_vec();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), LABELS.len());
    }
}
