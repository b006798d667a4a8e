//! An open-model load generator for the harness's Zipf scenarios, where oha's
//! uniform random URLs and summary-only output do not answer the question:
//! requests are scheduled at a constant rate whatever the answers do, each
//! measured from the moment it was due (so a queue in front of the server shows
//! as latency, as with oha's latency correction), keys drawn from a Zipf mix,
//! and the result reported per second of the run and for the most popular keys.
//!
//! Keys: ad `rank` in 1..=ads with probability proportional to 1/rank (s = 1),
//! seller `rank % sellers + 1`, category 9 (anonymous numbers sold) for every
//! fifth ad, else 1; the same mix as `benches/load/hot.lua`.
//!
//! `SHAPE = soak` draws instead `ADS` keys uniformly in the layout of
//! `benches/load/fill.lua` (key k: seller 1000 + k / 10, ad 10 + k % 10,
//! category 1; the harness passes fill.lua's 90,000), each request with
//! `X-Viewer-Id: viewer-1`, so each is a reveal. The harness's soak uses it
//! rather than oha: over 240 s, oha at that rate stalled for up to 0.7 s at a
//! time against a bare hello-world too (p99 63 ms), so its p99 measured oha.
//!
//! Usage: `openload BASE_URL RATE SECONDS [CONNECTIONS] [ADS] [SELLERS] [TOP] [SLOW_MS] [WARMUP_S] [SHAPE]`
//! Prints one JSON document: totals, one row per second (answered, shed with
//! 503, other, latency percentiles of the answered), and for the `TOP` most
//! popular ads after `WARMUP_S`: requests, how many took `SLOW_MS` or longer
//! (waited on an upstream: a miss), and their p99.9.

// A load tool: it measures wall time.
#![allow(clippy::disallowed_types)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::sync::Mutex;
use tokio::sync::mpsc;

/// One answered (or failed) request: when it was due, in ms from the start; its
/// status (0: no answer); its latency from when it was due, in us; the ad's rank.
#[derive(Clone, Copy)]
struct Sample {
    due_ms: u32,
    status: u16,
    latency_us: u32,
    rank: u32,
}

struct Args {
    base: String,
    rate: f64,
    seconds: u64,
    connections: usize,
    ads: u32,
    sellers: u32,
    top: u32,
    slow_ms: u32,
    warmup_s: u32,
    /// The soak's uniform keys with a viewer, rather than the Zipf mix.
    soak: bool,
}

fn args() -> Args {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: f64| all.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    Args {
        base: all
            .first()
            .cloned()
            .unwrap_or_else(|| "http://127.0.0.1:19301".into()),
        rate: num(1, 1000.0),
        seconds: num(2, 10.0) as u64,
        connections: num(3, 64.0) as usize,
        ads: num(4, 10_000.0) as u32,
        sellers: num(5, 2_000.0) as u32,
        top: num(6, 1_000.0) as u32,
        slow_ms: num(7, 50.0) as u32,
        warmup_s: num(8, 0.0) as u32,
        soak: all.get(9).is_some_and(|shape| shape == "soak"),
    }
}

/// Cumulative 1/rank weights, for drawing ranks by binary search.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: u32) -> Self {
        let mut total = 0.0;
        Zipf(
            (1..=n)
                .map(|rank| {
                    total += 1.0 / f64::from(rank);
                    total
                })
                .collect(),
        )
    }

    fn draw(&self, uniform: f64) -> u32 {
        let x = uniform * self.0[self.0.len() - 1];
        self.0.partition_point(|&w| w < x) as u32 + 1
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let authority = args
        .base
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let zipf = Zipf::new(args.ads);
    let (queue, receiver) = mpsc::unbounded_channel::<(Instant, u32)>();
    let receiver = Arc::new(Mutex::new(receiver));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.connections {
        let (receiver, authority) = (receiver.clone(), authority.clone());
        let (sellers, soak) = (args.sellers, args.soak);
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut sender = None;
            loop {
                let Some((due, rank)) = receiver.lock().await.recv().await else {
                    break;
                };
                let status = send(&mut sender, &authority, rank, sellers, soak).await;
                let latency = due.elapsed();
                samples.push(Sample {
                    due_ms: due.duration_since(start).as_millis() as u32,
                    status,
                    latency_us: latency.as_micros().min(u128::from(u32::MAX)) as u32,
                    rank,
                });
            }
            samples
        }));
    }
    // The schedule: every millisecond, every request due by then, each stamped
    // with the instant it was due.
    let total = (args.rate * args.seconds as f64) as u64;
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    while sent < total {
        tick.tick().await;
        let due_by = ((start.elapsed().as_secs_f64()) * args.rate) as u64;
        while sent < due_by.min(total) {
            let due = start + Duration::from_secs_f64(sent as f64 / args.rate);
            let key = if args.soak {
                // Key 0..ADS, stored as a rank from 1 as the Zipf draw's is.
                (uniform() * f64::from(args.ads)) as u32 % args.ads + 1
            } else {
                zipf.draw(uniform())
            };
            let _ = queue.send((due, key));
            sent += 1;
        }
    }
    drop(queue);
    let mut samples = Vec::with_capacity(total as usize);
    for worker in workers {
        // A worker that never finishes its queue is the server failing to answer;
        // its samples are lost with it and show as `missing` below.
        if let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(30), worker).await {
            samples.append(&mut s);
        }
    }
    println!("{}", report(&args, sent, &samples));
    Ok(())
}

