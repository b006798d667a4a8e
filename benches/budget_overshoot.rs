//! How far past a fleet budget a viewer gets, and how early a viewer within
//! budget is refused (docs/budgets.md): real replicas in this process on one
//! throwaway PostgreSQL cluster, the upstream simulator, real sockets.
//!
//! For each fleet size (4 and 20 replicas) and minute budget (5 and 60), in one
//! minute window:
//! - *round-robin at 10x*: a scraper sends ten times the budget's rate, each
//!   request to the next replica; admitted past the budget is the overshoot;
//! - *burst*: another viewer sends three budgets' worth at once, spread over
//!   every replica (the worst case for shares taken at first sight);
//! - *sticky*: a third viewer asks one replica for the whole budget as fast as
//!   it can, retrying a share refusal (`Retry-After: 1`) after 100 ms: the
//!   429s it met and the time until all of its budget was answered are what
//!   refusing early costs;
//! - the database's transactions per second per replica, idle and during the
//!   scraper (`pg_stat_database.xact_commit`).
//!
//! `cargo bench --bench budget_overshoot`; under `cargo test`, 2 replicas for a
//! few seconds as a smoke check (where PostgreSQL can be started).

#![allow(clippy::unwrap_used)]
// A bench exports nothing (`pub` in the shared test modules it includes), and it
// measures wall time.
#![allow(unreachable_pub, clippy::disallowed_types)]

#[allow(dead_code)]
#[path = "../tests/it/support/pg.rs"]
mod pg;

use std::time::{Duration, Instant};

use figment::providers::Format as _;
use phones_gateway::app::App;
use phones_gateway::budget::window::Moment;
use phones_gateway::config::Config;

struct Fleet {
    publics: Vec<String>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    runs: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    database: String,
    url: String,
}

