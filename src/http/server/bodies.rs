//! The bound on request bodies held in memory (`server.max_body_buffer_bytes`).
//! Every body is read through [`Counted`], which reserves each chunk from the
//! process's [`BodyBuffer`]; the request's [`Reservation`] gives them back however
//! it ends. A chunk past the bound fails the body (503). The public listener gets
//! three quarters, each client a share ([`Clients`]). See docs/operations.md,
//! "Request bodies in memory".

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use axum::body::{Body, Bytes, HttpBody};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};

use crate::http::api::error::ApiError;

pub struct BodyBuffer {
    /// The admin listener's bound.
    max: usize,
    held: AtomicUsize,
    gauge: metrics::Gauge,
    shed: metrics::Counter,
    /// Set when a body is refused, cleared once back under half the bound: an
    /// episode's refusals are logged once.
    full: AtomicBool,
    /// The public listener's clients' bodies still arriving.
    clients: Clients,
}

impl BodyBuffer {
    /// At most `max` bytes; each client's bodies still arriving, `per_client`.
    pub fn new(max: usize, per_client: usize) -> Arc<Self> {
        let gauge = metrics::gauge!("phones_gateway_body_buffer_bytes");
        gauge.set(0.0);
        Arc::new(BodyBuffer {
            max,
            held: AtomicUsize::new(0),
            gauge,
            shed: metrics::counter!("phones_gateway_shed_total", "reason" => "body_buffer"),
            full: AtomicBool::new(false),
            clients: Clients {
                max: per_client,
                held: Mutex::new(HashMap::new()),
                shed: metrics::counter!("phones_gateway_shed_total", "reason" => "body_share"),
            },
        })
    }

    pub fn clients_holding(&self) -> usize {
        self.clients.held().len()
    }

    /// Three quarters of the bound: the last quarter is the admin listener's.
    pub fn public_share(&self) -> usize {
        self.max - self.max / 4
    }

    pub fn admin_share(&self) -> usize {
        self.max
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

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

/// A client's source address as [`Clients`] tells clients apart: an IPv4
/// address (an IPv4-mapped IPv6 one as IPv4), an IPv6 address by its /64.
pub fn client_of(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// The bytes of bodies still arriving, by client, each at most `max`. An entry
/// lives while its client has a request with a body (never more than the open
/// connections); the lock is taken twice a request, not a chunk.
struct Clients {
    max: usize,
    held: Mutex<HashMap<IpAddr, Arc<AtomicUsize>>>,
    shed: metrics::Counter,
}

impl Clients {
    /// A panic while the lock was held left the map as it was (an insert or a
    /// remove), so a poisoned lock is used.
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Arc<AtomicUsize>>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn of(&self, client: IpAddr) -> Arc<AtomicUsize> {
        self.held().entry(client).or_default().clone()
    }

    /// Gives `count` back, removing the client's entry when no other request
    /// holds it. Counts are cloned only under the lock, so the last holder
    /// sees itself alone there.
    fn leave(&self, client: IpAddr, count: Arc<AtomicUsize>) {
        let mut held = self.held();
        drop(count);
        if held
            .get(&client)
            .is_some_and(|count| Arc::strong_count(count) == 1)
        {
            held.remove(&client);
        }
    }
}

/// A request's part of its client's count, while its body arrives.
struct Share {
    client: IpAddr,
    count: Arc<AtomicUsize>,
    /// This request's bytes in `count`.
    bytes: AtomicUsize,
}

impl Share {
    fn reserve(&self, bytes: usize, max: usize) -> bool {
        let taken = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&after| after <= max)
            })
            .is_ok();
        if taken {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        taken
    }

    fn release(&self) {
        let bytes = self.bytes.swap(0, Ordering::AcqRel);
        if bytes > 0 {
            self.count.fetch_sub(bytes, Ordering::AcqRel);
        }
    }
}

/// One request's bytes in a [`BodyBuffer`], given back when its last clone is dropped.
#[derive(Clone)]
pub struct Reservation(Arc<Reserved>);

struct Reserved {
    buffer: Arc<BodyBuffer>,
    /// The listener's share of the buffer.
    limit: usize,
    bytes: AtomicUsize,
    /// Set when a chunk was refused: the front answers 503.
    refused: AtomicBool,
    /// Set when the refusal was the client's share's.
    over_share: AtomicBool,
    /// On the public listener only.
    share: Option<Share>,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.buffer.release(*self.bytes.get_mut());
        if let Some(share) = self.share.take() {
            share.release();
            self.buffer.clients.leave(share.client, share.count);
        }
    }
}

