//! The header limit and shedding, the first checks inside request tracking: a
//! 431 over `server.max_header_bytes`; past `server.max_in_flight` public
//! requests a 503 at once, never queued; the admin listener is not shed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::Request;

use super::bodies::BodyBuffer;
use crate::http::api::error::ApiError;

pub struct Shed {
    /// Requests let in and not yet answered (a [`Permit`] each).
    in_flight: AtomicUsize,
    /// `usize::MAX`: never shed (the admin listener).
    max_in_flight: usize,
    /// Held here so the shed path does not look the counter up.
    shed: metrics::Counter,
    max_header_bytes: usize,
    /// This listener's share of the body buffer; `None`: not counted (benches and tests).
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

    pub fn bodies(&self) -> Option<(&Arc<BodyBuffer>, usize)> {
        self.bodies.as_ref().map(|(buffer, share)| (buffer, *share))
    }

    /// A 431 when the request line and headers are over the limit.
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

    /// A place among the requests in flight, held until the answer is made; a
    /// 503 when every place is taken.
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
