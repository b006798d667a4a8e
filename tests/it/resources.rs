//! The gateway's own resources never decide an answer (docs/rules.md): neither
//! descriptors (`server.max_connections`), the admin listener's connections,
//! upload memory (`server.max_body_buffer_bytes` and its per-client share), nor
//! probes (`server.probe_addr`); no transparent huge pages (`runtime::no_huge_pages`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::child::Process;
use crate::support::paths::{BATCH, HEALTHZ, METRICS, READYZ, status_path};
use crate::support::{Fake, Reply, TOKEN, Upstream, eventually};
use crate::{PLAIN_CATEGORY, REAL, VIRTUAL};

/// The binary's `RLIMIT_NOFILE`, soft and hard.
const LIMIT: usize = 256;

/// One request on an open keep-alive connection: the status and the body.
async fn ask(stream: &mut TcpStream, path: &str) -> (u16, Value) {
    let head = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&chunk[..n]);
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let length: usize = head
                .split("\r\n")
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + length {
                let status = head[9..12].parse().unwrap();
                let body =
                    serde_json::from_slice(&got[end + 4..end + 4 + length]).unwrap_or(Value::Null);
                return (status, body);
            }
        }
    })
    .await;
    read.expect("an answer within 10 s")
}

/// Descriptors the process holds now.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

fn lookup(user: u64) -> String {
    format!(
        "/v1/public-phone?user_id={user}&ad_id=1&category_id={PLAIN_CATEGORY}&phone=%2B79161234567"
    )
}

/// A metric's value for the public listener in a /metrics text.
fn public_value(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{listener=\"public\"}} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// More idle clients than `RLIMIT_NOFILE`: a lookup needing a new upstream
/// connection still answers call tracking (uncapped, the accept loop took the
/// last descriptor and the real number was shown); later connections are taken.
#[tokio::test]
async fn idle_clients_cannot_take_the_descriptors_a_lookup_needs() {
    assert!(
        std::process::Command::new("prlimit")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "this test needs util-linux prlimit"
    );
    let real = Fake::start(Upstream::RealPhone).await;
    real.reply(Reply::Phone(REAL));
    let anonymous = Fake::start(Upstream::Anonymous).await;
    let calltracking = Fake::start(Upstream::Calltracking).await;
    calltracking.reply(Reply::Phone(VIRTUAL));
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let nofile = format!("--nofile={LIMIT}:{LIMIT}");
    let process = Process::start_under(
        &["prlimit", &nofile],
        &url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
            ("UPSTREAMS__ANONYMOUS__BASE_URL", &anonymous.url),
            ("UPSTREAMS__CALLTRACKING__BASE_URL", &calltracking.url),
            ("SERVER__MAX_IN_FLIGHT", "8"),
            ("DATABASE__MAX_CONNECTIONS", "2"),
            // Idle clients stay connected for the whole test.
            ("SERVER__HEADER_READ_TIMEOUT_MS", "600000"),
        ],
    )
    .await;
    let items = json!({"items": [
        {"user_id": 7, "enabled": true, "version": 1},
        {"user_id": 8, "enabled": true, "version": 1},
    ]});
    assert_eq!(process.send(reqwest::Method::POST, items).await, 200);
    let public = process.public.trim_start_matches("http://").to_owned();

    // Opened and used (on no upstream) before the idle clients come.
    let mut before = TcpStream::connect(&public).await.unwrap();
    assert_eq!(ask(&mut before, "/nowhere").await.0, 404);
    assert_eq!(
        calltracking.calls(),
        0,
        "no upstream connection is pooled yet"
    );

    let mut idle = Vec::new();
    // Until the listen backlog is full too (a connect then waits for a SYN
    // retry: given up on at once), or more clients than the limit.
    let mut refused = 0;
    while idle.len() < LIMIT + 64 && refused < 3 {
        let connect = TcpStream::connect(&public);
        match tokio::time::timeout(Duration::from_millis(300), connect).await {
            Ok(Ok(stream)) => idle.push(stream),
            _ => refused += 1,
        }
    }
    // The process has accepted all it will: its descriptors stop changing.
    let pid = process.child.id();
    let (mut last, mut steady) = (descriptors(pid), 0);
    eventually(
        "the process's descriptors to settle",
        Duration::from_secs(20),
        || {
            let now = descriptors(pid);
            steady = if now == last { steady + 1 } else { 0 };
            last = now;
            let settled = steady >= 30;
            async move { settled }
        },
    )
    .await;
    eprintln!(
        "descriptors held with {} idle clients: {last} of {LIMIT}",
        idle.len()
    );

    let (status, body) = ask(&mut before, &lookup(7)).await;
    assert_ne!(
        body["kind"], "real",
        "the real number shown: {status} {body}"
    );
    assert_eq!(
        (status, &body["kind"]),
        (200, &json!("calltracking")),
        "the reserve left the call a descriptor: {body}"
    );
    let metrics = process.get_admin("/metrics").await.text;
    let open = public_value(&metrics, "phones_gateway_connections");
    let max = public_value(&metrics, "phones_gateway_connections_max");
    assert!(max.is_some_and(|m| m < LIMIT as f64), "{max:?}");
    assert_eq!(open, max, "the public listener is at its cap");
    assert!(
        !process
            .child
            .lines_so_far()
            .iter()
            .any(|l| l.contains("accept failed")),
        "accept never ran out of descriptors"
    );

    drop(idle);
    let ask_anew = || async {
        let Ok(mut fresh) = TcpStream::connect(&public).await else {
            return false;
        };
        let (status, body) = ask(&mut fresh, &lookup(8)).await;
        assert_ne!(body["kind"], "real", "{status} {body}");
        status == 200 && body["kind"] == "calltracking"
    };
    eventually(
        "a new connection to be answered",
        Duration::from_secs(20),
        ask_anew,
    )
    .await;
}

/// One answer read from `reader`: its status, its head (lowercased) and its
/// body; `None` when the connection closes or fails first.
async fn answer_of<R: AsyncRead + Unpin>(reader: &mut R) -> Option<(u16, String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = reader.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&chunk[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        let length: usize = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap_or(0));
        if got.len() >= end + 4 + length {
            let status = head.get(9..12)?.parse().ok()?;
            return Some((status, head, got[end + 4..end + 4 + length].to_vec()));
        }
    }
}

