//! The bound on request bodies held in memory (`server.max_body_buffer_bytes`).
//!
//! A JSON route reads its body whole before it parses it (`api::extract`), so a
//! body is memory from its first byte to its request's end, and a client that
//! starts uploads and never finishes them holds that memory for
//! `server.body_read_timeout_ms` each: without a bound, `server.max_in_flight`
//! bodies of `server.max_body_bytes` (4 GiB with the defaults) from one client.
//! So every request body is read through [`Counted`], which reserves each
//! chunk's bytes from the process's [`BodyBuffer`] as it arrives, before anyone
//! can hold it; the request's [`Reservation`] gives them all back when the
//! request ends, however it ends (answered, refused, timed out, its connection
//! gone): it is dropped with the last of the body and the front's answer, so
//! nothing needs to remember to release it. A chunk that would take the buffer
//! past its bound is not handed on: the body fails there, and the front answers
//! the request 503 with `Retry-After` (whatever its handler made of the cut
//! body) and `Connection: close` (the rest of the body is not read), counted in
//! `phones_gateway_shed_total{reason="body_buffer"}`.
//!
//! The bound is for both listeners together, with one share kept: the public
//! listener's bodies may take three quarters of it, the admin listener's all of
//! it, so uploads to the public listener (anyone) cannot refuse the status
//! webhook (a caller with a token: the admin listener reads a body only after
//! the token is checked).
//!
//! Not counted: the snapshot PUT. It streams its body into its parser (a few
//! 64 KiB buffers at a time, never the whole), so its bytes are not held as
//! they arrive; what it does hold, the parsed ids (8 bytes each, 80 MB at
//! 10,000,000), has its own bound, `server.max_snapshot_uploads` uploads at
//! once, each taken before its body is read (`api::snapshot::Uploads`).
//! Counted against this bound, one maximal snapshot (about 110 MB of JSON)
//! would need a bound that no longer protects anything. Nor are requests
//! without a body (the lookup, every GET): they pay one check and no
//! allocation.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use axum::body::{Body, Bytes, HttpBody};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};

use crate::http::api::error::ApiError;

/// The bytes all request bodies hold, against `server.max_body_buffer_bytes`.
pub struct BodyBuffer {
    /// `server.max_body_buffer_bytes`: the admin listener's bound.
    max: usize,
    /// Bytes reserved now, by every [`Reservation`].
    held: AtomicUsize,
    /// `phones_gateway_body_buffer_bytes`: `held`, for the operators.
    gauge: metrics::Gauge,
    /// `phones_gateway_shed_total{reason="body_buffer"}`.
    shed: metrics::Counter,
    /// Set when a body is refused, cleared once the buffer is back under half
    /// its bound: the refusals of one episode are logged once.
    full: AtomicBool,
}

impl BodyBuffer {
    /// A buffer of at most `max` bytes (`server.max_body_buffer_bytes`).
    pub fn new(max: usize) -> Arc<Self> {
        let gauge = metrics::gauge!("phones_gateway_body_buffer_bytes");
        gauge.set(0.0);
        Arc::new(BodyBuffer {
            max,
            held: AtomicUsize::new(0),
            gauge,
            shed: metrics::counter!("phones_gateway_shed_total", "reason" => "body_buffer"),
            full: AtomicBool::new(false),
        })
    }

    /// The public listener's share: three quarters of the bound (the last
    /// quarter is kept for the admin listener's bodies).
    pub fn public_share(&self) -> usize {
        self.max - self.max / 4
    }

    /// The admin listener's share: all of it.
    pub fn admin_share(&self) -> usize {
        self.max
    }

    /// Bytes reserved now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` unless that takes the buffer past `limit`.
    fn reserve(&self, bytes: usize, limit: usize) -> bool {
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&after| after <= limit)
            })
            .is_ok();
        if taken {
            self.gauge.increment(bytes as f64);
        }
        taken
    }

    fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let before = self.held.fetch_sub(bytes, Ordering::AcqRel);
        self.gauge.decrement(bytes as f64);
        if before - bytes <= self.max / 2 && self.full.swap(false, Ordering::Relaxed) {
            tracing::info!(
                held = before - bytes,
                "request bodies back under half of server.max_body_buffer_bytes"
            );
        }
    }

    /// Counts a refused request, and logs the first of an episode.
    fn refused(&self, limit: usize) {
        self.shed.increment(1);
        if !self.full.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                held = self.held(),
                limit,
                "request bodies in memory at server.max_body_buffer_bytes: \
                 refusing new body bytes with 503"
            );
        }
    }
}

/// One request's bytes in a [`BodyBuffer`], given back when the last clone is
/// dropped (the body's and the front's).
#[derive(Clone)]
pub struct Reservation(Arc<Reserved>);

