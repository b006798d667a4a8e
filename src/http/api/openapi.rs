//! The OpenAPI documents of both listeners (`/openapi/public.json`,
//! `/openapi/admin.json`), built from the route table's rows.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::config::Scope;

#[derive(OpenApi)]
#[openapi(info(
    title = "phones-gateway public API",
    description = "Which phone number a buyer sees for an ad."
))]
struct PublicApi;

#[derive(OpenApi)]
#[openapi(info(
    title = "phones-gateway admin API",
    description = "Status sync, cache invalidation, operations."
))]
struct AdminApi;

/// A row of the route table as its listener's document reads it (handed in by
/// `routes::Route::entry`, so this file needs nothing of the table).
pub struct Entry {
    pub path: &'static str,
    /// `None` for an open route.
    pub scope: Option<Scope>,
    pub docs: &'static [fn(&mut utoipa::openapi::OpenApi)],
}

pub fn public_api(rows: impl IntoIterator<Item = Entry>) -> utoipa::openapi::OpenApi {
    let mut api = PublicApi::openapi();
    for row in rows {
        row.docs.iter().for_each(|doc| doc(&mut api));
    }
    ProblemContentType.modify(&mut api);
    api
}

/// The admin listener's document, with the bearer scheme and each scope.
pub fn admin_api(rows: impl IntoIterator<Item = Entry>) -> utoipa::openapi::OpenApi {
    let mut api = AdminApi::openapi();
    let rows: Vec<Entry> = rows.into_iter().collect();
    for row in &rows {
        row.docs.iter().for_each(|doc| doc(&mut api));
    }
    Bearer.modify(&mut api);
    RequiredScopes(&rows).modify(&mut api);
    ProblemContentType.modify(&mut api);
    api
}

/// Every 4xx and 5xx response is a problem document: served as
/// `application/problem+json` here, in one place.
struct ProblemContentType;

impl Modify for ProblemContentType {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for operation in operations(item) {
                for (status, response) in &mut operation.responses.responses {
                    let utoipa::openapi::RefOr::T(response) = response else {
                        continue;
                    };
                    if !(status.starts_with('4') || status.starts_with('5')) {
                        continue;
                    }
                    if let Some(content) = response.content.shift_remove("application/json") {
                        response
                            .content
                            .insert("application/problem+json".to_owned(), content);
                    }
                }
            }
        }
    }
}

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            let mut http = Http::new(HttpAuthScheme::Bearer);
            http.description = Some(BEARER_DESCRIPTION.to_owned());
            components.add_security_scheme("bearer", SecurityScheme::Http(http));
        }
    }
}

/// How the document declares scopes: an OpenAPI 3 bearer scheme has none (only
/// OAuth2 and OpenID Connect schemes do), so each operation names its scope in
/// the extension [`SCOPE_EXTENSION`] and in its description.
const BEARER_DESCRIPTION: &str = "An admin token (admin.token, or a named \
    [[admin.tokens]] entry). Each operation needs its token to carry the scope \
    named by its x-required-scope extension (and in its description); a valid \
    token without it gets 403. docs/admin-access.md.";

/// The operation extension naming the scope a route needs.
pub const SCOPE_EXTENSION: &str = "x-required-scope";

/// Each admin operation's scope, from its row. Before [`ProblemContentType`]:
/// the 403 is then written as the other errors are.
struct RequiredScopes<'r>(&'r [Entry]);

impl Modify for RequiredScopes<'_> {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::extensions::ExtensionsBuilder;
        use utoipa::openapi::security::SecurityRequirement;
        use utoipa::openapi::{Content, Ref, ResponseBuilder};
        for row in self.0 {
            let Some(scope) = row.scope else {
                continue;
            };
            let Some(item) = openapi.paths.paths.get_mut(row.path) else {
                continue;
            };
            for operation in operations(item) {
                operation.security = Some(vec![SecurityRequirement::new(
                    "bearer",
                    Vec::<String>::new(),
                )]);
                let extension = ExtensionsBuilder::new()
                    .add(SCOPE_EXTENSION, scope.as_str())
                    .build();
                match &mut operation.extensions {
                    Some(extensions) => extensions.merge(extension),
                    None => operation.extensions = Some(extension),
                }
                let line = format!("Needs a token with the scope `{scope}`.");
                operation.description = Some(match operation.description.take() {
                    Some(text) if !text.is_empty() => format!("{text}\n\n{line}"),
                    _ => line,
                });
                operation.responses.responses.insert(
                    "403".to_owned(),
                    ResponseBuilder::new()
                        .description(format!("A valid token without the scope {scope}"))
                        .content(
                            "application/json",
                            Content::new(Some(Ref::from_schema_name("Problem"))),
                        )
                        .into(),
                );
            }
        }
    }
}

