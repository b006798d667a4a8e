//! The public API (docs/api.md): one number, or a batch of up to 100.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::batch_items::{BatchItem, BatchItems, batch_item};
use super::budget::{self, VIEWER_HEADER};
use super::error::{ApiError, Problem};
use super::extract::{Json, public_phone_query, single_header};
use super::limits::MAX_BATCH_ITEMS;
use super::paths;
use super::state::PublicState;
use crate::domain::{AdId, Phone, Reveal, Source, UserId, Viewer};
use crate::resolve::{Batch, Request, Resolved, Resolver};
use crate::telemetry::trace::RequestTrace;

/// The number to show.
#[derive(Debug, Serialize, ToSchema)]
pub struct PublicPhone {
    /// Normalised E.164.
    #[schema(value_type = String, pattern = r"^\+[1-9][0-9]{7,14}$", example = "+79161234567")]
    pub phone: Phone,
    pub kind: Source,
    #[schema(value_type = i64, minimum = 1)]
    pub user_id: UserId,
    #[schema(value_type = i64, minimum = 1)]
    pub ad_id: AdId,
}

impl PublicState {
    /// A 429 past a budget, checked before any cache or upstream work.
    fn spend_budget(&self, viewer: Option<&Viewer>, items: usize) -> Result<(), ApiError> {
        self.budgets
            .as_ref()
            .map_or(Ok(()), |b| budget::check(b, viewer, items))
    }

    /// Records a number about to be shown (docs/api.md, "The reveal log") and
    /// counts it; with `on_overflow = "refuse"` a full log is a 503 instead.
    /// Takes the viewer by value: no copy on the request worker.
    fn record(
        &self,
        request: &Request,
        viewer: Option<Viewer>,
        resolved: &Resolved,
    ) -> Result<(), ApiError> {
        let Some(reveals) = &self.reveals else {
            self.resolver.count_answer(resolved);
            return Ok(());
        };
        let reveal = Reveal {
            at_us: crate::reveals::now_us(),
            viewer,
            user: request.user,
            ad: request.ad,
            category: request.category,
            kind: resolved.kind,
            reason: Some(resolved.reason),
        };
        reveals.record(reveal).map_err(|_| ApiError::Unavailable {
            detail: "the reveal log is full: numbers cannot be recorded",
        })?;
        self.resolver.count_answer(resolved);
        Ok(())
    }
}

/// The request's `X-Viewer-Id`, if any; a 400 unless it is one header of 1 to
/// 128 visible ASCII characters.
fn viewer_of(headers: &HeaderMap) -> Result<Option<Viewer>, ApiError> {
    single_header(headers, VIEWER_HEADER, "X-Viewer-Id")?
        .map(|v| Viewer::parse(v.as_bytes()))
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("X-Viewer-Id: {e}")))
}

