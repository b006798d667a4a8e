//! A campaign of faults at once against a gateway run as its own process, while
//! honest callers ask for tracked sellers: outside the control phases none sees
//! their real number and 90% get a number; in the controls (real outages,
//! docs/rules.md, "Whose load") the rule must still fall through, so a closed
//! gateway fails. Every attack's premise is asserted to have happened.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::child::Process;
use crate::support::paths::BATCH;
use crate::support::paths::METRICS;
use crate::support::{Fake, Reply, Upstream};
use crate::{PLAIN_CATEGORY, REAL, VIRTUAL};

/// Below the longest pauses, so they reach it; far above a busy test process's
/// fakes, so a fake that answers never times out.
const CALLTRACKING_TIMEOUT: Duration = Duration::from_millis(600);
/// How long the outage controls last, and the part of them the rule is given.
const OUTAGE: Duration = Duration::from_secs(15);
const WITHIN: Duration = Duration::from_secs(10);
const OPEN: Duration = Duration::from_millis(1000);
const HONEST_EVERY: Duration = Duration::from_millis(25);

/// One honest ask: when it was sent and answered, about whom, what it showed.
#[derive(Debug, Clone)]
struct Asked {
    sent: Instant,
    done: Instant,
    user: u64,
    kind: String,
}

/// The phases, by when they began.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    WarmUp,
    Attack,
    EveryoneFails,
    Settle,
    NobodyAnswered,
    SingleSellers,
    ThrottledOutage,
    OutageBesideOneFailing,
    SurgeOutage,
}

struct Clock {
    phases: Mutex<Vec<(Instant, Phase)>>,
}

impl Clock {
    fn enter(&self, phase: Phase) {
        self.phases.lock().unwrap().push((Instant::now(), phase));
    }

    /// When the last `phase` began.
    fn began(&self, phase: Phase) -> Option<Instant> {
        let phases = self.phases.lock().unwrap();
        phases
            .iter()
            .rev()
            .find(|(_, p)| *p == phase)
            .map(|(at, _)| *at)
    }

    fn at(&self, at: Instant) -> Phase {
        let phases = self.phases.lock().unwrap();
        phases
            .iter()
            .rev()
            .find(|(start, _)| *start <= at)
            .map_or(Phase::WarmUp, |(_, phase)| *phase)
    }
}

/// A small deterministic generator (LCG), for the pauses and phones.
struct Draws(u64);

impl Draws {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

fn kind_of(status: u16, body: &Value) -> String {
    body["kind"]
        .as_str()
        .map_or_else(|| status.to_string(), str::to_owned)
}

/// Where the callers send: the process's public listener.
#[derive(Clone)]
struct Target {
    public: String,
    http: reqwest::Client,
}

impl Target {
    /// The kind shown, a problem's status, or `error` below HTTP.
    async fn ask(&self, path: &str) -> String {
        let sent = self
            .http
            .get(format!("{}{path}", self.public))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        let Ok(response) = sent else {
            return "error".to_owned();
        };
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        kind_of(status, &serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// Honest asks, each for a new tracked seller, every `HONEST_EVERY`.
fn honest_callers(
    process: &Target,
    first: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
    into: Arc<Mutex<Vec<Asked>>>,
) -> tokio::task::JoinHandle<()> {
    let mut user = first;
    open_loop(
        process,
        HONEST_EVERY,
        move || {
            user += 1;
            let path =
                format!("/v1/public-phone?user_id={user}&ad_id=1&category_id={PLAIN_CATEGORY}");
            (user, path)
        },
        stop,
        into,
    )
}

/// An open loop: each ask its own task, so slow answers do not slow the caller.
fn open_loop(
    process: &Target,
    every: Duration,
    mut next: impl FnMut() -> (u64, String) + Send + 'static,
    stop: Arc<std::sync::atomic::AtomicBool>,
    into: Arc<Mutex<Vec<Asked>>>,
) -> tokio::task::JoinHandle<()> {
    let process = process.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut asks = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            tick.tick().await;
            let (user, path) = next();
            let (process, into) = (process.clone(), into.clone());
            asks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let kind = process.ask(&path).await;
                into.lock().unwrap().push(Asked {
                    sent,
                    done: Instant::now(),
                    user,
                    kind,
                });
            }));
        }
        for ask in asks {
            let _ = ask.await;
        }
    })
}

