//! `ApiError`, the one error type of both listeners, and its RFC 9457 problem
//! document. 5xx bodies stay generic; the cause goes to the log where it arose.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::resolve::ResolveError;

/// Seconds a client should wait before retrying a 503.
pub const RETRY_AFTER_UNAVAILABLE_S: u64 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// Missing, malformed or out-of-range input; the text says which and why.
    BadRequest(String),
    /// The seller has no number to show.
    NoPhone,
    RouteNotFound,
    MethodNotAllowed,
    /// Body over the route's limit (bytes).
    PayloadTooLarge(usize),
    /// A body sent to a JSON route without a JSON content type.
    UnsupportedMediaType,
    /// A request target over hyper's bound (65,534 bytes), when the head limit
    /// is larger still.
    UriTooLong,
    /// Request line and headers over `server.max_header_bytes`.
    HeadersTooLarge(usize),
    /// The client sent its body too slowly.
    RequestTimeout,
    Unauthorized,
    /// A valid admin token without the route's scope; the detail names it.
    Forbidden(crate::config::Scope),
    /// The resource is busy with another request.
    Conflict(&'static str),
    TooManyRequests {
        retry_after_s: u64,
    },
    /// Cannot decide safely, or shedding load.
    Unavailable {
        detail: &'static str,
    },
}

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    #[schema(value_type = String, example = "about:blank")]
    pub kind: &'static str,
    #[schema(value_type = String, example = "Bad Request")]
    pub title: &'static str,
    #[schema(example = 400)]
    pub status: u16,
    #[schema(example = "user_id: required")]
    pub detail: String,
}

impl ApiError {
    pub fn bad_request(detail: impl Into<String>) -> Self {
        ApiError::BadRequest(detail.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NoPhone | ApiError::RouteNotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::UriTooLong => StatusCode::URI_TOO_LONG,
            ApiError::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub fn problem(&self) -> Problem {
        let status = self.status();
        let detail = match self {
            ApiError::BadRequest(detail) => detail.clone(),
            ApiError::NoPhone => "the seller has no phone number to show".into(),
            ApiError::RouteNotFound => "no such route".into(),
            ApiError::MethodNotAllowed => "method not allowed on this route".into(),
            ApiError::PayloadTooLarge(limit) => format!("body over the limit of {limit} bytes"),
            ApiError::UnsupportedMediaType => {
                "the body must be sent as Content-Type: application/json".into()
            }
            ApiError::UriTooLong => "the request target is too long".into(),
            ApiError::HeadersTooLarge(limit) => {
                format!("request line and headers over the limit of {limit} bytes")
            }
            ApiError::RequestTimeout => "the body was not received in time".into(),
            ApiError::Unauthorized => "a valid bearer token is required".into(),
            ApiError::Forbidden(scope) => {
                format!("this token lacks the scope {scope}, which this route needs")
            }
            ApiError::TooManyRequests { .. } => "rate limit exceeded".into(),
            ApiError::Conflict(detail) => (*detail).into(),
            ApiError::Unavailable { detail } => (*detail).into(),
        };
        Problem {
            kind: "about:blank",
            title: status.canonical_reason().unwrap_or("Error"),
            status: status.as_u16(),
            detail,
        }
    }
}

impl From<ResolveError> for ApiError {
    fn from(error: ResolveError) -> Self {
        match error {
            ResolveError::NoPhone => ApiError::NoPhone,
            ResolveError::Unavailable { .. } => ApiError::Unavailable {
                detail: "the number cannot be decided safely right now",
            },
            ResolveError::Undecided(_) => ApiError::Unavailable {
                detail: "the number cannot be decided right now; retry later",
            },
            ResolveError::Overloaded => ApiError::Unavailable {
                detail: "overloaded: the answer is not cached and the service is saturated",
            },
        }
    }
}

impl From<crate::store::StatusStoreError> for ApiError {
    fn from(error: crate::store::StatusStoreError) -> Self {
        tracing::error!(%error, "status store unavailable");
        ApiError::Unavailable {
            detail: STORE_UNAVAILABLE,
        }
    }
}

/// The reveal store could not be read: 503, the cause to the log.
impl From<crate::store::RevealStoreError> for ApiError {
    fn from(error: crate::store::RevealStoreError) -> Self {
        tracing::error!(%error, "reveal store unavailable");
        ApiError::Unavailable {
            detail: STORE_UNAVAILABLE,
        }
    }
}

/// Generic: the cause is in the log.
const STORE_UNAVAILABLE: &str = "the status store is unavailable";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (self.status(), body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        match self {
            ApiError::Unavailable { .. } => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(RETRY_AFTER_UNAVAILABLE_S),
                );
            }
            ApiError::TooManyRequests { retry_after_s } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            }
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

/// Fallback of both routers: unknown paths are problem documents too.
pub async fn route_not_found() -> ApiError {
    ApiError::RouteNotFound
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