fn operations(
    item: &mut utoipa::openapi::path::PathItem,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.head,
        &mut item.patch,
    ]
    .into_iter()
    .flatten()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::http::api::routes::{self, Route};

    fn public_api() -> utoipa::openapi::OpenApi {
        super::public_api(routes::PUBLIC.iter().map(Route::entry))
    }

    fn admin_api() -> utoipa::openapi::OpenApi {
        super::admin_api(routes::ADMIN.iter().map(Route::entry))
    }

    fn paths(api: &utoipa::openapi::OpenApi) -> BTreeSet<&str> {
        api.paths.paths.keys().map(String::as_str).collect()
    }

    fn documented<S>(table: &[routes::Route<S>]) -> BTreeSet<&str> {
        table
            .iter()
            .filter(|r| r.documented())
            .map(|r| r.path)
            .collect()
    }

    /// Each documented row's path is in the documents, and nothing else.
    #[test]
    fn the_documents_describe_the_routes_the_routers_serve() {
        let public = public_api();
        assert_eq!(paths(&public), documented(routes::PUBLIC));
        let admin = admin_api();
        assert_eq!(paths(&admin), documented(routes::ADMIN));
    }

    /// docs/admin-access.md: every operation behind a token declares the
    /// bearer scheme and its route's scope; the open ones neither.
    #[test]
    fn each_admin_operation_declares_its_scope() {
        let json = serde_json::to_value(admin_api()).unwrap();
        let mut scoped = 0;
        for row in routes::ADMIN.iter().filter(|r| r.documented()) {
            for (method, op) in json["paths"][row.path].as_object().unwrap() {
                match row.access {
                    routes::Access::Token(scope) => {
                        scoped += 1;
                        assert_eq!(op[SCOPE_EXTENSION], scope.as_str(), "{method} {}", row.path);
                        assert_eq!(op["security"], serde_json::json!([{"bearer": []}]));
                        assert!(op["description"].as_str().unwrap().contains(scope.as_str()));
                        let problem =
                            &op["responses"]["403"]["content"]["application/problem+json"];
                        let reference = &problem["schema"]["$ref"];
                        assert_eq!(reference, "#/components/schemas/Problem");
                    }
                    routes::Access::Open => {
                        assert!(op.get(SCOPE_EXTENSION).is_none(), "{}", row.path);
                        assert!(op["responses"].get("403").is_none(), "{}", row.path);
                    }
                }
            }
        }
        assert_eq!(scoped, 7);
    }

    /// Every `$ref` of either document resolves to one of its components.
    #[test]
    fn every_schema_an_operation_names_is_in_its_document() {
        for api in [public_api(), admin_api()] {
            let json = serde_json::to_value(&api).unwrap();
            let text = json.to_string();
            let named = text.split("\"#/components/schemas/").skip(1);
            let names: Vec<_> = named.filter_map(|rest| rest.split('"').next()).collect();
            assert!(names.len() > 5, "{names:?}");
            for name in names {
                assert!(json["components"]["schemas"][name].is_object(), "{name}");
            }
        }
    }

    #[test]
    fn every_error_response_is_a_problem_document() {
        for api in [public_api(), admin_api()] {
            let json = serde_json::to_value(&api).unwrap();
            let mut errors = 0;
            for (path, item) in json["paths"].as_object().unwrap() {
                for (method, operation) in item.as_object().unwrap() {
                    for (status, response) in operation["responses"].as_object().unwrap() {
                        if status.starts_with('4') || status.starts_with('5') {
                            errors += 1;
                            let types: Vec<_> =
                                response["content"].as_object().unwrap().keys().collect();
                            let problem = ["application/problem+json"];
                            assert_eq!(types, problem, "{method} {path} {status}");
                        }
                    }
                }
            }
            assert!(errors > 5, "{errors}");
        }
    }
}