/// One request on this worker's connection (opened, or reopened after a
/// failure); the status, or 0 when there was no answer.
async fn send(
    sender: &mut Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>>,
    authority: &str,
    rank: u32,
    sellers: u32,
    soak: bool,
) -> u16 {
    if sender.as_ref().is_none_or(|s| s.is_closed()) {
        *sender = connect(authority).await;
    }
    let Some(s) = sender.as_mut() else {
        tokio::time::sleep(Duration::from_millis(10)).await;
        return 0;
    };
    let (user, ad, category) = if soak {
        // fill.lua's layout: ten ads a seller, from seller 1000 and ad 10.
        let k = rank - 1;
        (1000 + k / 10, 10 + k % 10, 1)
    } else {
        (rank % sellers + 1, rank, if rank % 5 == 0 { 9 } else { 1 })
    };
    let mut request = hyper::Request::get(format!(
        "/v1/public-phone?user_id={user}&ad_id={ad}&category_id={category}"
    ))
    .header(hyper::header::HOST, authority);
    if soak {
        request = request.header("x-viewer-id", "viewer-1");
    }
    let request = request.body(Empty::new());
    let Ok(request) = request else { return 0 };
    if s.ready().await.is_err() {
        *sender = None;
        return 0;
    }
    match s.send_request(request).await {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.into_body().collect().await {
                Ok(_) => status,
                Err(_) => 0,
            }
        }
        Err(_) => {
            *sender = None;
            0
        }
    }
}

async fn connect(authority: &str) -> Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(authority).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(sender)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    f64::from(sorted[i]) / 1000.0
}

fn report(args: &Args, sent: u64, samples: &[Sample]) -> String {
    let answered = |s: &Sample| s.status == 200 || s.status == 404;
    let seconds = args.seconds as usize + 1;
    let mut rows = Vec::new();
    for second in 0..seconds {
        let within: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.due_ms as usize / 1000 == second)
            .collect();
        if within.is_empty() {
            continue;
        }
        let mut ok: Vec<u32> = within
            .iter()
            .filter(|s| answered(s))
            .map(|s| s.latency_us)
            .collect();
        ok.sort_unstable();
        let mut shed: Vec<u32> = within
            .iter()
            .filter(|s| s.status == 503)
            .map(|s| s.latency_us)
            .collect();
        shed.sort_unstable();
        rows.push(format!(
            "{{\"t\": {second}, \"sent\": {}, \"answered\": {}, \"shed\": {}, \"other\": {}, \
             \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"max_ms\": {:.3}, \"shed_p99_ms\": {:.3}}}",
            within.len(),
            ok.len(),
            shed.len(),
            within.len() - ok.len() - shed.len(),
            percentile(&ok, 0.50),
            percentile(&ok, 0.99),
            ok.last().map_or(0.0, |&l| f64::from(l) / 1000.0),
            percentile(&shed, 0.99),
        ));
    }
    let mut statuses = std::collections::BTreeMap::new();
    for s in samples {
        *statuses.entry(s.status).or_insert(0u64) += 1;
    }
    let warm = |s: &&Sample| s.due_ms >= args.warmup_s * 1000;
    let mut all: Vec<u32> = samples
        .iter()
        .filter(warm)
        .filter(|s| answered(s))
        .map(|s| s.latency_us)
        .collect();
    all.sort_unstable();
    let mut top: Vec<u32> = samples
        .iter()
        .filter(warm)
        .filter(|s| answered(s) && s.rank <= args.top)
        .map(|s| s.latency_us)
        .collect();
    top.sort_unstable();
    let slow = top.iter().filter(|&&l| l >= args.slow_ms * 1000).count();
    let statuses: Vec<String> = statuses
        .iter()
        .map(|(k, v)| format!("\"{k}\": {v}"))
        .collect();
    format!(
        "{{\"sent\": {sent}, \"missing\": {}, \"statuses\": {{{}}}, \
         \"after_warmup\": {{\"answered\": {}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"p999_ms\": {:.3}, \"max_ms\": {:.3}}}, \
         \"top\": {{\"ads\": {}, \"answered\": {}, \"slow\": {slow}, \"slow_ms\": {}, \"p99_ms\": {:.3}, \"p999_ms\": {:.3}, \"max_ms\": {:.3}}}, \
         \"per_second\": [{}]}}",
        sent as usize - samples.len(),
        statuses.join(", "),
        all.len(),
        percentile(&all, 0.50),
        percentile(&all, 0.99),
        percentile(&all, 0.999),
        all.last().map_or(0.0, |&l| f64::from(l) / 1000.0),
        args.top,
        top.len(),
        args.slow_ms,
        percentile(&top, 0.99),
        percentile(&top, 0.999),
        top.last().map_or(0.0, |&l| f64::from(l) / 1000.0),
        rows.join(", "),
    )
}
