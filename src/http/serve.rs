//! Serving a router on a listener, with the connection-level limits `axum::serve`
//! does not expose: a deadline for a client to send its request head (slowloris),
//! and a hard bound on the head's size. HTTP/1.1 through hyper directly, each
//! connection watched for graceful shutdown: on shutdown the listener closes, idle
//! keep-alive connections are closed at once and busy ones after their response.
//!
//! Hyper answers a head over the hard bound with a bare 431; the finer limit
//! (`server.max_header_bytes`, a problem document) is in `shed`.

use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::front::Front;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Time a client has to send the request line and headers.
    pub header_read_timeout: Duration,
    /// Bytes of request head hyper buffers at most (at least 8 KiB).
    pub max_head_bytes: usize,
}

/// Serves `front` until `shutdown` completes, then closes the listener and waits
/// for open connections to finish (the caller bounds that wait).
///
/// # Errors
/// None today: accept errors (too many open files, say) are logged and retried.
pub async fn serve(
    listener: TcpListener,
    front: Front,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192))
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = front.clone();
                let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                tokio::spawn(async move {
                    // Errors here are the client's (reset, timeout, bad request).
                    let _ = connection.await;
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
