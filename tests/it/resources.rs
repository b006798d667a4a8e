//! The gateway's own resources never decide an answer (docs/rules.md: its own
//! trouble leaves a source undecided): under a low open-files limit, idle
//! clients cannot take the descriptors a lookup's upstream call needs
//! (`server.max_connections`, docs/runbook.md, "Connections at their cap").

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::child::Process;
use crate::support::{Fake, Reply, Upstream, eventually};
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

/// The binary under `RLIMIT_NOFILE` 256 with the cap derived from it; more idle
/// clients than the limit connect. A lookup on a connection opened before, of
/// a tracked seller whose call-tracking number needs a new upstream connection,
/// still answers call tracking (without the cap the accept loop took the last
/// descriptor, the call failed with EMFILE and the real number was shown). Once
/// the idle clients leave, new connections are accepted again.
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