impl Reservation {
    /// A reservation within `limit` (the listener's share) and, when `client`
    /// is given (the public listener), within that client's share.
    pub fn new(buffer: &Arc<BodyBuffer>, limit: usize, client: Option<IpAddr>) -> Self {
        let share = client.map(|client| Share {
            client,
            count: buffer.clients.of(client),
            bytes: AtomicUsize::new(0),
        });
        Reservation(Arc::new(Reserved {
            buffer: buffer.clone(),
            limit,
            bytes: AtomicUsize::new(0),
            refused: AtomicBool::new(false),
            over_share: AtomicBool::new(false),
            share,
        }))
    }

    pub fn count(&self, body: Body) -> Body {
        Body::new(Counted {
            inner: body,
            reservation: self.clone(),
            failed: false,
        })
    }

    /// In the client's share first, then in the buffer (a chunk the buffer
    /// refuses gives its share back).
    fn reserve(&self, bytes: usize) -> bool {
        let reserved = &self.0;
        let clients = &reserved.buffer.clients;
        if let Some(share) = &reserved.share {
            if !share.reserve(bytes, clients.max) {
                reserved.over_share.store(true, Ordering::Relaxed);
                if !reserved.refused.swap(true, Ordering::Relaxed) {
                    clients.shed.increment(1);
                }
                return false;
            }
        }
        if reserved.buffer.reserve(bytes, reserved.limit) {
            reserved.bytes.fetch_add(bytes, Ordering::Relaxed);
            return true;
        }
        if let Some(share) = &reserved.share {
            share.count.fetch_sub(bytes, Ordering::AcqRel);
            share.bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        if !reserved.refused.swap(true, Ordering::Relaxed) {
            reserved.buffer.refused(reserved.limit);
        }
        false
    }

    /// The body has arrived (or failed): its bytes no longer count against
    /// its client (they stay in the buffer until the request ends).
    fn arrived(&self) {
        if let Some(share) = &self.0.share {
            share.release();
        }
    }

    /// `response`, unless a chunk of its body was refused: then a 503.
    pub fn answer(self, response: Response) -> Response {
        if !self.0.refused.load(Ordering::Relaxed) {
            return response;
        }
        let detail = if self.0.over_share.load(Ordering::Relaxed) {
            "this client's request bodies still arriving are at its share of memory; retry later"
        } else {
            "too many request bodies in memory at once; retry later"
        };
        let mut refused = ApiError::Unavailable { detail }.into_response();
        refused.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        refused
    }
}

/// The body's error for a refused chunk.
#[derive(Debug)]
pub struct BodyBufferFull;

impl std::fmt::Display for BodyBufferFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("too many request bodies in memory at once")
    }
}

impl std::error::Error for BodyBufferFull {}