/// A GET of `path` on a new connection to `addr`, with these extra header
/// lines; `None` without an answer within 10 s.
async fn fresh_get(addr: &str, path: &str, extra: &str) -> Option<(u16, String, Vec<u8>)> {
    let ask = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let head = format!("GET {path} HTTP/1.1\r\nhost: x\r\n{extra}\r\n");
        stream.write_all(head.as_bytes()).await.ok()?;
        answer_of(&mut stream).await
    };
    tokio::time::timeout(Duration::from_secs(10), ask)
        .await
        .ok()
        .flatten()
}

/// A caller without a token sending request after request (each a 401),
/// reconnecting when closed; counts its answers in `answered`.
async fn knock(addr: String, answered: Arc<AtomicUsize>) {
    let head = format!("GET {} HTTP/1.1\r\nhost: x\r\n\r\n", status_path(1));
    loop {
        let Ok(mut stream) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while stream.write_all(head.as_bytes()).await.is_ok() {
            match answer_of(&mut stream).await {
                Some((401, _, _)) => answered.fetch_add(1, Ordering::Relaxed),
                _ => break,
            };
        }
    }
}

/// A caller without a token that connects and sends nothing; connects again
/// when its connection is closed. Counts its connects in `connected`.
async fn sit(addr: String, connected: Arc<AtomicUsize>) {
    loop {
        let Ok(mut stream) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        connected.fetch_add(1, Ordering::Relaxed);
        let mut byte = [0u8; 1];
        let _ = stream.read(&mut byte).await;
    }
}

