//! The reveal log's admin routes (docs/api.md, "The reveal log"): a seller's or
//! a viewer's reveals, newest first in keyset pages, and an ad's counts over
//! every replica; 404 when `reveals.enabled` is false.

use axum::Extension;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::ToSchema;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{RefOr, schema::AdditionalProperties};

use super::access::{self, Caller};
use super::error::{ApiError, Problem};
use super::extract::{Path, field_error};
use super::paths;
use super::state::AdminState;
use crate::domain::reason::{Code, Failure, Origin, Reason, Skip};
use crate::domain::{AdId, RevealQuery, RevealsOf, Source, StoredReveal, UserId, Viewer};

/// Reveals a page holds by default and at most.
pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1000;

#[derive(Serialize, ToSchema)]
pub struct RevealItem {
    /// RFC 3339, UTC, milliseconds.
    #[schema(example = "2026-11-23T10:00:00.123Z")]
    at: String,
    viewer: Option<String>,
    #[schema(value_type = i64, minimum = 1)]
    user_id: UserId,
    #[schema(value_type = i64, minimum = 1)]
    ad_id: AdId,
    #[schema(value_type = i64, minimum = 1)]
    category_id: u64,
    kind: Source,
    /// Why this kind (docs/rules.md, "Why this number"); null for a reveal
    /// recorded before reasons were kept.
    #[schema(value_type = Option<RevealReason>)]
    reason: Option<Reason>,
}

/// The OpenAPI schema of a reveal's reason, with every word each field can
/// hold, taken from the code.
pub struct RevealReason;

/// Every word a skip is written as.
pub fn skip_words() -> Vec<&'static str> {
    // A new kind of skip fails to compile here until it is listed below.
    let listed = |skip: Skip| match skip {
        Skip::NotApplicable | Skip::NoNumber | Skip::Failed(_) => skip,
    };
    [Skip::NotApplicable, Skip::NoNumber]
        .into_iter()
        .chain(Failure::ALL.map(Skip::Failed))
        .map(|skip| listed(skip).as_str())
        .collect()
}

pub fn origin_words() -> Vec<&'static str> {
    // A new origin fails to compile here until it is listed below.
    let listed = |origin: Origin| match origin {
        Origin::Cache | Origin::Upstream | Origin::Stale(_) | Origin::Phone => origin,
    };
    [
        Origin::Cache,
        Origin::Upstream,
        Origin::Stale(Failure::Timeout),
        Origin::Phone,
    ]
    .into_iter()
    .map(|origin| listed(origin).as_str())
    .collect()
}

fn one_of(words: &[&'static str], description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(words.iter().copied()))
        .description(Some(description))
}

impl utoipa::PartialSchema for RevealReason {
    fn schema() -> RefOr<Schema> {
        let skips = skip_words();
        let failures = Failure::ALL.map(Failure::as_str);
        let mut sources = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "The sources above the one that answered, in `selection.order`, each \
                 with why it did not answer: `not_applicable` (it does not apply to this \
                 request), `no_number` (its upstream has none), or the verdict it failed \
                 on (and its `on_error` let the order go on). Empty when the first \
                 source answered.",
            ))
            .additional_properties(Some(AdditionalProperties::FreeForm(false)));
        for source in Source::ALL {
            sources = sources.property(
                source.as_str(),
                one_of(&skips, "Why this source did not answer"),
            );
        }
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Why the buyer was shown this kind of number (docs/rules.md, \
                 \"Why this number\"). Codes only: no number is in it.",
            ))
            .property(
                "code",
                one_of(
                    &Code::ALL,
                    "The one code that decided the answer, as the metric \
                     phones_gateway_answers_total labels it: for the caller's own phone \
                     `phone_calltracking_failed` when call tracking failed above it, else \
                     `phone`; else `<source>_<verdict>` of the nearest source above \
                     that failed, else `<source>_no_number` of the nearest that had no \
                     number; else the origin",
                ),
            )
            .required("code")
            .property("sources", sources)
            .required("sources")
            .property(
                "origin",
                one_of(
                    &origin_words(),
                    "Where the number came from: a fresh cache entry, the upstream, a \
                     stale cache entry (stale-if-error), or the caller's `phone`",
                ),
            )
            .required("origin")
            .property(
                "stood_in_for",
                one_of(
                    &failures,
                    "Only with `origin` `stale`: the outcome of the upstream's call the \
                     stale value stood in for",
                ),
            )
            .additional_properties(Some(AdditionalProperties::FreeForm(false)))
            .examples([serde_json::json!({
                "code": "calltracking_timeout",
                "sources": {"anonymous": "not_applicable", "calltracking": "timeout"},
                "origin": "upstream"
            })])
            .into()
    }
}

