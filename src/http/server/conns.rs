//! The inbound connection cap, and accepting under it: each listener holds at
//! most so many connections ([`Inbound`]) so idle clients cannot take the
//! descriptor a lookup needs upstream. At the public cap new connections wait in
//! the backlog; at the admin cap the longest idle is closed ([`Room`]) so probes
//! get in. See docs/operations.md, "Connections at the cap". A failing `accept`
//! backs off 10 ms doubling to 1 s.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The admin listener's cap; part of the public cap's reserve.
pub const ADMIN_MAX_CONNECTIONS: usize = 64;

/// The probe listener's cap (`server.probe_addr`), in the public cap's reserve either way.
pub const PROBE_MAX_CONNECTIONS: usize = 16;

/// The listen backlog of the admin and probe listeners (the default is 128):
/// reconnecting callers wait in the kernel, holding no descriptor, instead of
/// having their SYN dropped. Capped by `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 1024;

/// A listener on `addr` with a backlog of [`LISTEN_BACKLOG`].
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As tokio's `TcpListener::bind`: a restart may bind at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Descriptors the process holds besides connections and the calls counted in
/// `Config::outbound_descriptors` (stdio, epoll, listeners, exporter, ...),
/// with room to spare, also for the one connection a [`Room`] holds over its cap.
pub const BASE_DESCRIPTORS: usize = 66;

/// The least derived cap; a limit leaving less past the reserve gives half of it.
const MIN_DERIVED: usize = 64;

/// `server.max_connections` as it applies: `configured` unless 0; else the
/// open-files limit (`None`: unlimited) less the reserve (`outbound`, the
/// listeners' caps, [`BASE_DESCRIPTORS`]); half the limit, with a warning,
/// when that leaves less than 64. Returns the cap and where it came from.
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
        .saturating_add(PROBE_MAX_CONNECTIONS)
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
    listener: &'static str,
    permits: Arc<Semaphore>,
    open: metrics::Gauge,
    capped: metrics::Counter,
    /// Set while waiting at the cap, so that reaching it is logged once.
    at_cap: AtomicBool,
    /// Set on a listener that makes room at its cap (the admin one).
    room: Option<Arc<Room>>,
}

/// What a connection's watchdog (`serve`) and its listener's [`Room`] see.
#[derive(Default)]
pub struct Activity {
    events: AtomicU64,
    /// Requests in service (from their head to their answer).
    busy: AtomicUsize,
    /// Bytes received since the last answer: a request on its way, not idle.
    heard: AtomicBool,
    /// Milliseconds of the room's clock since the last answer (or connect).
    idle_since: AtomicU64,
    /// Set once the room asked it to close (so it is not chosen twice).
    closing: AtomicBool,
    close: Notify,
    room: Option<Arc<Room>>,
}

impl Activity {
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }

    /// Only a listener that makes room tells idle connections apart; the
    /// public one pays a branch per read.
    pub fn heard(&self) {
        if self.room.is_some() && !self.heard.load(Ordering::Relaxed) {
            self.heard.store(true, Ordering::Relaxed);
        }
    }

    pub fn began(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
        self.busy.fetch_add(1, Ordering::Relaxed);
    }

    pub fn answered(&self) {
        self.busy.fetch_sub(1, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::Relaxed);
        if let Some(room) = &self.room {
            self.heard.store(false, Ordering::Relaxed);
            self.idle_since.store(room.now(), Ordering::Relaxed);
            // A new connection waiting at the cap may close this one now.
            room.went_idle.notify_waiters();
        }
    }

    pub async fn asked_to_close(&self) {
        self.close.notified().await;
    }

    fn is_idle(&self) -> bool {
        self.busy.load(Ordering::Relaxed) == 0
            && !self.heard.load(Ordering::Relaxed)
            && !self.closing.load(Ordering::Relaxed)
    }
}

/// The open connections of a listener that makes room at its cap.
pub struct Room {
    /// At most the cap, 64: scanned whole.
    open: Mutex<Vec<Arc<Activity>>>,
    /// What `idle_since` counts from (tokio's clock).
    started: tokio::time::Instant,
    /// Woken when a request is answered (its connection may now be closed).
    went_idle: Notify,
    evicted: metrics::Counter,
}

impl Room {
    fn new(listener: &'static str) -> Arc<Self> {
        Arc::new(Room {
            open: Mutex::new(Vec::new()),
            started: tokio::time::Instant::now(),
            went_idle: Notify::new(),
            evicted: metrics::counter!(
                "phones_gateway_connections_evicted_total",
                "listener" => listener
            ),
        })
    }