// `GET` and `HEAD /v1/public-phone`, answered by the front before the router.
// Any other method is a 405 naming these two. HEAD shows no number, so it is
// not a reveal. (Not a doc comment: utoipa would make it the operation's
// summary in the public document.)
#[utoipa::path(
    get,
    path = paths::PUBLIC_PHONE,
    tag = "public",
    params(
        ("user_id" = i64, Query, minimum = 1, description = "The seller"),
        ("ad_id" = i64, Query, minimum = 1, description = "The ad"),
        ("category_id" = i32, Query, minimum = 1, description = "The ad's category"),
        ("phone" = Option<String>, Query, pattern = r"^[ ()-]*\+[ ()-]*[1-9]([ ()-]*[0-9]){7,14}[ ()-]*$",
            description = "The seller's real number, if known: E.164, spaces, hyphens and parentheses allowed"),
        ("X-Viewer-Id" = Option<String>, Header, description = "The buyer (1 to 128 visible ASCII characters), for the per-viewer limit and the reveal log"),
    ),
    responses(
        (status = 200, description = "The number to show", body = PublicPhone),
        (status = 400, description = "A missing or invalid parameter", body = Problem),
        (status = 404, description = "The seller has no number to show", body = Problem),
        (status = 429, description = "The viewer is past a budget (per minute or per day, the fleet's); Retry-After set", body = Problem),
        (status = 503, description = "Cannot decide safely, or shedding load", body = Problem),
    )
)]
pub async fn public_phone(
    state: &PublicState,
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Response {
    if method == Method::GET {
        lookup(state, headers, query, true).await
    } else if method == Method::HEAD {
        headless(lookup(state, headers, query, false).await)
    } else {
        let mut response = ApiError::MethodNotAllowed.into_response();
        let allow = HeaderValue::from_static("GET,HEAD");
        response.headers_mut().insert(header::ALLOW, allow);
        response
    }
}

/// The lookup's status and headers without its body or `Content-Length`: the
/// body's length differs by kind (docs/design.md, "The hit path").
fn headless(mut response: Response) -> Response {
    response.headers_mut().remove(header::CONTENT_LENGTH);
    *response.body_mut() = Body::empty();
    response
}

/// A 200 is recorded as a reveal when `reveal` is set.
async fn lookup(
    state: &PublicState,
    headers: &HeaderMap,
    query: Option<&str>,
    reveal: bool,
) -> Response {
    let answered = async {
        let request = public_phone_query(query)?;
        let viewer = viewer_of(headers)?;
        state.spend_budget(viewer.as_ref(), 1)?;
        let trace = RequestTrace::of(headers);
        let resolved = state.resolver.resolve(&request, Some(&trace)).await?;
        if reveal {
            state.record(&request, viewer, &resolved)?;
        }
        Ok::<_, ApiError>(PublicPhone::of(&request, &resolved))
    };
    match answered.await {
        Ok(body) => {
            let mut response = Response::new(Body::from(body.to_json()));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(error) => error.into_response(),
    }
}

impl PublicPhone {
    /// The body serde would write (a test holds them equal), written directly:
    /// every field is digits or a fixed word, so nothing needs escaping.
    fn to_json(&self) -> Vec<u8> {
        let mut digits = itoa::Buffer::new();
        let mut out = Vec::with_capacity(96);
        out.extend_from_slice(br#"{"phone":"+"#);
        out.extend_from_slice(digits.format(self.phone.to_u64()).as_bytes());
        out.extend_from_slice(br#"","kind":""#);
        out.extend_from_slice(self.kind.as_str().as_bytes());
        out.extend_from_slice(br#"","user_id":"#);
        out.extend_from_slice(digits.format(self.user_id.get()).as_bytes());
        out.extend_from_slice(br#","ad_id":"#);
        out.extend_from_slice(digits.format(self.ad_id.get()).as_bytes());
        out.push(b'}');
        out
    }

    fn of(request: &Request, resolved: &Resolved) -> Self {
        PublicPhone {
            phone: resolved.phone,
            kind: resolved.kind,
            user_id: request.user,
            ad_id: request.ad,
        }
    }
}

async fn batch_item_answer(
    state: &PublicState,
    request: &Request,
    viewer: Option<&Viewer>,
    trace: &RequestTrace<'_>,
    batch: &Batch,
) -> Result<PublicPhone, ApiError> {
    let resolver: &Resolver = &state.resolver;
    let resolved = resolver
        .resolve_in(request, Some(trace), Some(batch))
        .await?;
    state.record(request, viewer.cloned(), &resolved)?;
    Ok(PublicPhone::of(request, &resolved))
}

#[derive(Deserialize, ToSchema)]
pub struct BatchBody {
    /// Each item is an object with the single endpoint's parameters: `user_id`,
    /// `ad_id`, `category_id` (JSON integers) and an optional `phone`. Items are
    /// checked one by one: an item that breaks those rules, whatever its shape,
    /// gets its own 400 problem in the results; it does not make the batch a bad
    /// request. So the schema constrains only the count.
    #[schema(value_type = Vec<Value>, min_items = 1, max_items = 100)]
    items: BatchItems,
}

impl BatchBody {
    /// The items kept (at most [`MAX_BATCH_ITEMS`]), and how many the body held.
    pub fn items(&self) -> (&[BatchItem], usize) {
        (&self.items.kept, self.items.count)
    }
}

/// The batch answer: one result per item, in order.
#[derive(Serialize, ToSchema)]
pub struct BatchResults {
    results: Vec<BatchResult>,
}

/// One result of a batch: the single endpoint's body, or its problem document.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum BatchResult {
    Ok(PublicPhone),
    Err {
        /// The item's `ad_id` when it was an integer.
        ad_id: Option<i64>,
        error: Problem,
    },
}

#[utoipa::path(
    post,
    path = paths::BATCH,
    tag = "public",
    request_body = BatchBody,
    params(("X-Viewer-Id" = Option<String>, Header, description = "The buyer (1 to 128 visible ASCII characters); each item counts once against the limit and is one reveal")),
    responses(
        (status = 200, description = "One result per item, in order", body = BatchResults),
        (status = 400, description = "Bad JSON, not 1 to 100 items, or more items asking for a number than a viewer budget holds", body = Problem),
        (status = 413, description = "Body over server.max_body_bytes", body = Problem),
        (status = 415, description = "The body is not sent as application/json", body = Problem),
        (status = 429, description = "The viewer is past a budget (each item asking for a number counts one); Retry-After set", body = Problem),
        (status = 503, description = "Shedding load", body = Problem),
    )
)]
pub async fn batch(
    State(state): State<PublicState>,
    headers: HeaderMap,
    Json(body): Json<BatchBody>,
) -> Result<Response, ApiError> {
    let (items, count) = body.items();
    if count == 0 || count > MAX_BATCH_ITEMS {
        return Err(ApiError::bad_request(format!(
            "items: must hold 1 to {MAX_BATCH_ITEMS} items, got {count}"
        )));
    }
    let viewer = viewer_of(&headers)?;
    // Items are parsed first: one refused for a bad parameter asks for no
    // number and costs nothing of the viewer's budget.
    let requests: Vec<_> = items.iter().map(batch_item).collect();
    state.spend_budget(
        viewer.as_ref(),
        requests.iter().filter(|request| request.is_ok()).count(),
    )?;
    // One trace and one batch for all items: they share its ticket, deadline
    // and places (`resolve::fan_out`).
    let trace = RequestTrace::of(&headers);
    let batch = state.resolver.batch();
    let results = join_all(items.iter().zip(requests).map(|(item, request)| {
        let (state, viewer, trace, batch) = (&state, viewer.as_ref(), &trace, &batch);
        async move {
            let outcome = match request {
                Ok(request) => batch_item_answer(state, &request, viewer, trace, batch).await,
                Err(error) => Err(error),
            };
            outcome.map_or_else(
                |error| BatchResult::Err {
                    ad_id: item.ad_id(),
                    error: error.problem(),
                },
                BatchResult::Ok,
            )
        }
    }))
    .await;
    Ok(axum::Json(BatchResults { results }).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_body_is_what_serde_writes() {
        let most = i64::MAX as u64;
        for (phone, kind, user, ad) in [
            ("+79161234567", Source::RealPhone, 1, 1),
            ("+12345678", Source::Anonymous, 42, 1001),
            ("+999999999999999", Source::Calltracking, most, 10),
        ] {
            let body = PublicPhone {
                phone: Phone::parse(phone).unwrap(),
                kind,
                user_id: UserId::new(user).unwrap(),
                ad_id: AdId::new(ad).unwrap(),
            };
            let written = String::from_utf8(body.to_json()).unwrap();
            assert_eq!(written, serde_json::to_string(&body).unwrap());
        }
    }
}
