//! The public API (SPEC 2): one number, or a batch of up to 100.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::extract::{Json, batch_item, public_phone_query};
use super::ratelimit::ViewerLimiter;
use crate::config::Source;
use crate::ids::{AdId, UserId};
use crate::phone::Phone;
use crate::resolve::{Request, Resolver};

/// Items a batch may hold.
pub const MAX_BATCH_ITEMS: usize = 100;

#[derive(Debug, Serialize)]
pub struct PublicPhone {
    pub phone: Phone,
    pub kind: Source,
    pub user_id: UserId,
    pub ad_id: AdId,
}

/// What the public routes reach: the resolver and the viewer limit.
#[derive(Clone)]
pub struct PublicState {
    pub resolver: Arc<Resolver>,
    /// `None` when `rate_limit.per_viewer_per_minute` is 0.
    pub limiter: Option<Arc<ViewerLimiter>>,
}

impl PublicState {
    fn admit(&self, headers: &HeaderMap, items: usize) -> Result<(), ApiError> {
        self.limiter
            .as_ref()
            .map_or(Ok(()), |l| l.check(headers, items))
    }
}

pub async fn public_phone(
    State(state): State<PublicState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let request = public_phone_query(query.as_deref())?;
    state.admit(&headers, 1)?;
    let body = answer(&state.resolver, &request).await?;
    Ok(axum::Json(body).into_response())
}

async fn answer(resolver: &Resolver, request: &Request) -> Result<PublicPhone, ApiError> {
    let resolved = resolver.resolve(request).await?;
    Ok(PublicPhone {
        phone: resolved.phone,
        kind: resolved.kind,
        user_id: request.user,
        ad_id: request.ad,
    })
}

#[derive(Deserialize)]
pub struct BatchBody {
    items: Vec<serde_json::Value>,
}

/// One result of a batch: the single endpoint's body, or its problem document.
#[derive(Serialize)]
#[serde(untagged)]
enum BatchResult {
    Ok(PublicPhone),
    Err {
        ad_id: serde_json::Value,
        error: super::error::Problem,
    },
}

pub async fn batch(
    State(state): State<PublicState>,
    headers: HeaderMap,
    Json(body): Json<BatchBody>,
) -> Result<Response, ApiError> {
    if body.items.is_empty() || body.items.len() > MAX_BATCH_ITEMS {
        return Err(ApiError::bad_request(format!(
            "items: must hold 1 to {MAX_BATCH_ITEMS} items, got {}",
            body.items.len()
        )));
    }
    state.admit(&headers, body.items.len())?;
    let results = join_all(body.items.iter().map(|item| {
        let resolver = &*state.resolver;
        async move {
            let outcome = match batch_item(item) {
                Ok(request) => answer(resolver, &request).await,
                Err(error) => Err(error),
            };
            outcome.map_or_else(
                |error| BatchResult::Err {
                    ad_id: item
                        .get("ad_id")
                        .cloned()
                        .unwrap_or(serde_json::Value::Null),
                    error: error.problem(),
                },
                BatchResult::Ok,
            )
        }
    }))
    .await;
    Ok(axum::Json(serde_json::json!({ "results": results })).into_response())
}