/// Tasks aborted when dropped (also when the test fails).
struct Aborting(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Aborting {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The value of a metric line starting with `prefix` (name and labels).
fn metric(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// docs/api.md, "Operations": while callers without a token hold the admin
/// listener past its cap, the probes answer, and so does a caller with the
/// token, even one whose request head is still on its way all that time.
#[tokio::test]
async fn probes_answer_while_callers_without_a_token_hold_the_admin_listener() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let process = Process::start_with(&url, &[("SERVER__HEADER_READ_TIMEOUT_MS", "600000")]).await;
    let admin = process.admin.trim_start_matches("http://").to_owned();
    let (answered, connected) = (Arc::default(), Arc::default());
    let mut callers = Aborting(Vec::new());
    for _ in 0..64 {
        callers
            .0
            .push(tokio::spawn(knock(admin.clone(), Arc::clone(&answered))));
    }
    eventually(
        "the knocking callers to be answered",
        Duration::from_secs(20),
        || {
            let n = answered.load(Ordering::Relaxed);
            async move { n >= 64 }
        },
    )
    .await;
    for _ in 0..96 {
        callers
            .0
            .push(tokio::spawn(sit(admin.clone(), Arc::clone(&connected))));
    }
    eventually(
        "the silent callers to connect",
        Duration::from_secs(20),
        || {
            let n = connected.load(Ordering::Relaxed);
            async move { n >= 96 }
        },
    )
    .await;

    let bearer = format!("authorization: Bearer {TOKEN}\r\n");
    let mut slow = None;
    for round in 0..3 {
        if round == 1 {
            // A caller with the token whose head stays on its way through the
            // next rounds.
            let mut stream = TcpStream::connect(&admin).await.unwrap();
            let half = format!("GET {} HTTP/1.1\r\nhost: x\r\n", status_path(42));
            stream.write_all(half.as_bytes()).await.unwrap();
            slow = Some(stream);
        }
        for (path, extra) in [
            (HEALTHZ, ""),
            (READYZ, ""),
            (METRICS, ""),
            (status_path(42).as_str(), bearer.as_str()),
        ] {
            let got = fresh_get(&admin, path, extra).await;
            assert_eq!(
                got.as_ref().map(|(status, _, _)| *status),
                Some(200),
                "round {round}, GET {path}: no 200 within 10 s (None: no answer, or its \
                 connection closed) while callers without a token hold the admin listener"
            );
        }
    }
    // A 401 closes its connection: one answer per connection without a token.
    let (status, head, _) = fresh_get(&admin, &status_path(1), "").await.unwrap();
    assert_eq!(status, 401);
    assert!(head.contains("\r\nconnection: close"), "{head}");
    let metrics = fresh_get(&admin, METRICS, "").await.unwrap().2;
    let metrics = String::from_utf8_lossy(&metrics);
    let evicted = metric(
        &metrics,
        "phones_gateway_connections_evicted_total{listener=\"admin\"} ",
    );
    assert!(evicted.is_some_and(|n| n > 0.0), "{evicted:?}");

    let mut slow = slow.unwrap();
    slow.write_all(format!("{bearer}\r\n").as_bytes())
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), answer_of(&mut slow)).await;
    assert_eq!(
        answer.ok().flatten().map(|(status, _, _)| status),
        Some(200),
        "a connection with a request head on its way was closed to make room"
    );
}

