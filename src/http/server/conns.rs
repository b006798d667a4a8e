//! The inbound connection cap, and accepting under it.
//!
//! Every inbound connection is a file descriptor, and so is every upstream call
//! and database connection. Without a cap, idle clients could take the last
//! descriptor, and a lookup on a connection already open would find none for
//! its upstream call: the gateway's own trouble, which must never decide an
//! answer (docs/rules.md: such a source is undecided, nothing below it is
//! shown). So each listener holds at most so many connections at once
//! ([`Inbound`]): the public one `server.max_connections` (by default derived
//! from `RLIMIT_NOFILE`, [`max_connections`]), the admin one
//! [`ADMIN_MAX_CONNECTIONS`]. At the cap the listener stops accepting: new
//! connections wait in the kernel's listen backlog (no descriptor held) until
//! one closes, rather than being accepted only to be closed, which would cost
//! the very descriptor that is short. The head deadline (`serve`) closes idle
//! connections, so a wait ends.
//!
//! `accept` failing for lack of descriptors or memory (EMFILE, ENFILE, ENOMEM,
//! ENOBUFS) backs off, from 10 ms doubling to a second, instead of retrying at
//! once (the pending connection stays pending, so an immediate retry fails
//! again); every failure is counted by kind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The admin listener's cap: probes, scrapes and operators, never many (the
/// listener is not on the internet); part of the public cap's reserve.
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// Descriptors the process holds besides connections and the calls counted in
/// `Config::outbound_descriptors`: stdin, stdout and stderr, the runtime's
/// epoll and wakers, the signal pipe, the two listeners, the trace exporter's
/// connections, files read now and then (cgroup, /proc), with room to spare.
pub const BASE_DESCRIPTORS: usize = 66;

/// The derived cap is never below this while the limit allows it; when the
/// reserve leaves less, the cap is half the limit, and a warning says so.
const MIN_DERIVED: usize = 64;

/// `server.max_connections` as it applies: `configured` unless 0; else the
/// open-files limit (`limit`, `None`: unlimited) less the reserve
/// `outbound + ADMIN_MAX_CONNECTIONS + BASE_DESCRIPTORS` (`outbound`:
/// `Config::outbound_descriptors`). A limit that leaves less than 64 past the
/// reserve gives half the limit (and a warning: the process's own calls may
/// then find no descriptor). Returns the cap and where it came from (logged).
pub fn max_connections(
    configured: usize,
    limit: Option<u64>,
    outbound: usize,
) -> (usize, &'static str) {
    if configured > 0 {
        return (configured, "server.max_connections");
    }
    let Some(limit) = limit else {
        return (crate::config::MAX_CONNECTIONS, "no open-files limit");
    };
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let reserve = outbound
        .saturating_add(ADMIN_MAX_CONNECTIONS)
        .saturating_add(BASE_DESCRIPTORS);
    match limit
        .checked_sub(reserve)
        .filter(|&left| left >= MIN_DERIVED)
    {
        Some(left) => (
            left.min(crate::config::MAX_CONNECTIONS),
            "open-files limit less the reserve",
        ),
        None => {
            tracing::warn!(
                limit,
                reserve,
                "the open-files limit barely covers the process's own calls: \
                 capping inbound connections at half of it; raise the hard limit \
                 (LimitNOFILE, ulimit -Hn) or lower server.max_in_flight"
            );
            ((limit / 2).max(1), "half the open-files limit (too low)")
        }
    }
}

/// One listener's connections: at most its cap open at once, gauged.
pub struct Inbound {
    /// `public` or `admin`, the metrics' `listener` label.
    listener: &'static str,
    /// A permit per open connection.
    permits: Arc<Semaphore>,
    /// `phones_gateway_connections{listener}`.
    open: metrics::Gauge,
    /// `phones_gateway_connections_capped_total{listener}`: accepts that waited
    /// for a connection to close.
    capped: metrics::Counter,
    /// Set while the listener waits at its cap, so that reaching it is logged
    /// once, not at every accept.
    at_cap: AtomicBool,
}

/// An accepted connection's place under the cap; dropped with the connection.
pub struct Held {
    _permit: OwnedSemaphorePermit,
    open: metrics::Gauge,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.open.decrement(1.0);
    }
}

