//! Keep-alive HTTP/1.1 connections to one upstream, over hyper's connection API.
//!
//! Why not hyper-util's pooled client (`client::legacy`), which this replaced: on
//! the cold path (`benches/load/harness.py --cold`, callgrind) each of its calls
//! hashed the pool key (scheme and authority) with SipHash, went through its
//! checkout machinery for every host it might serve, and, when the answer had a
//! body, spawned a task that waited for the connection to be ready before putting
//! it back: an allocation, a task poll and a wake-up per call. A pool per
//! upstream needs no key, and a connection goes back when its answer has been read
//! in full, by the call itself; the next call that takes it waits for it to be
//! ready if the connection's task has not run yet: about a fifth fewer
//! instructions a miss (docs/performance.md, "Upstream calls").
//!
//! What the legacy client gave is kept: keep-alive (most recently used first, so
//! the idle rest can age out), an idle timeout, a bound on idle connections, no
//! Nagle, the `Host` header. A connection is never reused after a call that did
//! not read its answer to the end (timed out, cancelled, an unexpected status):
//! it is dropped, which closes it. Idle connections past their timeout are
//! dropped when a call takes or returns one; an upstream that is not called at all
//! closes its side after its own keep-alive, and the connection's task then ends.
//!
//! A request on a reused connection that fails before any byte of an answer
//! (hyper hands it back unwritten, or the connection was reset or closed
//! before the answer began) is sent again, once, on a new connection: the
//! upstream closed an idle connection under it (its keep-alive ran out), and
//! the calls are idempotent GETs. That is no verdict; only what the new
//! connection answers is. Idle connections are kept
//! `upstreams.pool_idle_timeout_ms`, below common servers' keep-alive, so
//! this is seldom needed.
//!
//! Where a connection fails says whose word it is (docs/rules.md, "Verdict or
//! undecided"). The host is looked up first, apart from the connect, and the
//! call's [`Phase`] is set to `Asked` only once an address is known (or an idle
//! connection is taken): a call whose timeout runs out before that was still in
//! the gateway's own phase (the lookup waits for a place on tokio's blocking
//! pool), and is undecided. A connect error is the upstream's verdict (refused,
//! reset, unreachable) unless its `errno` is the gateway's own trouble: out of
//! file descriptors (EMFILE, ENFILE), of local ports (EADDRNOTAVAIL), of buffers
//! or memory (ENOBUFS, ENOMEM) ([`local_errno`]); a failed host lookup is the
//! gateway's own too (its resolver, not the upstream).

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::error::UpstreamError;

type Sender = SendRequest<Empty<Bytes>>;

/// How far one call got: whether the upstream had the chance to answer, and
/// how long the call waited inside the gateway before that (its host lookup).
/// Atomics, not `Cell`s, so the call's future stays `Send`; one call writes
/// them and reads them, so `Relaxed` is enough. No clock is read for a call
/// that takes an idle connection (the cold path's usual case): only a new
/// connection's host lookup is timed.
#[derive(Debug, Default)]
pub(super) struct Phase {
    /// Microseconds the call waited before the upstream was asked, plus one
    /// (0: not asked yet).
    asked_after: AtomicU64,
}

