//! Load shedding: at most `server.max_in_flight` public requests at once; one
//! more is answered 503 with `Retry-After` at once, never queued. It is the
//! outermost layer of the public router (inside request tracking only), a
//! semaphore `try_acquire`: no `Buffer` in front to shed spuriously, no
//! concurrency limit below it to queue. The admin listener is not limited, so
//! probes and metrics answer while the public side sheds.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::error::ApiError;

#[derive(Clone)]
pub struct Shed {
    permits: Arc<Semaphore>,
    shed: metrics::Counter,
}

impl Shed {
    pub fn new(max_in_flight: usize) -> Self {
        Shed {
            permits: Arc::new(Semaphore::new(max_in_flight)),
            shed: metrics::counter!("phones_gateway_shed_total"),
        }
    }
}

pub async fn admit(State(shed): State<Shed>, request: Request, next: Next) -> Response {
    match shed.permits.clone().try_acquire_owned() {
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
