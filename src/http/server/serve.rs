//! Serving a listener's [`Front`] through hyper directly, with what `axum::serve`
//! does not expose: a request-head deadline (a watchdog per connection:
//! docs/performance.md, "The hit path"), a hard bound on the head's size, and
//! graceful shutdown (idle connections closed at once, busy ones after their answer).

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Bytes, HttpBody};
use axum::response::Response;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::conns::{Activity, Inbound};
use super::front::Front;
use super::rewrite::ProblemIo;
use crate::config::ServerConfig;

/// The least of hyper's own bound on a request head: twice its first read
/// buffer (8 KiB, below which hyper's `max_buf_size` panics), so that a head
/// a few times the smallest `server.max_header_bytes` is still answered 431.
const MIN_HEAD_BUFFER: usize = 16 * 1024;

/// Serves `front` until `shutdown` completes, then closes the listener and waits
/// for open connections to finish (the caller bounds that wait).
pub async fn serve(
    listener: TcpListener,
    front: Front,
    server: ServerConfig,
    inbound: Inbound,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // Hyper's hard bound on a request head, above the front's 431 limit.
    let max_head_bytes = (server.max_header_bytes * 2).max(MIN_HEAD_BUFFER);
    let (max_header_bytes, header_read_timeout) =
        (server.max_header_bytes, server.header_read_timeout);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.max_buf_size(max_head_bytes).keep_alive(true);
    // Graceful shutdown as hyper-util's `GracefulShutdown` does it (a watch
    // channel), here so that the room (`conns`) can also ask one connection.
    let (stop, stopping) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (stream, peer, held) = inbound.accept(&listener) => {
                let _ = stream.set_nodelay(true);
                let activity = held.activity().clone();
                let service = Watched {
                    front: front.clone(),
                    activity: activity.clone(),
                    peer: Some(peer.ip()),
                };
                let connection = http.serve_connection(
                    TokioIo::new(ProblemIo::new(
                        Heard { inner: stream, activity: activity.clone() },
                        max_header_bytes,
                    )),
                    service,
                );
                let period = header_read_timeout;
                let mut stopping = stopping.clone();
                tokio::spawn(async move {
                    let _held = held;
                    tokio::pin!(connection);
                    let stalled = stalled(&activity, period);
                    tokio::pin!(stalled);
                    tokio::select! {
                        // Errors here are the client's (reset, bad request).
                        _ = connection.as_mut() => return,
                        // Dropping the connection closes it.
                        () = &mut stalled => return,
                        _ = stopping.changed() => {}
                        () = activity.asked_to_close() => {}
                    }
                    // Closed at once when idle, after its answer when busy.
                    connection.as_mut().graceful_shutdown();
                    tokio::select! {
                        _ = connection => {}
                        () = stalled => {}
                    }
                    // `stopping` is held until here: the shutdown waits for it.
                    drop(stopping);
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    drop(stopping);
    let _ = stop.send(());
    stop.closed().await;
    Ok(())
}

/// Completes once a whole `period` passes with no request in service, head or answer.
async fn stalled(activity: &Activity, period: Duration) {
    let mut last = 0;
    loop {
        tokio::time::sleep(period).await;
        let events = activity.events();
        if events == last && activity.busy() == 0 {
            return;
        }
        last = events;
    }
}

/// A connection's socket, telling its activity when bytes arrive.
struct Heard<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Heard<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.heard();
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Heard<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A request in service; dropped with its answer (or with the connection).
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// A connection's service: the listener's front, reporting to the watchdog.
struct Watched {
    front: Front,
    activity: Arc<Activity>,
    /// Its request bodies count against that client's share (`bodies`).
    peer: Option<IpAddr>,
}

impl<B> hyper::service::Service<axum::http::Request<B>> for Watched
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = <Front as hyper::service::Service<axum::http::Request<B>>>::Future;

    fn call(&self, request: axum::http::Request<B>) -> Self::Future {
        self.activity.began();
        self.front
            .call_holding(request, Busy(self.activity.clone()), self.peer)
    }
}