fn single_seller(
    process: &Target,
    user: u64,
    every: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
    into: Arc<Mutex<Vec<Asked>>>,
) -> tokio::task::JoinHandle<()> {
    let process = process.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        let mut asks = Vec::new();
        let mut ad = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            tick.tick().await;
            ad += 1;
            let (process, into) = (process.clone(), into.clone());
            asks.push(tokio::spawn(async move {
                let sent = Instant::now();
                let path = format!(
                    "/v1/public-phone?user_id={user}&ad_id={ad}&category_id={PLAIN_CATEGORY}"
                );
                let kind = process.ask(&path).await;
                into.lock().unwrap().push(Asked {
                    sent,
                    done: Instant::now(),
                    user,
                    kind,
                });
            }));
        }
        for ask in asks {
            let _ = ask.await;
        }
    })
}

async fn enable(process: &Process, users: impl Iterator<Item = u64>) {
    let items: Vec<Value> = users
        .map(|user| json!({"user_id": user, "enabled": true, "version": 1}))
        .collect();
    for chunk in items.chunks(10_000) {
        let status = process
            .send(reqwest::Method::POST, json!({ "items": chunk }))
            .await;
        assert_eq!(status, 200);
    }
}

async fn pause(pid: u32, pause: Duration) {
    use rustix::process::{Pid, Signal, kill_process};
    let pid = Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    kill_process(pid, Signal::STOP).unwrap();
    tokio::time::sleep(pause).await;
    kill_process(pid, Signal::CONT).unwrap();
}

/// A CPU quota's throttle for `length`; how many stops.
async fn throttle(pid: u32, length: Duration) -> usize {
    let (start, mut stops) = (Instant::now(), 0);
    while start.elapsed() < length {
        tokio::time::sleep(Duration::from_millis(60)).await;
        pause(pid, Duration::from_millis(40)).await;
        stops += 1;
    }
    stops
}

/// A metric of the process's, summed over its series.
async fn metric(process: &Process, name: &str) -> f64 {
    process
        .get_admin(METRICS)
        .await
        .text
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with(&format!("{name}_")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One attacking batch; the kinds of its items whose phones are accepted.
async fn attack_batch(process: &Target, draws: &mut Draws) -> Vec<String> {
    let mut accepted = Vec::new();
    let items: Vec<Value> = (0..100)
        .map(|i| {
            let user = ATTACKED + draws.next(400);
            let rejected = draws.next(5) == 0;
            let phone = if rejected {
                format!("+7999{:07}", draws.next(10_000_000))
            } else {
                format!("+7926{:07}", draws.next(10_000_000))
            };
            accepted.push(!rejected);
            json!({"user_id": user, "ad_id": 1 + i, "category_id": PLAIN_CATEGORY, "phone": phone})
        })
        .collect();
    let response = process
        .http
        .post(format!("{}{BATCH}", process.public))
        .header("content-type", "application/json")
        .body(json!({ "items": items }).to_string())
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    let Ok(response) = response else {
        return Vec::new();
    };
    let text = response.text().await.unwrap_or_default();
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    body["results"]
        .as_array()
        .map(|results| {
            results
                .iter()
                .zip(accepted)
                .filter(|(_, accepted)| *accepted)
                .map(|(item, _)| kind_of(0, item))
                .collect()
        })
        .unwrap_or_default()
}

/// Call tracking's calls on the process so far, by outcome.
async fn outcomes(process: &Process) -> std::collections::BTreeMap<String, u64> {
    let metrics = process.get_admin(METRICS).await.text;
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("phones_gateway_upstream_requests_total")
                && l.contains("upstream=\"calltracking\"")
        })
        .filter_map(|l| {
            let outcome = l.split("outcome=\"").nth(1)?.split('"').next()?.to_owned();
            let value = l.rsplit(' ').next()?.parse::<f64>().ok()? as u64;
            Some((outcome, value))
        })
        .collect()
}

