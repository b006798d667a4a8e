//! Keep-alive HTTP/1.1 connections to one upstream, over hyper's connection API
//! (why: docs/design.md, "Upstreams"). A connection is reused, most recent first,
//! only after a call that read its answer to the end. A request a reused
//! connection failed before any answer byte is sent once more on a new one (the
//! calls are idempotent GETs). Whose word a failure is: [`Phase`], [`local_errno`].

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

/// How far one call got: whether the upstream was asked, and how long the call
/// waited inside the gateway before that (its host lookup). Atomics, not
/// `Cell`s, so the call's future stays `Send`; one call writes them and reads
/// them, so `Relaxed` is enough.
#[derive(Debug, Default)]
pub(super) struct Phase {
    /// Microseconds the call waited before the upstream was asked, plus one
    /// (0: not asked yet).
    asked_after: AtomicU64,
}

impl Phase {
    pub(super) fn set_asked(&self, waited: Duration) {
        let waited = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        let _ = self.asked_after.compare_exchange(
            0,
            waited.saturating_add(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub(super) fn asked(&self) -> bool {
        self.asked_after.load(Ordering::Relaxed) != 0
    }

    /// How long the call waited before the upstream was asked.
    pub(super) fn waited(&self) -> Duration {
        Duration::from_micros(self.asked_after.load(Ordering::Relaxed).saturating_sub(1))
    }
}

pub(super) struct Pool {
    /// `host:port` to connect to (port 80 when the base URL names none).
    address: String,
    host: HeaderValue,
    idle: Mutex<VecDeque<Idle>>,
    idle_timeout: Duration,
    max_idle: usize,
}

struct Idle {
    sender: Sender,
    since: Instant,
}

/// A connection taken from the pool for one call; dropped, it closes.
pub(super) struct Conn {
    sender: Sender,
    /// Taken idle: the upstream may have closed it meanwhile.
    reused: bool,
}

impl Pool {
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

    /// Sends `request` on `conn` with this upstream's `Host`; sends it once
    /// more on a new connection when a reused one failed before any answer.
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
        // Not an answer that did not parse: hyper hands back a request it
        // never wrote, else it is built again.
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
        // Nothing panics while holding it (pushes and pops).
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

/// Whether a socket error is the gateway's own trouble: out of descriptors,
/// local ports, buffers or memory.
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

/// The next request head read from `socket` (bytes past it stay in `buffer`);
/// `None` once the peer hangs up.
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