/// A caller without a token that connects, sends one request, reads its 401
/// to the connection's close and connects again at once; counts its answers.
async fn reconnect(addr: String, answered: Arc<AtomicUsize>) {
    let head = format!("GET {} HTTP/1.1\r\nhost: x\r\n\r\n", status_path(1));
    loop {
        let Ok(mut stream) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if stream.write_all(head.as_bytes()).await.is_ok()
            && matches!(answer_of(&mut stream).await, Some((401, _, _)))
        {
            answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// docs/operations.md, "Probes under a reconnect storm": on `server.probe_addr`
/// every probe is answered 200 promptly while callers storm the admin listener,
/// a caller with the token still is, and an admin path is a 404 there.
#[tokio::test]
async fn probes_on_their_own_listener_answer_while_callers_storm_the_admin_one() {
    const CALLERS: usize = 600;
    const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let process = Process::start_with(&url, &[("SERVER__PROBE_ADDR", "127.0.0.1:0")]).await;
    let admin = process.admin.trim_start_matches("http://").to_owned();
    let probe = process
        .probe
        .as_deref()
        .expect("the probe listener's address is logged")
        .trim_start_matches("http://")
        .to_owned();
    let answered = Arc::new(AtomicUsize::new(0));
    let callers = Aborting(
        (0..CALLERS)
            .map(|_| tokio::spawn(reconnect(admin.clone(), Arc::clone(&answered))))
            .collect(),
    );
    eventually(
        "the callers to be answered 401",
        Duration::from_secs(20),
        || {
            let n = answered.load(Ordering::Relaxed);
            async move { n >= CALLERS }
        },
    )
    .await;
    let before = answered.load(Ordering::Relaxed);
    let bearer = format!("authorization: Bearer {TOKEN}\r\n");
    let holder = {
        let (admin, bearer) = (admin.clone(), bearer.clone());
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for id in 0..10 {
                let got = fresh_get(&admin, &status_path(id), &bearer).await;
                statuses.push(got.map(|(status, _, _)| status));
            }
            statuses
        })
    };
    // The prober has a thread of its own, as a kubelet is a process of its
    // own: on the test's thread its waits would include the callers' turns.
    let prober = std::thread::spawn({
        let probe = probe.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let (mut statuses, mut waits) = (Vec::new(), Vec::new());
                for _ in 0..10 {
                    for path in [HEALTHZ, READYZ, METRICS] {
                        let asked = Instant::now();
                        let ask = fresh_get(&probe, path, "");
                        let got = tokio::time::timeout(PROBE_TIMEOUT, ask).await;
                        waits.push(asked.elapsed());
                        statuses.push((path, got.ok().flatten().map(|(status, _, _)| status)));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (statuses, waits)
            })
        }
    });
    let (statuses, mut waits) = tokio::task::spawn_blocking(move || prober.join().unwrap())
        .await
        .unwrap();
    let held = holder.await.unwrap();
    let during = answered.load(Ordering::Relaxed) - before;
    let unanswered: Vec<_> = statuses
        .iter()
        .filter(|(_, status)| *status != Some(200))
        .collect();
    assert!(
        unanswered.is_empty(),
        "probes not answered 200 within {PROBE_TIMEOUT:?} while {CALLERS} callers storm \
         the admin listener: {unanswered:?}"
    );
    waits.sort();
    let (median, worst) = (waits[waits.len() / 2], waits[waits.len() - 1]);
    eprintln!("probe waits: median {median:?}, worst {worst:?}");
    assert!(
        median <= Duration::from_millis(100) && worst <= Duration::from_millis(500),
        "the probes waited {median:?} at the median, {worst:?} at worst (all: {waits:?})"
    );
    assert!(
        held.iter().all(|status| status.is_some()),
        "the token holder lost a request during the storm: {held:?}"
    );
    assert!(
        during >= CALLERS,
        "the storm went on while the probes were asked ({during} 401s)"
    );
    drop(callers);
    for extra in ["", bearer.as_str()] {
        let got = fresh_get(&probe, &status_path(42), extra).await;
        assert_eq!(
            got.map(|(status, _, _)| status),
            Some(404),
            "the admin API is not on the probe listener"
        );
    }
}

/// `/proc/<pid>/status`'s `field` (`VmRSS`, `VmHWM`), in bytes.
fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// One batch upload that declares 1 MiB (`server.max_body_bytes`), sends
/// `sent` bytes of it and never the rest; its answer, if one comes within 60 s.
async fn unfinished_upload(addr: String, sent: usize) -> Option<(u16, String, Vec<u8>)> {
    let stream = TcpStream::connect(&addr).await.ok()?;
    let (mut read, mut write) = stream.into_split();
    let answer = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(60), answer_of(&mut read))
            .await
            .ok()
            .flatten()
    });
    let head = format!(
        "POST {BATCH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        1 << 20
    );
    let piece = vec![b' '; 64 * 1024];
    if write.write_all(head.as_bytes()).await.is_ok() {
        let mut left = sent;
        while left > 0 {
            let n = left.min(piece.len());
            if write.write_all(&piece[..n]).await.is_err() {
                break;
            }
            left -= n;
        }
    }
    let answer = answer.await.ok().flatten();
    // Open until the answer: closing would end the body early.
    drop(write);
    answer
}

