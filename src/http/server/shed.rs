//! The header limit and shedding, the first checks a request meets inside
//! request tracking ([`super::front`]):
//! - request line and headers over `server.max_header_bytes` get a 431 problem;
//! - load shedding: at most `server.max_in_flight` public requests at once; one
//!   more is answered 503 with `Retry-After` at once, never queued. A counter of
//!   requests in flight (a semaphore's `try_acquire`, without the lock a
//!   semaphore takes to release): no `Buffer` in front to shed spuriously, no
//!   concurrency limit below it to queue. The admin listener is not shed, so
//!   probes and metrics answer while the public one sheds;
//! - the listener's share of the request-body buffer (`bodies`), which the
//!   front counts each body against as it arrives.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::Request;

use super::bodies::BodyBuffer;
use crate::http::api::error::ApiError;

pub struct Shed {
    /// Requests let in and not yet answered (a [`Permit`] each).
    in_flight: AtomicUsize,
    /// `server.max_in_flight`: past it a request is shed with a 503;
    /// `usize::MAX`: never shed (the admin listener).
    max_in_flight: usize,
    /// `phones_gateway_shed_total{reason="in_flight"}`, counted per shed
    /// request (held here so the shed path does not look the counter up).
    shed: metrics::Counter,
    /// `server.max_header_bytes`: a request whose headers are larger gets a
    /// 431 naming it.
    max_header_bytes: usize,
    /// The request-body buffer (`server.max_body_buffer_bytes`) and this
    /// listener's share of it; `None`: bodies are not counted (a front built
    /// without the app, in benches and tests).
    bodies: Option<(Arc<BodyBuffer>, usize)>,
}

impl Shed {
    pub fn new(max_in_flight: usize, max_header_bytes: usize) -> Self {
        Shed {
            in_flight: AtomicUsize::new(0),
            max_in_flight,
            shed: metrics::counter!("phones_gateway_shed_total", "reason" => "in_flight"),
            max_header_bytes,
            bodies: None,
        }
    }

    /// The header limit only.
    pub fn unlimited(max_header_bytes: usize) -> Self {
        Shed {
            in_flight: AtomicUsize::new(0),
            max_in_flight: usize::MAX,
            shed: metrics::counter!("phones_gateway_shed_total", "reason" => "in_flight"),
            max_header_bytes,
            bodies: None,
        }
    }

    /// Request bodies counted against `buffer`, up to `share` bytes of it.
    #[must_use]
    pub fn with_bodies(mut self, buffer: &Arc<BodyBuffer>, share: usize) -> Self {
        self.bodies = Some((buffer.clone(), share));
        self
    }

    /// The request-body buffer and this listener's share, if bodies are
    /// counted.
    pub fn bodies(&self) -> Option<(&Arc<BodyBuffer>, usize)> {
        self.bodies.as_ref().map(|(buffer, share)| (buffer, *share))
    }

    /// A 431 when the request line and headers are over the limit.
    ///
    /// # Errors
    /// `HeadersTooLarge`.
    pub fn check_head(&self, request: &Request) -> Result<(), ApiError> {
        let head: usize = request
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>()
            + request
                .uri()
                .path_and_query()
                .map_or(0, |p| p.as_str().len());
        if head > self.max_header_bytes {
            return Err(ApiError::HeadersTooLarge(self.max_header_bytes));
        }
        Ok(())
    }

    /// A place among the requests in flight, held until the answer is made.
    ///
    /// # Errors
    /// `Unavailable` (503) when every place is taken.
    pub fn permit(&self) -> Result<Permit<'_>, ApiError> {
        // Taken before it is checked, so two requests racing for the last place
        // cannot both have it; the loser gives it back.
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let permit = Permit(&self.in_flight);
        if before < self.max_in_flight {
            return Ok(permit);
        }
        drop(permit);
        self.shed.increment(1);
        Err(ApiError::Unavailable {
            detail: "overloaded: too many requests in flight",
        })
    }
}

/// A request in flight; dropping it (answered, or cancelled) frees its place.
pub struct Permit<'a>(&'a AtomicUsize);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
