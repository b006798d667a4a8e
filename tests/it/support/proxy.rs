//! A TCP proxy on 127.0.0.1 that can fall silent: it stops forwarding in both
//! directions while it keeps every connection open (and accepts new ones), as
//! a network that drops packets does, or a database host that froze. Told to
//! resume, it forwards what was held back. It also counts the bytes it has
//! forwarded from clients, which tells whether a client asked anything; the
//! connections open through it at once (now, and the most so far), which is
//! what its one client costs the server in connections; and, for any text a
//! test asks it to watch for, each time a client sent it: in front of
//! PostgreSQL that counts one statement's executions exactly, since the
//! gateway's statements are unnamed and each execution sends its text once
//! (a `Parse`, or a simple `Query`), in the clear (no TLS on 127.0.0.1).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    /// host:port where clients connect.
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

/// What the test watches for in what clients send, each with when it was seen.
type Watched = Arc<Mutex<Vec<Arc<Sightings>>>>;

/// The times a client sent one watched text (see [`Proxy::watch`]).
pub struct Sightings {
    needle: Vec<u8>,
    times: Mutex<Vec<Instant>>,
}

impl Sightings {
    /// How many times it was sent so far.
    pub fn count(&self) -> usize {
        self.times.lock().unwrap().len()
    }

    /// When it was sent (read by the proxy), in order.
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
            // Dropped with the accept loop: every connection goes with it.
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

    /// The most connections that were open through the proxy at once, since
    /// it started.
    pub fn most_open(&self) -> u64 {
        self.connections.most.load(Ordering::SeqCst)
    }

    /// Starts the high-water mark of [`Proxy::most_open`] again from the
    /// connections open now (start-up's own connections left out).
    pub fn reset_most(&self) {
        self.connections.most.store(self.open(), Ordering::SeqCst);
    }

    /// From now on, records each time a client sends `needle` (also split
    /// over two reads); the sightings so far, which go on growing.
    pub fn watch(&self, needle: &str) -> Arc<Sightings> {
        let sightings = Arc::new(Sightings {
            needle: needle.as_bytes().to_vec(),
            times: Mutex::new(Vec::new()),
        });
        self.watched.lock().unwrap().push(sightings.clone());
        sightings
    }

    /// With `on`, each new PostgreSQL connection passes its set-up (SSL
    /// request, startup, password) and then nothing, for ever, also after
    /// this is turned off: a database whose old connections were lost
    /// without a word (its host failed over, a firewall forgot them) while
    /// new ones work.
    pub fn strand_after_setup(&self, on: bool) {
        self.stranding.store(on, Ordering::Relaxed);
    }

    /// A proxy to the host and port of `url` (`scheme://[user@]host:port/...`),
    /// and `url` through it.
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

/// What the client-to-server side of a connection does besides copying: it
/// counts the bytes, looks for the watched texts, and may strand the
/// connection after its set-up.
struct Upstream {
    counter: Arc<AtomicU64>,
    watches: Watched,
    stranded: bool,
}

/// Copies `from` to `to` while not silent; a chunk read just before the
/// silence is held until it ends, and so is the end of the stream (a close or
/// a reset read while silent): a partition delivers no FIN either, so the
/// other side sees an open, silent connection until the silence ends.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut silent: watch::Receiver<bool>,
    upstream: Option<Upstream>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    // The end of what was read before, so that a watched text split over two
    // reads is seen (once) in the second.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        if silent.wait_for(|s| !*s).await.is_err() {
            break;
        }
        let read = from.read(&mut buf).await;
        if let (Some(upstream), Ok(n)) = (&upstream, &read) {
            // After the set-up, a client's messages begin with their type (a
            // query, a parse); the set-up's begin with a length (0) or are
            // the password (`p`).
            if upstream.stranded && *n > 0 && !matches!(buf[0], 0 | b'p') {
                std::future::pending::<()>().await;
            }
            look_for_watched(&upstream.watches, &mut tail, &buf[..*n]);
        }
        // Held while silent, whatever was read: data, an end or an error.
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

/// Records each watched text that ends in `chunk` (it may begin in `tail`,
/// the end of the connection's previous reads), then keeps the end of
/// `chunk` as the next `tail`.
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
            // Those that end in this chunk: the others were counted before.
            .filter(|(at, window)| at + needle.len() > tail.len() && *window == &needle[..])
            .count();
        let mut times = watch.times.lock().unwrap();
        times.extend(std::iter::repeat_n(now, found));
    }
    let from = seen.len().saturating_sub(keep);
    *tail = seen[from..].to_vec();
}

/// The proxy's own claim: while silent, a client's close reaches nobody (the
/// server reads neither bytes nor an end); once resumed, both arrive, in order.
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

/// The proxy's own counts: a watched text is seen once per time it is sent,
/// also when a send splits it over two reads; connections are counted open
/// while they are, and the most at once is kept.
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