/// `server.max_body_buffer_bytes`: unfinished uploads past it are refused 503
/// with `Retry-After` as their bytes arrive, memory stays bounded, and all
/// answered the buffer is empty (the per-client share is the whole buffer here).
#[tokio::test]
async fn unfinished_uploads_cannot_take_the_process_s_memory() {
    const UPLOADS: usize = 200;
    const SENT: usize = 960 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let process = Process::start_with(
        &url,
        &[("SERVER__MAX_BODY_BUFFER_PER_CLIENT_BYTES", "67108864")],
    )
    .await;
    let public = process.public.trim_start_matches("http://").to_owned();
    let pid = process.child.id();
    let before = memory_of(pid, "VmRSS");

    let uploads: Vec<_> = (0..UPLOADS)
        .map(|_| tokio::spawn(unfinished_upload(public.clone(), SENT)))
        .collect();
    let mut answers = Vec::new();
    for upload in uploads {
        answers.push(upload.await.unwrap());
    }
    let peak = memory_of(pid, "VmHWM").saturating_sub(before);
    let mut tally = std::collections::BTreeMap::<Option<u16>, usize>::new();
    for answer in &answers {
        *tally.entry(answer.as_ref().map(|a| a.0)).or_default() += 1;
    }
    eprintln!(
        "{UPLOADS} unfinished uploads of {SENT} bytes: answers {tally:?}, peak memory \
         {} MiB over the {} MiB before",
        peak >> 20,
        before >> 20
    );
    let refused: Vec<_> = answers
        .iter()
        .flatten()
        .filter(|(status, _, _)| *status == 503)
        .collect();
    assert!(
        !refused.is_empty(),
        "no unfinished upload was refused (answers by status: {tally:?})"
    );
    for (_, head, body) in &refused {
        assert!(head.contains("\r\nretry-after:"), "{head}");
        assert!(
            head.contains("\r\ncontent-type: application/problem+json"),
            "{head}"
        );
        let problem: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(problem["status"], 503, "{problem}");
    }
    assert_eq!(
        tally.keys().copied().collect::<Vec<_>>(),
        [Some(408), Some(503)],
        "every upload answered, refused or timed out: {tally:?}"
    );
    // Well under the 190 MiB the uploads sent: the 48 MiB the public listener
    // may hold, and room for the allocator and the connections.
    assert!(peak < 112 << 20, "peak memory grew by {} MiB", peak >> 20);
    let metrics = process.get_admin(METRICS).await.text;
    assert_eq!(
        metric(
            &metrics,
            "phones_gateway_shed_total{reason=\"body_buffer\"} "
        ),
        Some(refused.len() as f64),
        "each refusal counted"
    );
    assert_eq!(
        metric(&metrics, "phones_gateway_body_buffer_bytes "),
        Some(0.0),
        "every request's bytes released"
    );
}

/// A connection to `addr` from `from` (any port): `127.0.0.2` is another
/// client of a listener on `127.0.0.1` (the loopback range is the host's).
async fn connect_from(from: [u8; 4], addr: &str) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((std::net::Ipv4Addr::from(from), 0).into())?;
    socket.connect(addr.parse().expect("an address")).await
}

/// `phones_gateway_body_buffer_bytes` now.
async fn body_buffer_bytes(process: &Process) -> f64 {
    let metrics = process.get_admin(METRICS).await.text;
    metric(&metrics, "phones_gateway_body_buffer_bytes ").unwrap_or(f64::NAN)
}