struct Counted {
    inner: Body,
    reservation: Reservation,
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
        match &frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if !this.reservation.reserve(data.len()) {
                        this.failed = true;
                        this.reservation.arrived();
                        return Poll::Ready(Some(Err(axum::Error::new(BodyBufferFull))));
                    }
                }
                if this.inner.is_end_stream() {
                    this.reservation.arrived();
                }
            }
            Some(Err(_)) | None => this.reservation.arrived(),
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
        let buffer = BodyBuffer::new(100, 100);
        assert_eq!((buffer.public_share(), buffer.admin_share()), (75, 100));
        let first = Reservation::new(&buffer, 100, None);
        let mut body = first.count(body_of(&[30, 30]));
        body.frame().await.unwrap().unwrap();
        assert_eq!(buffer.held(), 30, "as it arrives");
        body.frame().await.unwrap().unwrap();
        assert_eq!(buffer.held(), 60);
        let second = Reservation::new(&buffer, 100, None);
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
        drop(body);
        assert_eq!(buffer.held(), 60);
        let answer = first.answer(Response::new(Body::empty()));
        assert_eq!(answer.status(), 200);
        assert_eq!(buffer.held(), 0);
    }

    #[tokio::test]
    async fn the_public_share_leaves_room_for_the_admin_listener() {
        let buffer = BodyBuffer::new(100, 100);
        let public = Reservation::new(&buffer, buffer.public_share(), None);
        let mut body = public.count(body_of(&[75, 1]));
        body.frame().await.unwrap().unwrap();
        let full = body.frame().await.unwrap();
        assert!(full.is_err(), "the public share is full");
        let admin = Reservation::new(&buffer, buffer.admin_share(), None);
        let mut webhook = admin.count(body_of(&[25]));
        webhook.frame().await.unwrap().unwrap();
        assert_eq!(buffer.held(), 100);
    }

    /// A client's bodies still arriving hold at most its share; others' are taken
    /// meanwhile; an arrived body no longer counts; no entry is left behind.
    #[tokio::test]
    async fn each_client_holds_at_most_its_share_of_bodies_still_arriving() {
        let buffer = BodyBuffer::new(100, 60);
        let greedy = Some(client_of([127, 0, 0, 2].into()));
        let first = Reservation::new(&buffer, 75, greedy);
        let mut held = first.count(body_of(&[20, 1]));
        held.frame().await.unwrap().unwrap();
        let second = Reservation::new(&buffer, 75, greedy);
        let mut refused = second.count(body_of(&[41]));
        assert!(refused.frame().await.unwrap().is_err(), "past its share");
        drop(refused);
        let answer = second.answer(Response::new(Body::empty()));
        assert_eq!(answer.status(), 503);
        assert!(answer.headers().contains_key("retry-after"));
        assert_eq!(buffer.held(), 20, "the refused chunk took nothing");
        let other = Reservation::new(&buffer, 75, Some(client_of([127, 0, 0, 1].into())));
        let mut honest = other.count(body_of(&[50]));
        honest.frame().await.unwrap().unwrap();
        assert!(honest.frame().await.is_none(), "arrived whole");
        assert_eq!(buffer.held(), 70);
        assert_eq!(buffer.clients_holding(), 2);
        held.frame().await.unwrap().unwrap();
        assert!(held.frame().await.is_none());
        let third = Reservation::new(&buffer, 75, greedy);
        let mut next = third.count(body_of(&[4]));
        next.frame().await.unwrap().unwrap();
        let until_answered = "the buffer holds arrived bodies until their answers";
        assert_eq!(buffer.held(), 75, "{until_answered}");
        drop((held, next, honest));
        for reservation in [first, third, other] {
            let answer = reservation.answer(Response::new(Body::empty()));
            assert_eq!(answer.status(), 200);
        }
        assert_eq!((buffer.held(), buffer.clients_holding()), (0, 0));
    }

    #[test]
    fn an_ipv6_client_is_its_64_and_a_mapped_ipv4_one_its_address() {
        let v6 = |s: &str| client_of(s.parse().unwrap());
        assert_eq!(v6("2001:db8:1:2:aaaa::1"), v6("2001:db8:1:2:bbbb::9"));
        assert_ne!(v6("2001:db8:1:2::1"), v6("2001:db8:1:3::1"));
        assert_eq!(v6("::ffff:10.0.0.7"), client_of([10, 0, 0, 7].into()));
    }
}
