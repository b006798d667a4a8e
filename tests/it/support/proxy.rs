//! A TCP proxy on 127.0.0.1 that can fall silent: it stops forwarding both
//! ways but keeps every connection open, as a partitioned network or a frozen
//! database host does; resumed, it forwards what was held back. It counts bytes
//! sent, connections open at once, and each sending of a watched text (in front
//! of PostgreSQL, a statement's executions: unnamed statements send their text).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: String,
    silent: watch::Sender<bool>,
    sent: Arc<AtomicU64>,
    stranding: Arc<AtomicBool>,
    connections: Arc<Connections>,
    watched: Watched,
    accepting: tokio::task::JoinHandle<()>,
}

/// Connections through the proxy: open now, and the most open at once.
#[derive(Default)]
struct Connections {
    open: AtomicU64,
    most: AtomicU64,
}

/// Watched texts, each with when it was seen.
type Watched = Arc<Mutex<Vec<Arc<Sightings>>>>;

/// The times a client sent one watched text (see [`Proxy::watch`]).
pub struct Sightings {
    needle: Vec<u8>,
    times: Mutex<Vec<Instant>>,
}

impl Sightings {
    pub fn count(&self) -> usize {
        self.times.lock().unwrap().len()
    }

    /// When it was sent, in order.
    pub fn times(&self) -> Vec<Instant> {
        self.times.lock().unwrap().clone()
    }

    /// How many times it was sent from `start` up to `end`.
    pub fn between(&self, start: Instant, end: Instant) -> usize {
        let times = self.times.lock().unwrap();
        times.iter().filter(|&&t| t >= start && t <= end).count()
    }
}

impl Proxy {
    /// A proxy to `target` (host:port), forwarding.
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (silent, watching) = watch::channel(false);
        let sent = Arc::new(AtomicU64::new(0));
        let stranding = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Connections::default());
        let watched = Watched::default();
        let (target, counter, strands) = (target.to_owned(), sent.clone(), stranding.clone());
        let (counted, watches) = (connections.clone(), watched.clone());
        let accepting = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (target, watching, counter) =
                    (target.clone(), watching.clone(), counter.clone());
                let (counted, watches) = (counted.clone(), watches.clone());
                let stranded = strands.load(Ordering::Relaxed);
                tasks.spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let open = counted.open.fetch_add(1, Ordering::SeqCst) + 1;
                    counted.most.fetch_max(open, Ordering::SeqCst);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let from_client = Upstream {
                        counter,
                        watches,
                        stranded,
                    };
                    tokio::join!(
                        pump(
                            client_read,
                            server_write,
                            watching.clone(),
                            Some(from_client)
                        ),
                        pump(server_read, client_write, watching, None),
                    );
                    counted.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Proxy {
            addr,
            silent,
            sent,
            stranding,
            connections,
            watched,
            accepting,
        }
    }

    /// Connections open through the proxy now (each is one to the server).
    pub fn open(&self) -> u64 {
        self.connections.open.load(Ordering::SeqCst)
    }

    pub fn most_open(&self) -> u64 {
        self.connections.most.load(Ordering::SeqCst)
    }

    /// Restarts [`Proxy::most_open`]'s high-water mark from those open now.
    pub fn reset_most(&self) {
        self.connections.most.store(self.open(), Ordering::SeqCst);
    }

    /// From now on, records each time a client sends `needle` (also split
    /// over two reads); the sightings, which go on growing.
    pub fn watch(&self, needle: &str) -> Arc<Sightings> {
        let sightings = Arc::new(Sightings {
            needle: needle.as_bytes().to_vec(),
            times: Mutex::new(Vec::new()),
        });
        self.watched.lock().unwrap().push(sightings.clone());
        sightings
    }

    /// With `on`, each new PostgreSQL connection passes its set-up and then
    /// nothing, for ever: old connections lost without a word (a failover, a
    /// firewall) while new ones work.
    pub fn strand_after_setup(&self, on: bool) {
        self.stranding.store(on, Ordering::Relaxed);
    }

    /// A proxy to the host and port of `url`, and `url` through it.
    pub async fn in_front_of(url: &str) -> (Proxy, String) {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (user, rest) = match rest.split_once('@') {
            Some((user, rest)) => (format!("{user}@"), rest),
            None => (String::new(), rest),
        };
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let proxy = Proxy::start(host).await;
        let through = format!("{scheme}://{user}{}/{path}", proxy.addr);
        (proxy, through)
    }

    /// Stops forwarding; every connection stays open.
    pub fn silence(&self) {
        self.silent.send_replace(true);
    }

    /// Forwards again, what was held back first.
    pub fn resume(&self) {
        self.silent.send_replace(false);
    }

    /// Bytes forwarded from clients so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// The client-to-server side's work besides copying: counting bytes, looking
