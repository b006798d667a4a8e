//! Admission, the first thing a request meets inside request tracking (one layer,
//! so one boxed future per request, not two):
//! - request line and headers over `server.max_header_bytes` get a 431 problem;
//! - load shedding: at most `server.max_in_flight` public requests at once; one
//!   more is answered 503 with `Retry-After` at once, never queued. A semaphore
//!   `try_acquire`: no `Buffer` in front to shed spuriously, no concurrency limit
//!   below it to queue. The admin listener is not shed (its `Shed` has no
//!   permits), so probes and metrics answer while the public one sheds.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::error::ApiError;

#[derive(Clone)]
pub struct Shed {
    /// `None`: never shed (the admin listener).
    permits: Option<Arc<Semaphore>>,
    shed: metrics::Counter,
    max_header_bytes: usize,
}

impl Shed {
    pub fn new(max_in_flight: usize, max_header_bytes: usize) -> Self {
        Shed {
            permits: Some(Arc::new(Semaphore::new(max_in_flight))),
            shed: metrics::counter!("phones_gateway_shed_total"),
            max_header_bytes,
        }
    }

    /// The header limit only.
    pub fn unlimited(max_header_bytes: usize) -> Self {
        Shed {
            permits: None,
            shed: metrics::counter!("phones_gateway_shed_total"),
            max_header_bytes,
        }
    }
}

pub async fn admit(State(shed): State<Shed>, request: Request, next: Next) -> Response {
    let head: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum::<usize>()
        + request
            .uri()
            .path_and_query()
            .map_or(0, |p| p.as_str().len());
    if head > shed.max_header_bytes {
        return ApiError::HeadersTooLarge(shed.max_header_bytes).into_response();
    }
    let Some(permits) = &shed.permits else {
        return next.run(request).await;
    };
    match permits.clone().try_acquire_owned() {
        Ok(_permit) => next.run(request).await,
        Err(_) => {
            shed.shed.increment(1);
            ApiError::Unavailable {
                detail: "overloaded: too many requests in flight",
            }
            .into_response()
        }
    }
}