async fn fleet(admin_url: &str, name: &str, replicas: usize, budget: u32, sim: &str) -> Fleet {
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(admin_url)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let base = admin_url.rsplit_once('/').unwrap().0;
    let url = format!("{base}/{name}");
    let mut fleet = Fleet {
        publics: Vec::new(),
        stops: Vec::new(),
        runs: Vec::new(),
        database: name.to_owned(),
        url: url.clone(),
    };
    for _ in 0..replicas {
        let overlay = format!(
            r#"
            [database]
            url = "{url}"
            max_connections = 2
            listen = false
            [server]
            public_addr = "127.0.0.1:0"
            admin_addr = "127.0.0.1:0"
            shutdown_pause_ms = 0
            [admin]
            token = "bench-admin-token-0123456789"
            [upstreams.real_phone]
            base_url = "{sim}"
            [upstreams.anonymous]
            base_url = "{sim}"
            [upstreams.calltracking]
            base_url = "{sim}"
            [upstreams.calltracking.status_feed]
            enabled = false
            [rate_limit]
            per_viewer_per_minute = {budget}
            "#
        );
        let figment = figment::Figment::from(figment::providers::Toml::string(
            phones_gateway::config::DEFAULT_TOML,
        ))
        .merge(figment::providers::Toml::string(&overlay));
        let app = App::build(Config::from_figment(figment).unwrap())
            .await
            .unwrap();
        let public = format!("http://{}", app.public_addr());
        let admin = format!("http://{}/readyz", app.admin_addr());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        fleet.runs.push(tokio::spawn(app.run(async move {
            let _ = stopped.await;
        })));
        fleet.stops.push(stop);
        let client = reqwest::Client::new();
        let start = Instant::now();
        while client
            .get(&admin)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .ok()
            != Some(200)
        {
            assert!(start.elapsed() < Duration::from_secs(30), "never ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fleet.publics.push(public);
    }
    // Every replica has counted the others.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fleet
}

impl Fleet {
    async fn stop(self) {
        for stop in self.stops {
            let _ = stop.send(());
        }
        for run in self.runs {
            let _ = run.await;
        }
    }

    async fn transactions(&self) -> i64 {
        let pool = sqlx::PgPool::connect(&self.url).await.unwrap();
        let n: i64 = sqlx::query_scalar(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1",
        )
        .bind(&self.database)
        .fetch_one(&pool)
        .await
        .unwrap();
        pool.close().await;
        n
    }
}

async fn reveal(client: &reqwest::Client, public: &str, viewer: &str) -> (u16, Option<String>) {
    let response = client
        .get(format!(
            "{public}/v1/public-phone?user_id=7&ad_id=1&category_id=1"
        ))
        .header("x-viewer-id", viewer)
        .send()
        .await
        .unwrap();
    let retry = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (response.status().as_u16(), retry)
}

/// Sends `per_minute` requests a minute round-robin for `length`; what was
/// answered.
async fn round_robin(fleet: &Fleet, viewer: &str, per_minute: u32, length: Duration) -> usize {
    let client = reqwest::Client::new();
    let gap = Duration::from_secs(60) / per_minute;
    let start = Instant::now();
    let mut answered = 0;
    let mut i = 0;
    while start.elapsed() < length {
        let (status, _) = reveal(&client, &fleet.publics[i % fleet.publics.len()], viewer).await;
        answered += usize::from(status == 200);
        i += 1;
        let next = gap * u32::try_from(i).unwrap();
        if let Some(wait) = next.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    answered
}

/// `n` requests at once, spread over every replica; what was answered.
async fn burst(fleet: &Fleet, viewer: &str, n: usize) -> usize {
    let client = reqwest::Client::new();
    let asks = (0..n).map(|i| {
        let (client, public) = (&client, &fleet.publics[i % fleet.publics.len()]);
        async move { reveal(client, public, viewer).await.0 == 200 }
    });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .filter(|&ok| ok)
        .count()
}

/// One replica asked for the whole budget: (429s met, time until answered).
async fn sticky(fleet: &Fleet, viewer: &str, budget: u32) -> (usize, Duration) {
    let client = reqwest::Client::new();
    let start = Instant::now();
    let (mut answered, mut refused) = (0, 0);
    while answered < budget {
        match reveal(&client, &fleet.publics[0], viewer).await {
            (200, _) => answered += 1,
            (429, Some(retry)) if retry == "1" => {
                refused += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("sticky viewer refused for good after {answered}: {other:?}"),
        }
    }
    (refused, start.elapsed())
}

async fn scenario(
    admin_url: &str,
    sim: &str,
    replicas: usize,
    budget: u32,
    run: Duration,
    margin: Duration,
) {
    let name = format!("overshoot_{replicas}_{budget}");
    let fleet = fleet(admin_url, &name, replicas, budget, sim).await;
    let idle_from = fleet.transactions().await;
    let idle = Duration::from_secs(3);
    tokio::time::sleep(idle).await;
    let idle_tps =
        (fleet.transactions().await - idle_from - 1) as f64 / idle.as_secs_f64() / replicas as f64;
    // One minute window for what follows (the sliding minute starts empty).
    let left = Duration::from_millis(60_000 - Moment::now().into_minute());
    if left < run + margin {
        tokio::time::sleep(left + Duration::from_millis(200)).await;
    }
    let busy_from = fleet.transactions().await;
    let start = Instant::now();
    let scraped = round_robin(&fleet, "scraper", budget * 10, run).await;
    let busy_tps = (fleet.transactions().await - busy_from - 1) as f64
        / start.elapsed().as_secs_f64()
        / replicas as f64;
    let burst_n = usize::try_from(budget).unwrap() * 3;
    let burst = burst(&fleet, "burster", burst_n).await;
    let (early, took) = sticky(&fleet, "sticky", budget).await;
    println!(
        "budget_overshoot: {replicas} replicas, {budget}/min: round-robin at 10x for {run:?}: \
         {scraped} answered, overshoot {}; burst of {burst_n}: {burst} answered, overshoot {}; \
         sticky to one replica: the whole budget in {took:.2?}, {early} share refusals on the way; \
         database {idle_tps:.1} transactions/s per replica idle, {busy_tps:.1} under the scraper",
        scraped.saturating_sub(budget as usize),
        burst.saturating_sub(budget as usize),
    );
    fleet.stop().await;
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let Some(db) = pg::cluster() else { return };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(phones_gateway::sim::serve(
            listener,
            phones_gateway::sim::SimConfig::default(),
            std::future::pending(),
        ));
        if full {
            for replicas in [4, 20] {
                for budget in [5, 60] {
                    scenario(
                        &db.url,
                        &sim,
                        replicas,
                        budget,
                        Duration::from_secs(15),
                        Duration::from_secs(25),
                    )
                    .await;
                }
            }
        } else {
            scenario(
                &db.url,
                &sim,
                2,
                5,
                Duration::from_secs(2),
                Duration::from_secs(3),
            )
            .await;
        }
    });
}