impl ToSchema for RevealReason {}

#[derive(Serialize, ToSchema)]
pub struct RevealPage {
    items: Vec<RevealItem>,
    /// Pass as `cursor` for the next (older) page; null on the last page.
    next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ByKind {
    anonymous: u64,
    calltracking: u64,
    real: u64,
}

#[derive(Serialize, ToSchema)]
pub struct AdReveals {
    #[schema(value_type = i64, minimum = 1)]
    ad_id: AdId,
    total: u64,
    by_kind: ByKind,
}

#[utoipa::path(
    get,
    path = paths::REVEALS,
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("user_id" = Option<i64>, Query, minimum = 1, description = "The seller (exactly one of user_id and viewer)"),
        ("viewer" = Option<String>, Query, description = "The viewer (X-Viewer-Id) (exactly one of user_id and viewer)"),
        ("since" = Option<String>, Query, description = "RFC 3339: reveals at or after"),
        ("until" = Option<String>, Query, description = "RFC 3339: reveals before"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 1000, description = "Page size, default 100"),
        ("cursor" = Option<String>, Query, description = "The previous page's next_cursor"),
    ),
    responses(
        (status = 200, description = "Reveals, newest first", body = RevealPage),
        (status = 400, description = "A bad parameter", body = Problem),
        (status = 401, description = "No or a wrong token", body = Problem),
        (status = 404, description = "The reveal log is off", body = Problem),
        (status = 503, description = "The database is unavailable, or the reveal log is being migrated", body = Problem),
    )
)]
pub async fn list(
    State(state): State<AdminState>,
    caller: Option<Extension<Caller>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    readable(&state)?;
    let query = parse_query(query.as_deref().unwrap_or_default())?;
    // Who read whose history is itself on record (docs/admin-access.md).
    let token = name_of(caller.as_ref());
    match &query.of {
        RevealsOf::Seller(user) => {
            tracing::info!(token, user_id = %user, "reveal log read");
        }
        RevealsOf::Viewer(viewer) => {
            tracing::info!(token, viewer = viewer.as_str(), "reveal log read");
        }
    }
    // One more than asked tells whether there is a next page.
    let limit = query.limit;
    let mut rows = state
        .reveal_store
        .read_reveals(&RevealQuery {
            limit: limit + 1,
            ..query
        })
        .await?;
    let next_cursor = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last()
            .map(|last| format!("{}.{}", last.reveal.at_us, last.id))
    } else {
        None
    };
    let items = rows.into_iter().map(item).collect();
    Ok(axum::Json(RevealPage { items, next_cursor }).into_response())
}

