//! Serving a listener's [`Front`], with the connection-level limits `axum::serve`
//! does not expose: a deadline for a client to send its request head (slowloris),
//! and a hard bound on the head's size. HTTP/1.1 through hyper directly, each
//! connection watched for graceful shutdown: on shutdown the listener closes, idle
//! keep-alive connections are closed at once and busy ones after their response.
//!
//! The head deadline is a watchdog per connection, not hyper's
//! `header_read_timeout`: hyper arms a fresh timer for every request (an
//! allocation, a clock read and two timer-wheel updates, a cost the hit path
//! notices: docs/performance.md, "The hit path"); the watchdog wakes once per
//! period per connection. A
//! connection with no request in service that received no new request head and
//! sent no answer during a whole period is closed: a client that sent nothing,
//! or only part of a head, is closed `server.header_read_timeout_ms` after it
//! connected, or between one and two periods after its last answer. That also closes idle
//! keep-alive connections and clients that stopped reading their answer.
//!
//! Hyper answers a head over the hard bound with a bare 431 (and a head it cannot
//! parse with a bare 400); [`ProblemIo`] under each connection rewrites those as
//! problem documents. The finer limit (`server.max_header_bytes`) is in `shed`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Bytes, HttpBody};
use axum::response::Response;

use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::conns::Inbound;
use super::front::Front;
use super::rewrite::ProblemIo;
use crate::config::ServerConfig;

/// Serves `front` until `shutdown` completes, then closes the listener and waits
/// for open connections to finish (the caller bounds that wait). At most
/// `inbound`'s cap of connections are open at once ([`Inbound::accept`]).
///
/// # Errors
/// None today: accept errors (too many open files, say) are counted, logged
/// and retried after a back-off.
pub async fn serve(
    listener: TcpListener,
    front: Front,
    server: ServerConfig,
    inbound: Inbound,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // Hyper's hard bound on a request head, above the problem-document limit
    // of the routers (`server.max_header_bytes`, a 431 from the front).
    let max_head_bytes = (server.max_header_bytes * 2).max(16 * 1024);
    let (max_header_bytes, header_read_timeout) =
        (server.max_header_bytes, server.header_read_timeout);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.max_buf_size(max_head_bytes).keep_alive(true);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            (stream, held) = inbound.accept(&listener) => {
                let _ = stream.set_nodelay(true);
                let activity = Arc::new(Activity::default());
                let service = Watched {
                    front: front.clone(),
                    activity: activity.clone(),
                };
                let connection = graceful.watch(http.serve_connection(
                    TokioIo::new(ProblemIo::new(stream, max_header_bytes)),
                    service,
                ));
                let period = header_read_timeout;
                tokio::spawn(async move {
                    // The connection's place under the cap, freed with it.
                    let _held = held;
                    tokio::select! {
                        // Errors here are the client's (reset, bad request).
                        _ = connection => {}
                        // Dropping the connection closes it.
                        () = stalled(&activity, period) => {}
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// What a connection's watchdog sees.
#[derive(Default)]
struct Activity {
    /// Request heads received and answers made.
    events: AtomicU64,
    /// Requests in service (from their head to their answer).
    busy: AtomicUsize,
}

/// Completes when a whole `period` passed with no request in service, no new
/// request head and no answer.
async fn stalled(activity: &Activity, period: Duration) {
    let mut last = 0;
    loop {
        tokio::time::sleep(period).await;
        let events = activity.events.load(Ordering::Relaxed);
        if events == last && activity.busy.load(Ordering::Relaxed) == 0 {
            return;
        }
        last = events;
    }
}

/// A request in service; dropped with its answer (or with the connection).
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// A connection's service: the listener's front, reporting to the watchdog.
struct Watched {
    /// The listener's front, which answers every request of the connection.
    front: Front,
    /// What the connection's watchdog reads to close an idle connection.
    activity: Arc<Activity>,
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
        self.activity.events.fetch_add(1, Ordering::Relaxed);
        self.activity.busy.fetch_add(1, Ordering::Relaxed);
        self.front
            .call_holding(request, Busy(self.activity.clone()))
    }
}