    /// A panic while the lock was held left the list as it was (a push or a
    /// remove), so a poisoned lock is used.
    fn open(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Activity>>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A permit: at once if one is free, else by closing the connection idle
    /// longest once idle for [`IDLE_GRACE`], else by waiting for an answer.
    async fn make_room(&self, permits: &Arc<Semaphore>) -> OwnedSemaphorePermit {
        loop {
            // Registered before the connections are looked at, so an answer
            // made in between is not missed.
            let went_idle = self.went_idle.notified();
            tokio::pin!(went_idle);
            went_idle.as_mut().enable();
            if let Ok(permit) = permits.clone().try_acquire_owned() {
                return permit;
            }
            let victim = self
                .open()
                .iter()
                .filter(|activity| activity.is_idle())
                .min_by_key(|activity| activity.idle_since.load(Ordering::Relaxed))
                .cloned();
            let Some(victim) = victim else {
                tokio::select! {
                    permit = acquire(permits) => return permit,
                    () = &mut went_idle => continue,
                }
            };
            let idle_for = self
                .now()
                .saturating_sub(victim.idle_since.load(Ordering::Relaxed));
            let grace = u64::try_from(IDLE_GRACE.as_millis()).unwrap_or(u64::MAX);
            if idle_for < grace {
                tokio::select! {
                    permit = acquire(permits) => return permit,
                    () = &mut went_idle => {}
                    () = tokio::time::sleep(Duration::from_millis(grace - idle_for)) => {}
                }
                continue;
            }
            victim.closing.store(true, Ordering::Relaxed);
            victim.close.notify_one();
            self.evicted.increment(1);
            // Closed at once when idle; one whose next request arrived just
            // now finishes it first.
            return acquire(permits).await;
        }
    }
}

/// How long a connection must have been idle before it may be closed to make
/// room: a new connection (a probe's) gets that long to send its head.
pub const IDLE_GRACE: Duration = Duration::from_millis(250);

async fn acquire(permits: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    match permits.clone().acquire_owned().await {
        Ok(permit) => permit,
        // The semaphore is never closed.
        Err(_) => std::future::pending().await,
    }
}

/// An accepted connection's place under the cap; dropped with the connection.
pub struct Held {
    _permit: OwnedSemaphorePermit,
    open: metrics::Gauge,
    activity: Arc<Activity>,
}

impl Held {
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.open.decrement(1.0);
        if let Some(room) = &self.activity.room {
            room.open()
                .retain(|activity| !Arc::ptr_eq(activity, &self.activity));
        }
    }
}

impl Inbound {
    pub fn new(listener: &'static str, max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        metrics::gauge!("phones_gateway_connections_max", "listener" => listener).set(max as f64);
        let open = metrics::gauge!("phones_gateway_connections", "listener" => listener);
        open.set(0.0);
        // Each kind's series from the start, at 0: an alert reads them, and a
        // series first seen at 1 shows in no rate.
        for kind in ACCEPT_ERROR_KINDS {
            metrics::counter!("phones_gateway_accept_errors_total", "listener" => listener, "kind" => kind)
                .increment(0);
        }
        Inbound {
            listener,
            permits: Arc::new(Semaphore::new(max)),
            open,
            capped: metrics::counter!("phones_gateway_connections_capped_total", "listener" => listener),
            at_cap: AtomicBool::new(false),
            room: None,
        }
    }

    /// As [`Inbound::new`], but at the cap the idle longest is closed for room.
    pub fn making_room(listener: &'static str, max: usize) -> Self {
        Inbound {
            room: Some(Room::new(listener)),
            ..Inbound::new(listener, max)
        }
    }