/// The nonzero changes between two snapshots of [`outcomes`].
fn delta(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

const HONEST: u64 = 1_000_000;
const ATTACKED: u64 = 500_000;
const REFUSING: u64 = 500_300;
/// Few: every load refusal cuts the adaptive bound for everyone
/// (docs/adaptive-limit.md), and more would starve the honest asks.
const REFUSING_SELLERS: u64 = 20;
const SINGLES: [u64; 3] = [600_001, 600_002, 600_003];
/// The surge's buyers ask for these sellers, each a new one.
const SURGE: u64 = 2_000_000;

/// The attacker's cold lookups every `every` for `length`; the kinds shown.
async fn attack_at(
    process: &Target,
    every: Duration,
    length: Duration,
    first_ad: u64,
) -> Vec<String> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let into = Arc::new(Mutex::new(Vec::new()));
    let mut draws = Draws(first_ad);
    let mut ad = first_ad;
    let caller = open_loop(
        process,
        every,
        move || {
            ad += 1;
            let user = ATTACKED + draws.next(400);
            let path = format!(
                "/v1/public-phone?user_id={user}&ad_id={ad}&category_id={PLAIN_CATEGORY}&phone=%2B7926{:07}",
                draws.next(10_000_000)
            );
            (user, path)
        },
        stop.clone(),
        into.clone(),
    );
    tokio::time::sleep(length).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    caller.await.unwrap();
    let asked = into.lock().unwrap();
    asked.iter().map(|a| a.kind.clone()).collect()
}

