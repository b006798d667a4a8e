//! The route table's rows, below everything else in the API: each route's
//! path (written here once, as a constant the handlers' `#[utoipa::path]` and
//! the route table name), who may call it and whether its listener's OpenAPI
//! document describes it; and [`RouteId`], a request's row, found once per
//! request by the front:
//! - the front takes from it the duration label ([`RouteId::label`]) and
//!   whether the token is needed ([`RouteId::needs_token`]: on the admin
//!   listener everything but the rows marked open, the operations, unmatched
//!   paths included);
//! - the duration histogram (`durations`) keeps a series per row
//!   ([`LABELS`]), and the `/metrics` handler renders them;
//! - the OpenAPI test (`openapi::tests`) holds the documents to the rows marked
//!   documented.
//!
//! The handlers of each row are the route table's (`routes`), which follows
//! these rows one for one (a compile-time check). The rows are apart from the
//! handlers so that what the handlers read (a path, a route's label) sits below
//! them: the `/metrics` handler renders the histogram, whose series are these
//! rows, so rows that named their handlers would make an import cycle (table
//! -> handler -> histogram -> table). The handlers, the histogram and the table
//! import this module, and it imports none of them.
//!
//! Two tables, not one with a listener column: each listener's router has its
//! own state type (`PublicState`, `AdminState`), so a row's handlers are typed
//! by the table they are in, and a handler cannot land on the wrong listener.

use crate::config::Scope;

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

/// The public listener's routes, and its API's description (open: it describes
/// what any caller of this listener may call).
pub const PUBLIC: &[Row] = &[
    Row::open(PUBLIC_PHONE),
    Row::open(BATCH),
    Row::open(OPENAPI_PUBLIC).undocumented(),
];

/// The admin listener's routes. Only the operations (health, readiness,
/// metrics) are open; the admin API's description wants the token like every
/// admin route, so a caller without it learns nothing of what the listener
/// offers. The public API's is on the public listener.
///
/// Every other row names the scope its caller's token must carry
/// (docs/admin-access.md): a row cannot want a token without naming one
/// ([`Access::Token`] holds it), and the OpenAPI document declares it per
/// operation from here (`openapi::RequiredScopes`).
pub const ADMIN: &[Row] = &[
    Row::token(STATUSES, Scope::StatusesWrite),
    Row::token(STATUS_OF_USER, Scope::StatusesRead),
    Row::token(INVALIDATE, Scope::CacheInvalidate),
    Row::token(PROFILE, Scope::Debug),
    Row::token(REVEALS, Scope::RevealsRead),
    Row::token(REVEALS_OF_AD, Scope::RevealsRead),
    Row::open(HEALTHZ),
    Row::open(READYZ),
    Row::open(METRICS),
    Row::token(OPENAPI_ADMIN, Scope::Debug).undocumented(),
];

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Open,
    /// An admin bearer token carrying this scope, checked by the front before
    /// routing.
    Token(Scope),
}

/// One row of a table: a route, as the front, the duration histogram and the
/// OpenAPI test see it (its handlers are in [`super::routes`]).
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// The axum path; a `{name}` segment matches one non-empty segment.
    pub path: &'static str,
    pub access: Access,
    /// Described in its listener's OpenAPI document (all but the documents).
    pub documented: bool,
}

impl Row {
    const fn open(path: &'static str) -> Self {
        Row {
            path,
            access: Access::Open,
            documented: true,
        }
    }

    const fn token(path: &'static str, scope: Scope) -> Self {
        Row {
            access: Access::Token(scope),
            ..Row::open(path)
        }
    }

    const fn undocumented(self) -> Self {
        Row {
            documented: false,
            ..self
        }
    }

    /// Whether `path` is this route's: equal, a `{name}` segment matching one
    /// non-empty segment. Splitting borrows; nothing is allocated.
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

/// Every route label, by [`RouteId`]: the public listener's paths, then the
/// admin listener's, then everything else.
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

    /// The row of a path on the public listener. Its paths have no parameter (a
    /// test holds it), so this is the equality the hit path always paid.
    pub fn public(path: &str) -> RouteId {
        PUBLIC
            .iter()
            .position(|route| route.path == path)
            .map_or(RouteId::UNMATCHED, RouteId)
    }

    /// The row of a path on the admin listener.
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

    /// The row's index into [`LABELS`].
    pub fn index(self) -> usize {
        self.0
    }

    /// Whether a request on the admin listener for this row needs the token
    /// (docs/api.md): every row but those marked [`Access::Open`], and every
    /// unmatched path, so that without the token no 404 or 405 tells what exists.
    pub fn needs_token(self) -> bool {
        match self.admin_row() {
            Some(route) => route.access != Access::Open,
            None => true,
        }
    }

    /// The scope a request on the admin listener for this row needs its token
    /// to carry; `None` for the open rows and for unmatched paths (any valid
    /// token, then a 404 or 405).
    pub fn scope(self) -> Option<Scope> {
        match self.admin_row()?.access {
            Access::Token(scope) => Some(scope),
            Access::Open => None,
        }
    }

    fn admin_row(self) -> Option<&'static Row> {
        self.0.checked_sub(PUBLIC.len()).and_then(|i| ADMIN.get(i))
    }
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
        assert_eq!(
            label(RouteId::public(&format!("{PUBLIC_PHONE}/"))),
            "unmatched"
        );
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

    /// docs/api.md: on the admin listener the token guards everything but
    /// health, readiness and metrics.
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

    /// docs/admin-access.md: the scope of each admin route, and every scope
    /// used by some route.
    #[test]
    fn each_admin_route_needs_its_scope() {
        let scope = |path: &str| RouteId::admin(path).scope();
        assert_eq!(scope(STATUSES), Some(Scope::StatusesWrite));
        assert_eq!(
            scope("/admin/v1/calltracking/statuses/42"),
            Some(Scope::StatusesRead)
        );
        assert_eq!(scope(INVALIDATE), Some(Scope::CacheInvalidate));
        assert_eq!(scope(REVEALS), Some(Scope::RevealsRead));
        assert_eq!(scope("/admin/v1/ads/7/reveals"), Some(Scope::RevealsRead));
        assert_eq!(scope(PROFILE), Some(Scope::Debug));
        assert_eq!(scope(OPENAPI_ADMIN), Some(Scope::Debug));
        assert_eq!(scope("/admin/nothing"), None);
        assert_eq!(scope(HEALTHZ), None);
        for wanted in Scope::ALL {
            assert!(
                ADMIN.iter().any(|r| r.access == Access::Token(wanted)),
                "{wanted} guards no route"
            );
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