/// for watched texts, stranding after set-up.
struct Upstream {
    counter: Arc<AtomicU64>,
    watches: Watched,
    stranded: bool,
}

/// Copies `from` to `to` while not silent; whatever is read during the
/// silence (data, a close, a reset) is held until it ends: a partition
/// delivers no FIN either.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut silent: watch::Receiver<bool>,
    upstream: Option<Upstream>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    // The end of the last read, so a watched text split over two is seen.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        if silent.wait_for(|s| !*s).await.is_err() {
            break;
        }
        let read = from.read(&mut buf).await;
        if let (Some(upstream), Ok(n)) = (&upstream, &read) {
            // After set-up, messages begin with their type; set-up's begin
            // with a length (0) or are the password (`p`).
            if upstream.stranded && *n > 0 && !matches!(buf[0], 0 | b'p') {
                std::future::pending::<()>().await;
            }
            look_for_watched(&upstream.watches, &mut tail, &buf[..*n]);
        }
        if silent.wait_for(|s| !*s).await.is_err() {
            break;
        }
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(upstream) = &upstream {
            upstream.counter.fetch_add(n as u64, Ordering::Relaxed);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Records each watched text that ends in `chunk` (maybe begun in `tail`),
/// then keeps the end of `chunk` as the next `tail`.
fn look_for_watched(watches: &Watched, tail: &mut Vec<u8>, chunk: &[u8]) {
    let watches = watches.lock().unwrap();
    let now = Instant::now();
    let seen: Vec<u8> = tail.iter().chain(chunk).copied().collect();
    let mut keep = 0;
    for watch in watches.iter() {
        let needle = &watch.needle;
        keep = keep.max(needle.len().saturating_sub(1));
        if needle.is_empty() || seen.len() < needle.len() {
            continue;
        }
        let found = seen
            .windows(needle.len())
            .enumerate()
            .filter(|(at, window)| at + needle.len() > tail.len() && *window == &needle[..])
            .count();
        let mut times = watch.times.lock().unwrap();
        times.extend(std::iter::repeat_n(now, found));
    }
    let from = seen.len().saturating_sub(keep);
    *tail = seen[from..].to_vec();
}

/// While silent, a client's close reaches nobody; resumed, both arrive, in
/// order.
#[tokio::test]
async fn a_silent_proxy_holds_a_close_until_it_resumes() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = Proxy::start(&server.local_addr().unwrap().to_string()).await;
    let mut client = TcpStream::connect(&proxy.addr).await.unwrap();
    let (mut accepted, _) = server.accept().await.unwrap();
    proxy.silence();
    client.write_all(b"last words").await.unwrap();
    drop(client);
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        accepted.read(&mut buf),
    )
    .await;
    assert!(early.is_err(), "read through a silent proxy: {early:?}");
    proxy.resume();
    let mut got = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        accepted.read_to_end(&mut got),
    )
    .await
    .expect("the close arrives once resumed")
    .unwrap();
    assert_eq!(got, b"last words");
}

/// A watched text is seen once per sending, also split over two reads;
/// connections are counted open while they are, and the most at once kept.
#[tokio::test]
async fn a_proxy_counts_watched_texts_and_open_connections() {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = Proxy::start(&server.local_addr().unwrap().to_string()).await;
    let seen = proxy.watch("SELECT 42");
    let accepting = tokio::spawn(async move {
        let mut accepted = Vec::new();
        for _ in 0..2 {
            accepted.push(server.accept().await.unwrap().0);
        }
        accepted
    });
    let mut first = TcpStream::connect(&proxy.addr).await.unwrap();
    let second = TcpStream::connect(&proxy.addr).await.unwrap();
    let mut accepted = accepting.await.unwrap();
    first.write_all(b"xx SELECT 42; SELECT 4").await.unwrap();
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 22 {
        got += accepted[0].read(&mut buf).await.unwrap();
    }
    first.write_all(b"2 and SELECT 42").await.unwrap();
    super::eventually(
        "three sightings",
        std::time::Duration::from_secs(5),
        || async { seen.count() == 3 },
    )
    .await;
    assert_eq!(proxy.open(), 2);
    drop((first, second));
    accepted.clear();
    super::eventually("both closed", std::time::Duration::from_secs(5), || async {
        proxy.open() == 0
    })
    .await;
    assert_eq!(proxy.most_open(), 2);
    assert_eq!(seen.count(), 3, "no sighting twice");
}