impl Phase {
    /// The upstream is asked, `waited` after the call began.
    pub(super) fn set_asked(&self, waited: Duration) {
        let waited = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        let _ = self.asked_after.compare_exchange(
            0,
            waited.saturating_add(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Whether the call got past the gateway's own phase (an address known, a
    /// connection being opened or used): a timeout is then the upstream's.
    pub(super) fn asked(&self) -> bool {
        self.asked_after.load(Ordering::Relaxed) != 0
    }

    /// How long the call waited inside the gateway before the upstream was
    /// asked (zero when not asked yet).
    pub(super) fn waited(&self) -> Duration {
        Duration::from_micros(self.asked_after.load(Ordering::Relaxed).saturating_sub(1))
    }
}

/// The idle connections to one upstream and how to open another.
pub(super) struct Pool {
    /// `host:port` to connect to (port 80 when the base URL names none).
    address: String,
    /// The base URL's authority, sent as `Host`.
    host: HeaderValue,
    idle: Mutex<VecDeque<Idle>>,
    idle_timeout: Duration,
    max_idle: usize,
}

struct Idle {
    sender: Sender,
    since: Instant,
}

/// A connection taken from the pool for one call. Dropped, it closes; given back
/// with [`Pool::put_back`] once its answer has been read in full, it is reused.
pub(super) struct Conn {
    sender: Sender,
    /// Taken idle from the pool (not opened for this call): the upstream may
    /// have closed it meanwhile.
    reused: bool,
}

impl Pool {
    /// A pool for the upstream at `authority` (`host` or `host:port`).
    pub(super) fn new(
        authority: &hyper::http::uri::Authority,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> Self {
        let port = authority.port_u16().unwrap_or(80);
        Pool {
            address: format!("{}:{port}", authority.host()),
            // An authority is a valid header value (visible ASCII).
            host: HeaderValue::from_str(authority.as_str())
                .unwrap_or(HeaderValue::from_static("localhost")),
            idle: Mutex::new(VecDeque::new()),
            idle_timeout,
            max_idle,
        }
    }

    /// Sends `request` (origin-form URI) on `conn`, with this upstream's `Host`;
    /// a request a reused connection handed back unwritten goes once more, on
    /// a new connection that then replaces `conn` (the module's doc says why).
    pub(super) async fn send(
        &self,
        conn: &mut Conn,
        mut request: hyper::Request<Empty<Bytes>>,
        phase: &Phase,
        again: impl FnOnce() -> Result<hyper::Request<Empty<Bytes>>, UpstreamError>,
    ) -> Result<hyper::Response<Incoming>, UpstreamError> {
        request
            .headers_mut()
            .insert(hyper::header::HOST, self.host.clone());
        let mut error = match conn.sender.try_send_request(request).await {
            Ok(response) => return Ok(response),
            Err(error) => error,
        };
        // A reused connection that failed before any byte of an answer (not
        // an answer that did not parse): the upstream closed it under the
        // request. Sent once more, on a new connection: hyper hands back a
        // request it never wrote, else it is built again.
        if !conn.reused || error.error().is_parse() {
            return Err(connection_error("the request failed", error.error()));
        }
        tracing::debug!(
            "a reused connection failed before any answer; sending the request on a new one"
        );
        let mut request = match error.take_message() {
            Some(unsent) => unsent,
            None => again()?,
        };
        request
            .headers_mut()
            .insert(hyper::header::HOST, self.host.clone());
        *conn = self.connect(phase).await?;
        conn.sender
            .send_request(request)
            .await
            .map_err(|e| connection_error("the request failed", &e))
    }

    /// An idle connection that is still open, or a new one; `phase` says
    /// when the upstream is being asked.
    pub(super) async fn take(&self, phase: &Phase) -> Result<Conn, UpstreamError> {
        loop {
            let Some(idle) = self.lock().pop_back() else {
                return self.connect(phase).await;
            };
            if idle.sender.is_closed() || idle.since.elapsed() > self.idle_timeout {
                continue;
            }
            let mut sender = idle.sender;
            phase.set_asked(Duration::ZERO);
            // Not ready only when its task has not yet run since the last answer;
            // an error means it closed meanwhile.
            if sender.is_ready() || sender.ready().await.is_ok() {
                return Ok(Conn {
                    sender,
                    reused: true,
                });
            }
        }
    }

    /// Gives back a connection whose answer was read in full.
    pub(super) fn put_back(&self, conn: Conn) {
        if conn.sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.lock();
        while idle
            .front()
            .is_some_and(|oldest| now.duration_since(oldest.since) > self.idle_timeout)
        {
            idle.pop_front();
        }
        if idle.len() < self.max_idle {
            idle.push_back(Idle {
                sender: conn.sender,
                since: now,
            });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        // Nothing panics while holding it (pushes and pops), and a poisoned list
        // of idle connections is still a list of idle connections.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn connect(&self, phase: &Phase) -> Result<Conn, UpstreamError> {
        // An IP literal is parsed at once; a name goes to the blocking pool,
        // where it may wait: that wait is the gateway's own.
        let began = Instant::now();
        let addresses: Vec<_> = tokio::net::lookup_host(&self.address)
            .await
            .map_err(|e| UpstreamError::Local(format!("host lookup failed: {e}")))?
            .collect();
        phase.set_asked(began.elapsed());
        let mut last = None;
        let mut stream = None;
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(stream), _) => stream,
            (None, Some(e)) => return Err(connect_error(&e)),
            (None, None) => {
                return Err(UpstreamError::Local("host lookup found no address".into()));
            }
        };
        stream.set_nodelay(true).map_err(|e| connect_error(&e))?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| connection_error("the handshake failed", &e))?;
        // Ends when the connection closes: the sender dropped (not reused, or
        // aged out) or the upstream hung up.
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "upstream connection ended");
            }
        });
        Ok(Conn {
            sender,
            reused: false,
        })
    }
}

/// Whether a socket error is the gateway's own trouble rather than the
/// upstream's answer: out of descriptors, local ports, buffers or memory.
pub(super) fn local_errno(error: &io::Error) -> bool {
    use rustix::io::Errno;
    Errno::from_io_error(error).is_some_and(|errno| {
        [
            Errno::MFILE,
            Errno::NFILE,
            Errno::ADDRNOTAVAIL,
            Errno::NOBUFS,
            Errno::NOMEM,
        ]
        .contains(&errno)
    })
}

/// A failed connect, classified by its `errno` ([`local_errno`]).
fn connect_error(error: &io::Error) -> UpstreamError {
    if local_errno(error) {
        UpstreamError::Local(format!("could not connect: {error}"))
    } else {
        UpstreamError::Connect(format!("could not connect: {error}"))
    }
}

/// hyper's error says what failed and never quotes the URI, which can hold a
/// number.
fn connection_error(what: &str, error: &hyper::Error) -> UpstreamError {
    let mut text = format!("{what}: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    UpstreamError::Connect(text)
}

/// The next request head read from `socket` (bytes past it stay in
/// `buffer`), for the test upstreams here and in `upstream`'s tests; `None`
/// once the peer hangs up.
#[cfg(test)]
pub(super) async fn read_head(
    socket: &mut tokio::net::TcpStream,
    buffer: &mut Vec<u8>,
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 1024];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    buffer.drain(..end);
    Some(head)
}

#[cfg(test)]
mod tests;