#[utoipa::path(
    get,
    path = paths::REVEALS_OF_AD,
    tag = "admin",
    security(("bearer" = [])),
    params(("ad_id" = i64, Path, minimum = 1)),
    responses(
        (status = 200, description = "The ad's counts over every replica, as written so far", body = AdReveals),
        (status = 400, description = "A bad ad id", body = Problem),
        (status = 401, description = "No or a wrong token", body = Problem),
        (status = 404, description = "The reveal log is off", body = Problem),
        (status = 503, description = "The database is unavailable, or the reveal log is being migrated", body = Problem),
    )
)]
pub async fn ad_counts(
    State(state): State<AdminState>,
    caller: Option<Extension<Caller>>,
    Path(ad_id): Path<String>,
) -> Result<Response, ApiError> {
    readable(&state)?;
    let ad = AdId::parse(&ad_id).map_err(|e| field_error("ad_id", e))?;
    let token = name_of(caller.as_ref());
    tracing::info!(token, ad_id = %ad, "reveal log read");
    let counts = state.reveal_store.ad_reveal_counts(ad).await?;
    Ok(axum::Json(AdReveals {
        ad_id: ad,
        total: counts.total(),
        by_kind: ByKind {
            anonymous: counts.anonymous,
            calltracking: counts.calltracking,
            real: counts.real,
        },
    })
    .into_response())
}

/// On (else 404), and no migration of the log running (else 503, named by `/readyz`).
fn readable(state: &AdminState) -> Result<(), ApiError> {
    if state.reveals.is_none() {
        return Err(ApiError::RouteNotFound);
    }
    if state.migrations.describe().is_some() {
        return Err(ApiError::Unavailable {
            detail: "the reveal log is being migrated: retry once /readyz names no migration",
        });
    }
    Ok(())
}

/// `"none"` for a router run without the front.
fn name_of(caller: Option<&Extension<Caller>>) -> &str {
    caller.map_or(access::NO_TOKEN, |Extension(caller)| &caller.name)
}

fn item(row: StoredReveal) -> RevealItem {
    let reveal = row.reveal;
    RevealItem {
        at: rfc3339_ms(reveal.at_us),
        viewer: reveal.viewer.map(|v| v.as_str().to_owned()),
        user_id: reveal.user,
        ad_id: reveal.ad,
        category_id: reveal.category.get(),
        kind: reveal.kind,
        reason: reveal.reason,
    }
}

/// `at_us` as RFC 3339 in UTC with milliseconds: `2026-11-23T10:00:00.123Z`.
fn rfc3339_ms(at_us: i64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(at_us) * 1000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.millisecond()
    )
}

fn parse_time(field: &str, text: &str) -> Result<i64, ApiError> {
    let at = OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|_| field_error(field, "must be an RFC 3339 time, e.g. 2026-11-23T10:00:00Z"))?;
    i64::try_from(at.unix_timestamp_nanos() / 1000).map_err(|_| field_error(field, "out of range"))
}