/// Shares of `kind` among `asks`, and how many.
fn share(asks: &[&Asked], kind: &str) -> (f64, usize) {
    let n = asks.iter().filter(|a| a.kind == kind).count();
    (n as f64 / asks.len().max(1) as f64, asks.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_of_faults_shows_no_honest_tracked_seller_a_real_number() {
    let real = Fake::start(Upstream::RealPhone).await;
    let anonymous = Fake::start(Upstream::Anonymous).await;
    let calltracking = Fake::start(Upstream::Calltracking).await;
    real.reply_after(Reply::Phone(REAL), Duration::from_millis(10));
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(30));
    calltracking.queue(8);
    calltracking.reply_for_phones("7999", Reply::Status(422));
    for user in REFUSING..REFUSING + REFUSING_SELLERS {
        let refusal = if user % 2 == 0 {
            Reply::Status(429)
        } else {
            Reply::RetryAfter(503)
        };
        calltracking.reply_for(user, refusal);
    }
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let timeout = CALLTRACKING_TIMEOUT.as_millis().to_string();
    let open = OPEN.as_millis().to_string();
    let process = Process::start_with(
        &url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", real.url.as_str()),
            ("UPSTREAMS__ANONYMOUS__BASE_URL", anonymous.url.as_str()),
            (
                "UPSTREAMS__CALLTRACKING__BASE_URL",
                calltracking.url.as_str(),
            ),
            ("UPSTREAMS__CALLTRACKING__TIMEOUT_MS", timeout.as_str()),
            ("BREAKER__OPEN_MS", open.as_str()),
            ("LOG__FILTER", "info"),
            ("REVEALS__ENABLED", "false"),
        ],
    )
    .await;
    let target = Target {
        public: process.public.clone(),
        http: reqwest::Client::new(),
    };
    enable(
        &process,
        (HONEST..HONEST + 14_000)
            .chain(SURGE..SURGE + 4_000)
            .chain(ATTACKED..ATTACKED + 400)
            .chain(SINGLES),
    )
    .await;

    let clock = Arc::new(Clock {
        phases: Mutex::new(vec![(Instant::now(), Phase::WarmUp)]),
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let honest = honest_callers(&target, HONEST, stop.clone(), asked.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;

    // The attack window: pauses, batches, 422s and load refusals at once.
    clock.enter(Phase::Attack);
    let attack_for = Duration::from_secs(40);
    let pid = process.child.id();
    let lost_before = metric(&process, "phones_gateway_lost_time_seconds_sum").await;
    let pausing = tokio::spawn(async move {
        let mut draws = Draws(7);
        let (start, mut paused) = (Instant::now(), Vec::new());
        while start.elapsed() < attack_for {
            tokio::time::sleep(Duration::from_millis(1500 + draws.next(1500))).await;
            let length = Duration::from_millis(50 + draws.next(851));
            let at = Instant::now();
            pause(pid, length).await;
            paused.push((at, length));
        }
        paused
    });
    let batching = {
        let process = target.clone();
        tokio::spawn(async move {
            let mut draws = Draws(11);
            let (start, mut kinds) = (Instant::now(), Vec::new());
            while start.elapsed() < attack_for {
                kinds.extend(attack_batch(&process, &mut draws).await);
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
            kinds
        })
    };
    let paused = pausing.await.unwrap();
    let batch_kinds = batching.await.unwrap();
    let throttled = throttle(pid, Duration::from_secs(5)).await;
    let lost = metric(&process, "phones_gateway_lost_time_seconds_sum").await - lost_before;
    // One caller raises what call tracking carried, then bursts past it.
    calltracking.per_second(Some(140));
    let mut raising = attack_at(
        &target,
        Duration::from_micros(16_667),
        Duration::from_secs(20),
        1_000_000,
    )
    .await;
    let over_before = calltracking.over_rate();
    raising.extend(
        attack_at(
            &target,
            Duration::from_micros(8_333),
            Duration::from_secs(4),
            2_000_000,
        )
        .await,
    );
    let over_rate = calltracking.over_rate() - over_before;
    calltracking.per_second(None);

    let mut seen = vec![("attack", outcomes(&process).await)];
    // Control 1: call tracking answers 500 to everyone.
    clock.enter(Phase::EveryoneFails);
    calltracking.reply(Reply::Status(500));
    tokio::time::sleep(Duration::from_secs(5)).await;
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(30));
    seen.push(("everyone fails", outcomes(&process).await));
    clock.enter(Phase::Settle);
    tokio::time::sleep(OPEN + Duration::from_millis(500)).await;
    clock.enter(Phase::Attack);
    tokio::time::sleep(Duration::from_secs(2)).await;

    seen.push(("between", outcomes(&process).await));
    // Control 2: call tracking answers nobody; long, so the first second
    // (undecided refusals until the breaker opens) is a small part of it.
    clock.enter(Phase::NobodyAnswered);
    calltracking.reply(Reply::Hang);
    tokio::time::sleep(Duration::from_secs(15)).await;
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(30));
    seen.push(("nobody answered", outcomes(&process).await));
    clock.enter(Phase::Settle);
    tokio::time::sleep(OPEN + CALLTRACKING_TIMEOUT + Duration::from_millis(500)).await;
    clock.enter(Phase::Attack);
    tokio::time::sleep(Duration::from_secs(2)).await;

    seen.push(("between", outcomes(&process).await));
    // Control 3: three sellers whose calls alone fail.
    clock.enter(Phase::SingleSellers);
    calltracking.reply_for(SINGLES[0], Reply::Hang);
    calltracking.reply_for(SINGLES[1], Reply::Hang);
    calltracking.reply_for(SINGLES[2], Reply::Status(500));
    let singles_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let singles_asked = Arc::new(Mutex::new(Vec::new()));
    let singles: Vec<_> = SINGLES
        .iter()
        .map(|&user| {
            single_seller(
                &target,
                user,
                Duration::from_millis(500),
                singles_stop.clone(),
                singles_asked.clone(),
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(6)).await;
    singles_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for single in singles {
        single.await.unwrap();
    }
    seen.push(("single sellers", outcomes(&process).await));
    for user in SINGLES {
        calltracking.reply_for(user, Reply::Phone(VIRTUAL));
    }
    clock.enter(Phase::Settle);
    tokio::time::sleep(OPEN + CALLTRACKING_TIMEOUT + Duration::from_millis(500)).await;

    // Control 4: everyone fails while the process is throttled.
    clock.enter(Phase::ThrottledOutage);
    calltracking.reply(Reply::Status(500));
    throttle(pid, OUTAGE).await;
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(30));
    clock.enter(Phase::Settle);
    seen.push(("throttled outage", outcomes(&process).await));
    tokio::time::sleep(OPEN + CALLTRACKING_TIMEOUT + Duration::from_secs(3)).await;

    // Control 5: everyone fails beside one seller that always fails.
    calltracking.reply_for(SINGLES[2], Reply::Status(500));
    let one_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let one = single_seller(
        &target,
        SINGLES[2],
        Duration::from_secs(4),
        one_stop.clone(),
        Arc::new(Mutex::new(Vec::new())),
    );
    tokio::time::sleep(Duration::from_secs(9)).await;
    clock.enter(Phase::OutageBesideOneFailing);
    calltracking.reply(Reply::Status(500));
    tokio::time::sleep(OUTAGE).await;
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(30));
    clock.enter(Phase::Settle);
    one_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    one.await.unwrap();
    seen.push(("outage beside one failing seller", outcomes(&process).await));
    tokio::time::sleep(OPEN + CALLTRACKING_TIMEOUT + Duration::from_secs(3)).await;

    // Control 6: the same during a surge of many buyers.
    let surge_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let surge_asked = Arc::new(Mutex::new(Vec::new()));
    clock.enter(Phase::Attack);
    let mut surge_user = SURGE;
    let surge = open_loop(
        &target,
        Duration::from_micros(6_250),
        move || {
            surge_user += 1;
            let path = format!(
                "/v1/public-phone?user_id={surge_user}&ad_id=1&category_id={PLAIN_CATEGORY}"
            );
            (surge_user, path)
        },
        surge_stop.clone(),
        surge_asked.clone(),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    clock.enter(Phase::SurgeOutage);
    calltracking.reply(Reply::Status(500));
    tokio::time::sleep(OUTAGE).await;
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(30));
    clock.enter(Phase::Settle);
    surge_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    surge.await.unwrap();
    seen.push(("outage during a surge", outcomes(&process).await));
    tokio::time::sleep(OPEN + CALLTRACKING_TIMEOUT + Duration::from_secs(1)).await;

    clock.enter(Phase::Settle);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    honest.await.unwrap();
    let mut before = std::collections::BTreeMap::new();
    for (phase, now) in &seen {
        eprintln!(
            "campaign, call tracking's outcomes to the end of {phase}: {:?}",
            delta(&before, now)
        );
        before = now.clone();
    }

    let asked = asked.lock().unwrap().clone();
    let of = |phase: Phase| -> Vec<&Asked> {
        asked
            .iter()
            .filter(|a| clock.at(a.sent) == phase && clock.at(a.done) == phase)
            .collect()
    };
    let outside: Vec<&Asked> = asked
        .iter()
        .filter(|a| {
            let (sent, done) = (clock.at(a.sent), clock.at(a.done));
            [sent, done]
                .iter()
                .all(|p| matches!(p, Phase::WarmUp | Phase::Attack | Phase::SingleSellers))
        })
        .collect();
    let shown_real: Vec<&&Asked> = outside.iter().filter(|a| a.kind == "real").collect();
    let kinds = |asks: &[&Asked]| {
        let mut counts = std::collections::BTreeMap::new();
        for ask in asks {
            *counts.entry(ask.kind.clone()).or_insert(0) += 1;
        }
        counts
    };
    let (everyone_fails, n1) = share(&of(Phase::EveryoneFails), "real");
    let (nobody_answered, n2) = share(&of(Phase::NobodyAnswered), "real");
    let singles_asked = singles_asked.lock().unwrap().clone();
    let singles: Vec<&Asked> = singles_asked.iter().collect();
    let (single_sellers, n3) = share(&singles, "real");
    let batch_real = batch_kinds.iter().filter(|k| *k == "real").count();
    eprintln!(
        "campaign: {} honest asks outside the control phases {:?}; {} paused ({:?} in all); \
         {} batch items with accepted phones {:?}; control phases, real shown: \
         everyone fails {:.1}% of {n1}, nobody answered {:.1}% of {n2}, single sellers {:.1}% of {n3}",
        outside.len(),
        kinds(&outside),
        paused.len(),
        paused.iter().map(|(_, length)| *length).sum::<Duration>(),
        batch_kinds.len(),
        {
            let mut counts = std::collections::BTreeMap::new();
            for kind in &batch_kinds {
                *counts.entry(kind.clone()).or_insert(0) += 1;
            }
            counts
        },
        everyone_fails * 100.0,
        nobody_answered * 100.0,
        single_sellers * 100.0,
    );
    // The surge's buyers count with the honest ones.
    let surge_asked = surge_asked.lock().unwrap().clone();
    let surge_before: Vec<&Asked> = surge_asked
        .iter()
        .filter(|a| clock.at(a.sent) == Phase::Attack && clock.at(a.done) == Phase::Attack)
        .collect();
    let with_surge: Vec<Asked> = asked.iter().chain(&surge_asked).cloned().collect();
    let after_within = |phase: Phase| -> Vec<&Asked> {
        let began = clock.began(phase).expect("the phase ran");
        with_surge
            .iter()
            .filter(|a| clock.at(a.sent) == phase && clock.at(a.done) == phase)
            .filter(|a| a.sent >= began + WITHIN)
            .collect()
    };
    let outages: Vec<_> = [
        ("throttled outage", Phase::ThrottledOutage),
        (
            "outage beside one failing seller",
            Phase::OutageBesideOneFailing,
        ),
        ("outage during a surge", Phase::SurgeOutage),
    ]
    .into_iter()
    .map(|(what, phase)| {
        let asks = after_within(phase);
        let (got, n) = share(&asks, "real");
        (what, got, n, kinds(&asks))
    })
    .collect();
    let overlapped = paused
        .iter()
        .filter(|(at, length)| asked.iter().any(|a| a.sent < *at && a.done > *at + *length))
        .count();
    let refused = seen[0].1.get("load_refused").copied().unwrap_or(0);
    let paused_for: Duration = paused.iter().map(|(_, length)| *length).sum();
    let answered = outside.iter().filter(|a| a.kind == "calltracking").count();
    eprintln!(
        "campaign premises: {overlapped} of {} pauses over honest calls in flight; {} calls queued at call tracking; \
         {refused} load refusals; {lost:.2} s lost of {paused_for:?} paused; {throttled} stops of the throttle; \
         {over_rate} answered 500 past call tracking's rate in the burst, the raising caller's kinds {:?}; \
         honest asks answered with a number outside the controls: {answered} of {} ({:.1}%); \
         outages after 10 s, real shown: {:?}",
        paused.len(),
        calltracking.queued(),
        {
            let mut counts = std::collections::BTreeMap::new();
            for kind in &raising {
                *counts.entry(kind.clone()).or_insert(0) += 1;
            }
            counts
        },
        outside.len(),
        answered as f64 * 100.0 / outside.len().max(1) as f64,
        outages
            .iter()
            .map(|(what, got, n, kinds)| format!("{what}: {:.1}% of {n} {kinds:?}", got * 100.0))
            .collect::<Vec<_>>(),
    );
    let mut refused_when = std::collections::BTreeMap::new();
    for ask in outside.iter().filter(|a| a.kind != "calltracking") {
        let at = ask
            .sent
            .duration_since(clock.phases.lock().unwrap()[0].0)
            .as_secs()
            / 5
            * 5;
        *refused_when.entry(at).or_insert(0) += 1;
    }
    eprintln!(
        "campaign: honest asks outside the controls not answered, by 5 s from the start: {refused_when:?}"
    );
    assert!(
        overlapped * 2 >= paused.len(),
        "pauses over calls in flight: {overlapped} of {}",
        paused.len()
    );
    assert!(calltracking.queued() > 0, "no call queued at call tracking");
    assert!(
        over_rate > 0,
        "the burst never passed what call tracking answers"
    );
    let raising_real = raising.iter().filter(|k| *k == "real").count();
    assert_eq!(
        raising_real, 0,
        "the caller raising what was carried, then bursting, shown the real number"
    );
    let surge_real = surge_before.iter().filter(|a| a.kind == "real").count();
    assert!(
        surge_before.len() >= 100,
        "surge asks before the outage: {}",
        surge_before.len()
    );
    assert_eq!(
        surge_real, 0,
        "the surge's buyers shown the real number before the outage"
    );
    assert!(refused > 0, "no load refusal came back: {:?}", seen[0]);
    assert!(
        lost >= paused_for.as_secs_f64() * 0.5,
        "time lost {lost:.2} s, paused {paused_for:?}"
    );
    assert!(
        throttled >= 30,
        "the throttle stopped the process {throttled} times"
    );
    assert!(
        answered * 100 >= outside.len() * 90,
        "honest asks answered with a number outside the controls: {answered} of {}: {:?}",
        outside.len(),
        kinds(&outside)
    );
    for (what, got, n, kinds) in &outages {
        assert!(*n >= 50, "{what}: only {n} asks after its first 10 s");
        assert!(
            *got >= 0.9,
            "{what}: {:.1}% of {n} fell through after its first 10 s, 90% at least: {kinds:?}",
            got * 100.0
        );
    }
    let origin = clock.phases.lock().unwrap()[0].0;
    let since = |at: Instant| at.duration_since(origin);
    let phases: Vec<(Duration, Phase)> = clock
        .phases
        .lock()
        .unwrap()
        .iter()
        .map(|(at, phase)| (since(*at), *phase))
        .collect();
    let shown: Vec<(u64, Duration, Duration)> = shown_real
        .iter()
        .map(|a| (a.user, since(a.sent), since(a.done)))
        .collect();
    assert!(
        shown_real.is_empty(),
        "honest tracked sellers shown their real number outside the control phases \
         (seller, sent, answered, from the start): {shown:?}; the phases: {phases:?}"
    );
    assert_eq!(
        batch_real, 0,
        "batch items with accepted phones shown the real number"
    );
    assert!(
        outside.len() > 1000,
        "too few honest asks: {}",
        outside.len()
    );
    assert!(paused.len() >= 10, "too few pauses: {paused:?}");
    for (what, got, n) in [
        ("call tracking failing everyone", everyone_fails, n1),
        ("call tracking answering nobody", nobody_answered, n2),
        ("single sellers' calls failing", single_sellers, n3),
    ] {
        assert!(n >= 10, "{what}: only {n} asks in the phase");
        assert!(
            got >= 0.9,
            "{what}: {:.1}% of {n} fell through to the real number (the configured rule), 90% at least",
            got * 100.0
        );
    }
    assert!(
        singles_asked.iter().all(|a| SINGLES.contains(&a.user)),
        "the single sellers' asks are theirs"
    );
}