    /// The next connection and its peer, once the cap allows one ([`Room`]).
    /// Cancel-safe: dropped while it waits, it holds no place.
    pub async fn accept(&self, listener: &TcpListener) -> (TcpStream, SocketAddr, Held) {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            self.at_cap.store(false, Ordering::Relaxed);
            let (stream, peer) = self.accept_stream(listener).await;
            return (stream, peer, self.held(permit));
        }
        self.capped.increment(1);
        match &self.room {
            None => {
                if !self.at_cap.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        listener = self.listener,
                        "connection cap reached: new connections wait in the listen backlog"
                    );
                }
                let permit = acquire(&self.permits).await;
                let (stream, peer) = self.accept_stream(listener).await;
                (stream, peer, self.held(permit))
            }
            Some(room) => {
                if !self.at_cap.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        listener = self.listener,
                        "connection cap reached: the connection idle longest is closed for each new one"
                    );
                }
                // Only a connection that is there makes room.
                let (stream, peer) = self.accept_stream(listener).await;
                let permit = room.make_room(&self.permits).await;
                (stream, peer, self.held(permit))
            }
        }
    }

    fn held(&self, permit: OwnedSemaphorePermit) -> Held {
        self.open.increment(1.0);
        let activity = Arc::new(Activity {
            room: self.room.clone(),
            ..Activity::default()
        });
        if let Some(room) = &self.room {
            activity.idle_since.store(room.now(), Ordering::Relaxed);
            room.open().push(activity.clone());
        }
        Held {
            _permit: permit,
            open: self.open.clone(),
            activity,
        }
    }

    async fn accept_stream(&self, listener: &TcpListener) -> (TcpStream, SocketAddr) {
        let mut delay = FIRST_BACKOFF;
        loop {
            match listener.accept().await {
                Ok(accepted) => return accepted,
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

const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

const ACCEPT_ERROR_KINDS: [&str; 4] = ["file_descriptors", "memory", "aborted", "other"];

/// The `kind` label of an accept error; `aborted`: the client left first.
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
        let reserve = 100 + ADMIN_MAX_CONNECTIONS + PROBE_MAX_CONNECTIONS + BASE_DESCRIPTORS;
        let (cap, most) = (
            |c, limit| max_connections(c, limit, 100).0,
            crate::config::MAX_CONNECTIONS,
        );
        assert_eq!(cap(500, Some(10)), 500, "configured wins");
        assert_eq!(cap(0, Some(65_536)), 65_536 - reserve);
        assert_eq!(cap(0, Some(u64::MAX)), most);
        assert_eq!(cap(0, None), most);
        assert_eq!(cap(0, Some(256)), 128);
        assert_eq!(cap(0, Some(0)), 1);
    }

    /// The room closes the connection idle longest once idle for the grace, never
    /// one whose head is on its way or in service; all busy, it waits for an answer.
    #[tokio::test(start_paused = true)]
    async fn the_room_closes_the_connection_idle_longest_and_only_an_idle_one() {
        let room = Room::new("test");
        let connection = || {
            let activity = Arc::new(Activity {
                room: Some(room.clone()),
                ..Activity::default()
            });
            activity.idle_since.store(room.now(), Ordering::Relaxed);
            room.open().push(activity.clone());
            activity
        };
        let step = Duration::from_millis(10);
        let serving = connection();
        tokio::time::advance(step).await;
        let heard = connection();
        tokio::time::advance(step).await;
        let older = connection();
        tokio::time::advance(step).await;
        let newer = connection();
        tokio::time::advance(step).await;
        serving.began();
        heard.heard();
        // `older` answered a request after `newer` connected: `newer` is now
        // the one idle longest.
        older.began();
        older.answered();
        let permits = Arc::new(Semaphore::new(1));
        let place = permits.clone().try_acquire_owned().unwrap();
        let made = tokio::spawn({
            let (room, permits) = (room.clone(), permits.clone());
            async move { room.make_room(&permits).await }
        });
        newer.asked_to_close().await;
        let idle_for = room.now() - newer.idle_since.load(Ordering::Relaxed);
        let grace = IDLE_GRACE.as_millis() as u64;
        assert!(idle_for >= grace, "closed after {idle_for} ms idle");
        for other in [&serving, &heard, &older] {
            assert!(!other.closing.load(Ordering::Relaxed));
        }
        drop(place);
        drop(made.await.unwrap());

        let busy_room = Room::new("test");
        let only = Arc::new(Activity {
            room: Some(busy_room.clone()),
            ..Activity::default()
        });
        busy_room.open().push(only.clone());
        only.began();
        let permits = Arc::new(Semaphore::new(0));
        let made = tokio::spawn({
            let (room, permits) = (busy_room.clone(), permits.clone());
            async move { room.make_room(&permits).await }
        });
        tokio::time::sleep(IDLE_GRACE * 4).await;
        assert!(!only.closing.load(Ordering::Relaxed), "busy: not closed");
        only.answered();
        only.asked_to_close().await;
        permits.add_permits(1);
        drop(made.await.unwrap());
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
        for kind in ["file_descriptors", "memory", "aborted", "other"] {
            assert!(ACCEPT_ERROR_KINDS.contains(&kind), "{kind}");
        }
    }
}