impl Inbound {
    /// A listener named `listener` holding at most `max` connections.
    pub fn new(listener: &'static str, max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        metrics::gauge!("phones_gateway_connections_max", "listener" => listener).set(max as f64);
        let open = metrics::gauge!("phones_gateway_connections", "listener" => listener);
        open.set(0.0);
        Inbound {
            listener,
            permits: Arc::new(Semaphore::new(max)),
            open,
            capped: metrics::counter!("phones_gateway_connections_capped_total", "listener" => listener),
            at_cap: AtomicBool::new(false),
        }
    }

    /// The next connection, once one is allowed (waiting while the listener is
    /// at its cap) and `accept` gives one (backing off while it fails for lack
    /// of descriptors or memory). Cancel-safe: dropped while it waits, it holds
    /// nothing and the pending connection stays in the backlog.
    pub async fn accept(&self, listener: &TcpListener) -> (TcpStream, Held) {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.at_cap.store(false, Ordering::Relaxed);
                permit
            }
            Err(_) => {
                self.capped.increment(1);
                if !self.at_cap.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        listener = self.listener,
                        "connection cap reached: new connections wait in the listen backlog"
                    );
                }
                // The semaphore is never closed.
                let Ok(permit) = self.permits.clone().acquire_owned().await else {
                    return std::future::pending().await;
                };
                permit
            }
        };
        let mut delay = FIRST_BACKOFF;
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    self.open.increment(1.0);
                    let held = Held {
                        _permit: permit,
                        open: self.open.clone(),
                    };
                    return (stream, held);
                }
                Err(error) => {
                    let kind = kind_of(&error);
                    metrics::counter!(
                        "phones_gateway_accept_errors_total",
                        "listener" => self.listener,
                        "kind" => kind,
                    )
                    .increment(1);
                    if kind == "aborted" {
                        // That one connection is gone; the next may be fine.
                        tracing::debug!(listener = self.listener, %error, "accept failed");
                        continue;
                    }
                    tracing::warn!(
                        listener = self.listener,
                        %error,
                        kind,
                        retry_in_ms = delay.as_millis() as u64,
                        "accept failed"
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

/// The first wait after a failed `accept`, doubled at each failure in a row.
const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest wait between two `accept`s that fail.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The `kind` label of an accept error: `file_descriptors` (EMFILE, ENFILE),
/// `memory` (ENOMEM, ENOBUFS), `aborted` (the client left before it was
/// accepted), `other`.
fn kind_of(error: &std::io::Error) -> &'static str {
    use rustix::io::Errno;
    let Some(errno) = Errno::from_io_error(error) else {
        return "other";
    };
    if errno == Errno::MFILE || errno == Errno::NFILE {
        "file_descriptors"
    } else if errno == Errno::NOMEM || errno == Errno::NOBUFS {
        "memory"
    } else if errno == Errno::CONNABORTED || errno == Errno::CONNRESET || errno == Errno::PROTO {
        "aborted"
    } else {
        "other"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_derived_cap_is_the_limit_less_the_reserve() {
        let reserve = 100 + ADMIN_MAX_CONNECTIONS + BASE_DESCRIPTORS;
        assert_eq!(
            max_connections(500, Some(10), 100).0,
            500,
            "configured wins"
        );
        assert_eq!(max_connections(0, Some(65_536), 100).0, 65_536 - reserve);
        assert_eq!(
            max_connections(0, Some(u64::MAX), 100).0,
            crate::config::MAX_CONNECTIONS
        );
        assert_eq!(
            max_connections(0, None, 100).0,
            crate::config::MAX_CONNECTIONS
        );
        // Too low a limit for the reserve: half of it.
        assert_eq!(max_connections(0, Some(256), 100).0, 128);
        assert_eq!(max_connections(0, Some(0), 100).0, 1);
    }

    #[test]
    fn accept_errors_are_told_apart() {
        let of = |errno: rustix::io::Errno| kind_of(&std::io::Error::from(errno));
        assert_eq!(of(rustix::io::Errno::MFILE), "file_descriptors");
        assert_eq!(of(rustix::io::Errno::NFILE), "file_descriptors");
        assert_eq!(of(rustix::io::Errno::NOBUFS), "memory");
        assert_eq!(of(rustix::io::Errno::CONNABORTED), "aborted");
        assert_eq!(of(rustix::io::Errno::INVAL), "other");
        assert_eq!(kind_of(&std::io::Error::other("x")), "other");
    }
}
