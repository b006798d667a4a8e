//! Load shedding under a 10x spike, open model: the gateway (release binary, cold
//! path: every request a new seller, upstreams at 50 ms, `server.max_in_flight`
//! 32) receives a steady 200 requests/s for 5 s, then 2,000/s for 5 s. Requests
//! are sent on a fixed schedule whatever the answers (no coordinated omission).
//! Prints, per phase: sent, admitted (200/404), shed (503), and the admitted
//! requests' p50/p99/max. `cargo bench --bench spike`; under `cargo test` a
//! one-second smoke run.

#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn phase(
    http: &reqwest::Client,
    base: &str,
    rate: u64,
    seconds: u64,
    first_user: u64,
) -> String {
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = Vec::new();
    for i in 0..rate * seconds {
        ticker.tick().await;
        let url = format!(
            "{base}/v1/public-phone?user_id={}&ad_id=1&category_id=1",
            first_user + i * 2 + 1
        );
        let http = http.clone();
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let status = http
                .get(url)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0);
            (status, start.elapsed())
        }));
    }
    let mut admitted = Vec::new();
    let (mut shed, mut other) = (0, 0);
    for task in tasks {
        let (status, took) = task.await.unwrap();
        match status {
            200 | 404 => admitted.push(took),
            503 => shed += 1,
            _ => other += 1,
        }
    }
    admitted.sort();
    let pct = |p: f64| {
        admitted
            .get(((admitted.len() as f64 * p) as usize).min(admitted.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    format!(
        "{rate:>5}/s x {seconds}s: sent {:>6}, admitted {:>6}, shed {:>6}, other {other}; admitted p50 {:>8.2?} p99 {:>8.2?} max {:>8.2?}",
        rate * seconds,
        admitted.len(),
        shed,
        pct(0.50),
        pct(0.99),
        admitted.last().copied().unwrap_or_default()
    )
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (steady, spike, seconds) = if bench { (200, 2000, 5) } else { (20, 200, 1) };
    let bin = env!("CARGO_BIN_EXE_phones-gateway");
    let dir = tempfile::tempdir().unwrap();
    let (sim_port, public_port, admin_port) = (free_port(), free_port(), free_port());
    let _sim = Killed(
        Command::new(bin)
            .args([
                "simulate",
                "--addr",
                &format!("127.0.0.1:{sim_port}"),
                "--latency-ms",
                "50",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let upstream = format!("http://127.0.0.1:{sim_port}");
    let _gateway = Killed(
        Command::new(bin)
            .arg("serve")
            .env(
                "PHONES_GATEWAY__SERVER__PUBLIC_ADDR",
                format!("127.0.0.1:{public_port}"),
            )
            .env(
                "PHONES_GATEWAY__SERVER__ADMIN_ADDR",
                format!("127.0.0.1:{admin_port}"),
            )
            .env("PHONES_GATEWAY__SERVER__MAX_IN_FLIGHT", "32")
            .env("PHONES_GATEWAY__LOG__FILTER", "warn")
            .env(
                "PHONES_GATEWAY__DATABASE__URL",
                format!("sqlite://{}/gw.db", dir.path().display()),
            )
            .env("PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__BASE_URL", &upstream)
            .env("PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__BASE_URL", &upstream)
            .env(
                "PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__BASE_URL",
                &upstream,
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .build()
            .unwrap();
        let admin = format!("http://127.0.0.1:{admin_port}/readyz");
        for _ in 0..200 {
            if http
                .get(&admin)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let base = format!("http://127.0.0.1:{public_port}");
        println!(
            "steady {}",
            phase(&http, &base, steady, seconds, 1_000_000).await
        );
        println!(
            "spike  {}",
            phase(&http, &base, spike, seconds, 2_000_000).await
        );
        println!(
            "after  {}",
            phase(&http, &base, steady, seconds, 3_000_000).await
        );
    });
}