/// One client filling its share of the body buffer
/// (`server.max_body_buffer_per_client_bytes`, refused past it with a 503 and
/// `Retry-After`) leaves room for another client's batches, all answered 200.
#[tokio::test]
async fn one_client_holding_all_it_can_of_the_body_buffer_leaves_room_for_others() {
    let real = Fake::start(Upstream::RealPhone).await;
    real.reply(Reply::Phone(REAL));
    let anonymous = Fake::start(Upstream::Anonymous).await;
    let calltracking = Fake::start(Upstream::Calltracking).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let process = Process::start_with(
        &url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
            ("UPSTREAMS__ANONYMOUS__BASE_URL", &anonymous.url),
            ("UPSTREAMS__CALLTRACKING__BASE_URL", &calltracking.url),
            // The held uploads stay open for the whole test, however slow
            // the runner.
            ("SERVER__BODY_READ_TIMEOUT_MS", "120000"),
        ],
    )
    .await;
    let public = process.public.trim_start_matches("http://").to_owned();

    let mut held = Vec::new();
    let mut refusals = Vec::new();
    let mut piece = 960 * 1024;
    let mut expected = body_buffer_bytes(&process).await;
    let zeros = vec![b' '; 960 * 1024];
    while piece >= 1024 {
        let stream = connect_from([127, 0, 0, 2], &public).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        let answer = tokio::spawn(async move { answer_of(&mut read).await });
        let head = format!(
            "POST {BATCH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n",
            1 << 20
        );
        let _ = write.write_all(head.as_bytes()).await;
        let _ = write.write_all(&zeros[..piece]).await;
        // Taken (the buffer holds it) or refused (answered): one of the two.
        let taken = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if answer.is_finished() {
                    return false;
                }
                if body_buffer_bytes(&process).await >= expected + piece as f64 {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .expect("a piece taken or refused within 10 s");
        if taken {
            expected += piece as f64;
            held.push((write, answer));
        } else {
            refusals.push(answer.await.unwrap());
            piece /= 2;
            eventually(
                "a refused upload's bytes to be released",
                Duration::from_secs(10),
                || {
                    let process = &process;
                    async move { body_buffer_bytes(process).await <= expected }
                },
            )
            .await;
        }
    }
    let holding = body_buffer_bytes(&process).await;
    eprintln!(
        "one client holds {} KiB in {} uploads, {} refused",
        holding as u64 >> 10,
        held.len(),
        refusals.len()
    );

    let items: Vec<Value> = (1..=100)
        .map(|ad| json!({"user_id": 7, "ad_id": ad, "category_id": PLAIN_CATEGORY, "phone": REAL}))
        .collect();
    let body = json!({ "items": items }).to_string();
    let batches: Vec<_> = (0..17)
        .map(|_| {
            let (public, body) = (public.clone(), body.clone());
            tokio::spawn(async move {
                let mut stream = connect_from([127, 0, 0, 1], &public).await.ok()?;
                let request = format!(
                    "POST {BATCH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(request.as_bytes()).await.ok()?;
                tokio::time::timeout(Duration::from_secs(10), answer_of(&mut stream))
                    .await
                    .ok()
                    .flatten()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for batch in batches {
        statuses.push(batch.await.unwrap().map(|(status, _, _)| status));
    }
    assert_eq!(
        statuses,
        vec![Some(200); 17],
        "another client's batches while one holds {} KiB of bodies",
        holding as u64 >> 10
    );

    assert!(
        holding <= f64::from(8 << 20),
        "one client holds {holding} bytes, past its share"
    );
    assert!(!refusals.is_empty());
    for refusal in &refusals {
        let (status, head, body) = refusal.as_ref().expect("a refusal is answered");
        assert_eq!(*status, 503, "{head}");
        assert!(head.contains("\r\nretry-after:"), "{head}");
        assert!(
            head.contains("\r\ncontent-type: application/problem+json"),
            "{head}"
        );
        let problem: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(problem["status"], 503, "{problem}");
    }
    let metrics = process.get_admin(METRICS).await.text;
    assert!(
        metric(
            &metrics,
            "phones_gateway_shed_total{reason=\"body_share\"} "
        )
        .is_some_and(|n| n >= 1.0),
        "refusals past a client's share counted"
    );
    drop(held);
}

/// The serving process has transparent huge pages off, whatever the host's
/// setting: they rounded its memory up in 2 MiB steps as it aged
/// (docs/reveal-log.md, "Memory").
#[tokio::test]
async fn the_process_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let process = Process::start(&url).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", process.child.id())).unwrap();
    let thp = status
        .lines()
        .find_map(|line| line.strip_prefix("THP_enabled:"))
        .map(str::trim);
    assert_eq!(thp, Some("0"), "THP_enabled of the serving process");
}
