//! A TCP proxy on 127.0.0.1 that can fall silent: it stops forwarding in both
//! directions while it keeps every connection open (and accepts new ones), as
//! a network that drops packets does, or a database host that froze. Told to
//! resume, it forwards what was held back. It also counts the bytes it has
//! forwarded from clients, which tells whether a client asked anything.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    /// host:port where clients connect.
    pub addr: String,
    silent: watch::Sender<bool>,
    sent: Arc<AtomicU64>,
    stranding: Arc<AtomicBool>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `target` (host:port), forwarding.
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (silent, watching) = watch::channel(false);
        let sent = Arc::new(AtomicU64::new(0));
        let stranding = Arc::new(AtomicBool::new(false));
        let (target, counter, strands) = (target.to_owned(), sent.clone(), stranding.clone());
        let accepting = tokio::spawn(async move {
            // Dropped with the accept loop: every connection goes with it.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (target, watching, counter) =
                    (target.clone(), watching.clone(), counter.clone());
                let stranded = strands.load(Ordering::Relaxed);
                connections.spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(
                            client_read,
                            server_write,
                            watching.clone(),
                            Some(counter),
                            stranded
                        ),
                        pump(server_read, client_write, watching, None, false),
                    );
                });
            }
        });
        Proxy {
            addr,
            silent,
            sent,
            stranding,
            accepting,
        }
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

/// Copies `from` to `to` while not silent; a chunk read just before the
/// silence is held until it ends, and so is the end of the stream (a close or
/// a reset read while silent): a partition delivers no FIN either, so the
/// other side sees an open, silent connection until the silence ends.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut silent: watch::Receiver<bool>,
    counter: Option<Arc<AtomicU64>>,
    stranded: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if silent.wait_for(|s| !*s).await.is_err() {
            break;
        }
        let read = from.read(&mut buf).await;
        // After the set-up, a client's messages begin with their type (a
        // query, a parse); the set-up's begin with a length (0) or are the
        // password (`p`).
        if stranded && matches!(read, Ok(n) if n > 0 && !matches!(buf[0], 0 | b'p')) {
            std::future::pending::<()>().await;
        }
        // Held while silent, whatever was read: data, an end or an error.
        if silent.wait_for(|s| !*s).await.is_err() {
            break;
        }
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(counter) = &counter {
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
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