/// The list route's parameters; unknown ones are ignored, a repeated one refused.
fn parse_query(query: &str) -> Result<RevealQuery, ApiError> {
    let mut fields: [Option<String>; 6] = Default::default();
    const NAMES: [&str; 6] = ["user_id", "viewer", "since", "until", "limit", "cursor"];
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if let Some(i) = NAMES.iter().position(|n| *n == key) {
            if fields[i].replace(value.into_owned()).is_some() {
                return Err(field_error(NAMES[i], "given more than once"));
            }
        }
    }
    let [user, viewer, since, until, limit, cursor] = fields;
    let of = match (user, viewer) {
        (Some(user), None) => {
            RevealsOf::Seller(UserId::parse(&user).map_err(|e| field_error("user_id", e))?)
        }
        (None, Some(viewer)) => RevealsOf::Viewer(
            Viewer::parse(viewer.as_bytes()).map_err(|e| field_error("viewer", e))?,
        ),
        _ => {
            return Err(ApiError::bad_request(
                "exactly one of user_id and viewer is required",
            ));
        }
    };
    let since_us = since.map_or(Ok(i64::MIN), |t| parse_time("since", &t))?;
    let until_us = until.map_or(Ok(i64::MAX), |t| parse_time("until", &t))?;
    let limit = match limit {
        None => DEFAULT_LIMIT,
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                field_error("limit", format!("must be an integer in 1..={MAX_LIMIT}"))
            })?,
    };
    let after = cursor
        .map(|c| {
            c.split_once('.')
                .and_then(|(at, id)| Some((at.parse().ok()?, id.parse().ok()?)))
                .ok_or_else(|| field_error("cursor", "not a cursor this route gave"))
        })
        .transpose()?;
    Ok(RevealQuery {
        of,
        since_us,
        until_us,
        after,
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_with_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        let formatted = rfc3339_ms(1_795_428_000_123_456);
        assert_eq!(formatted, "2026-11-23T10:00:00.123Z");
        let since = |time| parse_time("since", time).unwrap();
        assert_eq!(since("2026-11-23T10:00:00.123Z"), 1_795_428_000_123_000);
        assert_eq!(since("2026-11-23T13:00:00+03:00"), 1_795_428_000_000_000);
        assert!(parse_time("since", "yesterday").is_err());
    }

    /// Every JSON a reason serializes to is one the schema describes, and
    /// every word the schema lists is one some reason is written with.
    #[test]
    fn the_reason_schema_lists_every_word_a_reason_is_written_with() {
        use std::collections::BTreeSet;
        use utoipa::PartialSchema;
        let schema = serde_json::to_value(RevealReason::schema()).unwrap();
        let words = |field: &serde_json::Value| -> BTreeSet<String> {
            field["enum"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap().to_owned())
                .collect()
        };
        let props = &schema["properties"];
        let sources = &props["sources"]["properties"];
        let mut seen: [BTreeSet<String>; 4] = Default::default();
        for reason in crate::domain::reason::tests::every_reason() {
            let json = serde_json::to_value(reason).unwrap();
            for (key, value) in json.as_object().unwrap() {
                assert!(props.get(key).is_some(), "{key} is not in the schema");
                if let Some(word) = value.as_str() {
                    assert!(words(&props[key]).contains(word), "{key}: {word}");
                }
            }
            for (source, skip) in json["sources"].as_object().unwrap() {
                let skip = skip.as_str().unwrap();
                assert!(words(&sources[source]).contains(skip), "{source}: {skip}");
                seen[1].insert(skip.to_owned());
            }
            seen[0].insert(json["code"].as_str().unwrap().to_owned());
            seen[2].insert(json["origin"].as_str().unwrap().to_owned());
            if let Some(failure) = json.get("stood_in_for") {
                seen[3].insert(failure.as_str().unwrap().to_owned());
            }
        }
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        assert_eq!(required, ["code", "sources", "origin"]);
        // Every code listed is one a reason has, and the other way round.
        assert_eq!(seen[0], words(&props["code"]));
        assert_eq!(seen[1], words(&sources["real"]));
        assert_eq!(seen[2], words(&props["origin"]));
        assert_eq!(seen[3], words(&props["stood_in_for"]));
        assert_eq!(words(&props["code"]).len(), Code::ALL.len());
    }

    #[test]
    fn the_query_names_what_is_wrong() {
        let detail = |q: &str| match parse_query(q) {
            Err(ApiError::BadRequest(d)) => d,
            other => panic!("{q}: {other:?}"),
        };
        assert!(detail("").contains("exactly one"));
        assert!(detail("user_id=1&viewer=v").contains("exactly one"));
        assert!(detail("user_id=0").starts_with("user_id:"));
        assert!(detail("viewer=a%20b").starts_with("viewer:"));
        assert!(detail("user_id=1&limit=0").starts_with("limit:"));
        assert!(detail("user_id=1&limit=1001").starts_with("limit:"));
        assert!(detail("user_id=1&cursor=x").starts_with("cursor:"));
        assert!(detail("user_id=1&since=x").starts_with("since:"));
        let q = parse_query("viewer=v-1&limit=5&cursor=17.3&until=2026-11-23T10:00:00Z").unwrap();
        assert_eq!(q.limit, 5);
        assert_eq!(q.after, Some((17, 3)));
        assert_eq!(q.until_us, 1_795_428_000_000_000);
    }
}