struct Reserved {
    buffer: Arc<BodyBuffer>,
    /// The listener's share of the buffer.
    limit: usize,
    /// This request's bytes reserved so far.
    bytes: AtomicUsize,
    /// Set when a chunk was refused: the front answers 503.
    refused: AtomicBool,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.buffer.release(*self.bytes.get_mut());
    }
}

impl Reservation {
    /// A request's reservation in `buffer`, within `limit` (the listener's
    /// share).
    pub fn new(buffer: &Arc<BodyBuffer>, limit: usize) -> Self {
        Reservation(Arc::new(Reserved {
            buffer: buffer.clone(),
            limit,
            bytes: AtomicUsize::new(0),
            refused: AtomicBool::new(false),
        }))
    }

    /// `body`, its bytes counted here as they arrive.
    pub fn count(&self, body: Body) -> Body {
        Body::new(Counted {
            inner: body,
            reservation: self.clone(),
            failed: false,
        })
    }

    fn reserve(&self, bytes: usize) -> bool {
        let reserved = &self.0;
        if reserved.buffer.reserve(bytes, reserved.limit) {
            reserved.bytes.fetch_add(bytes, Ordering::Relaxed);
            return true;
        }
        if !reserved.refused.swap(true, Ordering::Relaxed) {
            reserved.buffer.refused(reserved.limit);
        }
        false
    }

    /// The request's answer: `response`, unless a chunk of its body was
    /// refused, then a 503 (`Retry-After`, `Connection: close`).
    pub fn answer(self, response: Response) -> Response {
        if !self.0.refused.load(Ordering::Relaxed) {
            return response;
        }
        let mut refused = ApiError::Unavailable {
            detail: "too many request bodies in memory at once; retry later",
        }
        .into_response();
        refused.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        refused
    }
}

/// The chunk that would have taken the buffer past its bound, as the body's
/// error (the front answers 503 whatever the handler made of it).
#[derive(Debug)]
pub struct BodyBufferFull;

impl std::fmt::Display for BodyBufferFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("too many request bodies in memory at once")
    }
}

impl std::error::Error for BodyBufferFull {}

/// A request body whose bytes are reserved as they arrive.
struct Counted {
    inner: Body,
    reservation: Reservation,
    /// A chunk was refused: the body ends there.
    failed: bool,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame {
            if let Some(data) = frame.data_ref() {
                if !this.reservation.reserve(data.len()) {
                    this.failed = true;
                    return Poll::Ready(Some(Err(axum::Error::new(BodyBufferFull))));
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn body_of(chunks: &[usize]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|&n| Ok(Bytes::from(vec![b'x'; n])))
            .collect();
        Body::from_stream(futures_util::stream::iter(chunks))
    }

    #[tokio::test]
    async fn bytes_are_reserved_as_they_arrive_and_released_with_the_request() {
        let buffer = BodyBuffer::new(100);
        assert_eq!((buffer.public_share(), buffer.admin_share()), (75, 100));
        let first = Reservation::new(&buffer, 100);
        let mut body = first.count(body_of(&[30, 30]));
        body.frame().await.unwrap().unwrap();
        assert_eq!(buffer.held(), 30, "as it arrives");
        body.frame().await.unwrap().unwrap();
        assert_eq!(buffer.held(), 60);
        // Another request: its first chunk fits, its second would not.
        let second = Reservation::new(&buffer, 100);
        let mut other = second.count(body_of(&[40, 1]));
        other.frame().await.unwrap().unwrap();
        assert_eq!(buffer.held(), 100, "up to the bound");
        let refused = other.frame().await.unwrap();
        assert!(refused.is_err(), "past the bound");
        assert!(other.frame().await.is_none(), "the body ends there");
        assert_eq!(buffer.held(), 100);
        drop(other);
        let answer = second.answer(Response::new(Body::empty()));
        assert_eq!(answer.status(), 503);
        assert!(answer.headers().contains_key("retry-after"));
        assert_eq!(answer.headers()["connection"], "close");
        assert_eq!(buffer.held(), 60, "released with the request");
        // The first request's bytes stay until its body and its answer are
        // both gone.
        drop(body);
        assert_eq!(buffer.held(), 60);
        let answer = first.answer(Response::new(Body::empty()));
        assert_eq!(answer.status(), 200);
        assert_eq!(buffer.held(), 0);
    }

    #[tokio::test]
    async fn the_public_share_leaves_room_for_the_admin_listener() {
        let buffer = BodyBuffer::new(100);
        let public = Reservation::new(&buffer, buffer.public_share());
        let mut body = public.count(body_of(&[75, 1]));
        body.frame().await.unwrap().unwrap();
        assert!(
            body.frame().await.unwrap().is_err(),
            "the public share is full"
        );
        let admin = Reservation::new(&buffer, buffer.admin_share());
        let mut webhook = admin.count(body_of(&[25]));
        webhook.frame().await.unwrap().unwrap();
        assert_eq!(buffer.held(), 100);
    }
}
