//! Whose trouble it was (docs/rules.md, "Whose time", "Whose load", "What a
//! breaker counts"): a batch, a 4xx or the gateway's own pauses show no tracked
//! seller their real number; a real outage still gets the configured rule.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::child::Process;
use crate::support::paths::BATCH;
use crate::support::{Fake, Reply, TestApp, Upstream};
use crate::{PLAIN_CATEGORY, REAL, VIRTUAL};

fn phone_of(n: u64) -> String {
    format!("+7926{:07}", n % 10_000_000)
}

/// The lookup path for `user` with the real number `phone` given.
fn given(user: u64, ad: u64, phone: &str) -> String {
    format!(
        "/v1/public-phone?user_id={user}&ad_id={ad}&category_id={PLAIN_CATEGORY}&phone=%2B{}",
        &phone[1..]
    )
}

/// The kind an answer shows, or its status.
fn kind_of(answer: &crate::support::Answer) -> String {
    answer.body["kind"]
        .as_str()
        .map_or_else(|| format!("{}", answer.status), str::to_owned)
}

/// One batch over the tracked sellers from `first`; the kinds of its items.
async fn batch_over(app: &TestApp, first: u64, round: u64) -> Vec<String> {
    let items: Vec<Value> = (0..100)
        .map(|i| {
            json!({
                "user_id": first + i,
                "ad_id": round * 1000 + i + 1,
                "category_id": PLAIN_CATEGORY,
                "phone": phone_of(round * 1000 + i),
            })
        })
        .collect();
    let answer = app
        .post_public(BATCH, json!({ "items": items }).to_string())
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            item["kind"]
                .as_str()
                .map_or_else(|| format!("{}", item["error"]["status"]), str::to_owned)
        })
        .collect()
}

/// One caller's batches against a call tracking that queues show nobody a real
/// number: a batch takes few places on the upstream, so it queues no one else.
async fn batches_against_a_queueing_calltracking(overlay: &str) {
    let app = TestApp::spawn_with(overlay).await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking
        .reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(40));
    app.calltracking.queue(8);
    const BATCHED: u64 = 10_000;
    let others: Vec<u64> = (20_001..=20_005).collect();
    app.track((BATCHED..BATCHED + 100).chain(others.iter().copied()))
        .await;
    let asking = async {
        let mut kinds = Vec::new();
        // Each ask with a phone of its own: a cold call-tracking lookup.
        for round in 0..12u64 {
            for &user in &others {
                let n = 500_000 + round * 10 + user % 10;
                let answer = app.get_public(&given(user, n, &phone_of(n))).await;
                kinds.push((user, kind_of(&answer)));
            }
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        kinds
    };
    let batching = async {
        let mut kinds = Vec::new();
        for round in 1..=3 {
            kinds.extend(batch_over(&app, BATCHED, round).await);
        }
        kinds
    };
    let (others_kinds, batch_kinds) = tokio::join!(asking, batching);
    let shown_real: Vec<_> = others_kinds.iter().filter(|(_, k)| k == "real").collect();
    assert!(
        shown_real.is_empty(),
        "tracked sellers outside the batches were shown their real number: {shown_real:?} of {others_kinds:?}"
    );
    let real_items = batch_kinds.iter().filter(|k| *k == "real").count();
    assert_eq!(
        real_items, 0,
        "batch items shown the real number: {batch_kinds:?}"
    );
    for &user in &others {
        let answer = app.get_public(&given(user, 9_999_000 + user, REAL)).await;
        answer.assert_number(VIRTUAL, "calltracking");
    }
}

#[tokio::test]
async fn one_callers_batches_over_tracked_sellers_show_nobody_a_real_number() {
    batches_against_a_queueing_calltracking("").await;
}

/// With the breaker off, no seller's own call queues behind a batch.
#[tokio::test]
async fn with_the_breaker_off_no_call_queues_behind_a_batch_into_a_timeout() {
    batches_against_a_queueing_calltracking("[breaker]\nenabled = false").await;
}

/// A 422 is the upstream's word on one request: the caller's own phone is
/// shown, and no breaker counts it, not even as a half-open breaker's probe.
#[tokio::test]
async fn a_4xx_about_one_request_opens_no_breaker_nor_reopens_a_half_open_one() {
    let app = TestApp::spawn_with("[breaker]\nopen_ms = 300").await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.calltracking
        .reply_for_phones("7999", Reply::Status(422));
    let rejected: Vec<u64> = (30_001..=30_006).collect();
    let others: Vec<u64> = (30_101..=30_105).collect();
    app.track(rejected.iter().chain(&others).copied()).await;
    for (i, &user) in rejected.iter().enumerate() {
        let phone = format!("+7999{:07}", i);
        let answer = app.get_public(&given(user, 1, &phone)).await;
        answer.assert_number(&phone, "real");
    }
    for &user in &others {
        let answer = app.get_public(&given(user, 1, REAL)).await;
        answer.assert_number(VIRTUAL, "calltracking");
    }

    // Open it on the upstream's own failures.
    app.calltracking.reply(Reply::Status(500));
    for (i, user) in (30_201..=30_205).enumerate() {
        app.enable_calltracking(user, 1).await;
        let answer = app
            .get_public(&given(user, 1, &phone_of(100 + i as u64)))
            .await;
        assert_eq!(kind_of(&answer), "real", "{answer:?}");
    }
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    let before = app.calltracking.calls();
    let answer = app.get_public(&given(others[0], 2, &phone_of(200))).await;
    assert_eq!(
        kind_of(&answer),
        "real",
        "the breaker did not open: {answer:?}"
    );
    assert_eq!(app.calltracking.calls(), before);
    // Half-open: one seller's 422 is its probe; it opens nothing.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let answer = app.get_public(&given(rejected[0], 3, "+79990000099")).await;
    answer.assert_number("+79990000099", "real");
    for (i, &user) in others.iter().enumerate() {
        let answer = app
            .get_public(&given(user, 4, &phone_of(300 + i as u64)))
            .await;
        assert_eq!(
            kind_of(&answer),
            "calltracking",
            "one seller's 422 re-opened the breaker: {answer:?}"
        );
    }
}

/// A gateway process of its own with its fakes; `env` adds settings.
async fn gateway_process(env: &[(&str, &str)]) -> (Process, Fake, Fake, tempfile::TempDir) {
    let real = Fake::start(Upstream::RealPhone).await;
    let anonymous = Fake::start(Upstream::Anonymous).await;
    let calltracking = Fake::start(Upstream::Calltracking).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let mut all = vec![
        ("UPSTREAMS__REAL_PHONE__BASE_URL", real.url.as_str()),
        ("UPSTREAMS__ANONYMOUS__BASE_URL", anonymous.url.as_str()),
        (
            "UPSTREAMS__CALLTRACKING__BASE_URL",
            calltracking.url.as_str(),
        ),
        ("LOG__FILTER", "info"),
    ];
    all.extend_from_slice(env);
    let process = Process::start_with(&url, &all).await;
    (process, real, calltracking, dir)
}

/// What a CPU quota's throttle or a VM pause does to the process.
async fn pause(process: &Process, pause: Duration) {
    use rustix::process::{Pid, Signal, kill_process};
    let pid = Pid::from_raw(i32::try_from(process.child.id()).unwrap()).unwrap();
    kill_process(pid, Signal::STOP).unwrap();
    tokio::time::sleep(pause).await;
    kill_process(pid, Signal::CONT).unwrap();
}

/// Runs then stops the process until `done`; how many stops.
async fn throttle_until(
    process: &Process,
    (run, stop): (Duration, Duration),
    done: &std::sync::atomic::AtomicBool,
) -> u32 {
    let mut paused = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(run).await;
        pause(process, stop).await;
        paused += 1;
    }
    paused
}

/// A pause longer than the calls' timeout, with the answers already in the
/// sockets: the time was the gateway's, given back; no real number, no breaker.
#[tokio::test]
async fn a_pause_of_the_gateway_is_not_the_upstreams_timeout() {
    let (process, real, calltracking, _dir) = gateway_process(&[]).await;
    real.reply(Reply::Phone(REAL));
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(100));
    let users: Vec<u64> = (40_001..=40_013).collect();
    process.track(users.iter().copied()).await;
    let lookups = users[..12].iter().map(|&user| {
        let process = &process;
        async move {
            let path = given(user, 1, &phone_of(user));
            kind_of(&process.get_public_with(&path, &[]).await)
        }
    });
    let pausing = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        pause(&process, Duration::from_millis(400)).await;
    };
    let (kinds, ()) = tokio::join!(futures_util::future::join_all(lookups), pausing);
    assert!(
        kinds.iter().all(|k| k == "calltracking"),
        "a pause of the gateway's own showed real numbers or refused: {kinds:?}"
    );
    let next = process
        .get_public_with(&given(users[12], 1, &phone_of(users[12])), &[])
        .await;
    next.assert_number(VIRTUAL, "calltracking");
}

/// A pause is not load: cold admission sheds nothing for it (docs/caching.md,
/// "A cold replica"), though the adaptive bound may still answer 503.
#[tokio::test]
async fn a_pause_of_the_gateway_is_not_load_to_cold_admission() {
    let (process, real, _calltracking, _dir) =
        gateway_process(&[("SERVER__MAX_QUEUE_DELAY_MS", "50")]).await;
    real.reply_after(Reply::Phone(REAL), Duration::from_millis(100));
    let statuses = paused_twice(&process).await;
    assert!(statuses.len() >= 150, "{}", statuses.len());
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    let metrics = process.get_admin(crate::support::paths::METRICS).await.text;
    let shed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("phones_gateway_shed_total{reason=\"cold\"} "))
        .map_or(0.0, |v| v.trim().parse::<f64>().unwrap());
    assert_eq!(
        shed, 0.0,
        "shed by cold admission after pauses: {statuses:?}"
    );
}

/// The statuses of cold lookups while the process is paused twice.
async fn paused_twice(process: &Process) -> Vec<u16> {
    let began = tokio::time::Instant::now();
    let asking =
        crate::support::open_loop(Duration::from_millis(25), Duration::from_secs(4), |n| {
            let n = n + 1;
            let path = format!(
                "/v1/public-phone?user_id={}&ad_id={n}&category_id={PLAIN_CATEGORY}",
                45_000 + n
            );
            async move { process.get_public_with(&path, &[]).await.status }
        });
    let pausing = async {
        for at in [1000, 2500] {
            tokio::time::sleep_until(began + Duration::from_millis(at)).await;
            pause(process, Duration::from_millis(900)).await;
        }
    };
    let (asked, ()) = tokio::join!(asking, pausing);
    asked.into_iter().map(|(_, status)| status).collect()
}

/// A pause as the real number arrives leaves call tracking pending at the
/// request deadline: the gateway's own bound, so a 503, never the real number.
#[tokio::test]
async fn the_deadline_reached_by_the_gateways_own_delay_shows_no_real_number() {
    let (process, real, calltracking, _dir) = gateway_process(&[]).await;
    real.reply_after(Reply::Phone(REAL), Duration::from_millis(250));
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(280));
    let users: Vec<u64> = (41_001..=41_010).collect();
    process.track(users.iter().copied()).await;
    let lookups = users.iter().map(|&user| {
        let process = &process;
        async move {
            let path =
                format!("/v1/public-phone?user_id={user}&ad_id=1&category_id={PLAIN_CATEGORY}");
            process.get_public_with(&path, &[]).await
        }
    });
    let pausing = async {
        tokio::time::sleep(Duration::from_millis(240)).await;
        pause(&process, Duration::from_millis(200)).await;
    };
    let (answers, ()) = tokio::join!(futures_util::future::join_all(lookups), pausing);
    let kinds: Vec<String> = answers.iter().map(kind_of).collect();
    assert!(
        !kinds.iter().any(|k| k == "real"),
        "the deadline reached by the gateway's own delay showed real numbers: {kinds:?}"
    );
    for answer in answers.iter().filter(|a| a.status != 200) {
        answer.assert_problem(503);
        assert!(answer.retry_after.is_some(), "{answer:?}");
    }
}

/// Lost time is given back as often as it is lost: a throttle shows no real one.
#[tokio::test]
async fn a_throttled_replica_shows_no_tracked_seller_a_real_number() {
    let (process, real, calltracking, _dir) = gateway_process(&[]).await;
    real.reply(Reply::Phone(REAL));
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(100));
    let users: Vec<u64> = (42_001..=42_000 + 120 * crate::support::scale()).collect();
    process.track(users.iter().copied()).await;
    let done = std::sync::atomic::AtomicBool::new(false);
    let lookups = async {
        let mut kinds = Vec::new();
        for chunk in users.chunks(12) {
            let asks = chunk.iter().map(|&user| {
                let process = &process;
                async move {
                    let path = given(user, 1, &phone_of(user));
                    kind_of(&process.get_public_with(&path, &[]).await)
                }
            });
            kinds.extend(futures_util::future::join_all(asks).await);
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        kinds
    };
    let throttling = throttle_until(
        &process,
        (Duration::from_millis(60), Duration::from_millis(40)),
        &done,
    );
    let (kinds, paused) = tokio::join!(lookups, throttling);
    assert!(
        paused >= 5,
        "the throttle never overlapped the lookups: {paused}"
    );
    crate::support::tally("throttled replica", &kinds);
    let real: Vec<_> = kinds.iter().filter(|k| *k == "real").collect();
    assert!(
        real.is_empty(),
        "{} of {} shown real: {kinds:?}",
        real.len(),
        kinds.len()
    );
    let answered = kinds.iter().filter(|k| *k == "calltracking").count();
    assert!(answered * 10 >= kinds.len() * 9, "{kinds:?}");
}

/// Throttled to a quarter of a core while call tracking hangs, each call still
/// gets its timeout of running time: after 10 s at least 90% fall through.
#[tokio::test]
async fn a_throttled_replica_applies_the_rule_when_call_tracking_answers_no_one() {
    let (process, real, calltracking, _dir) = gateway_process(&[]).await;
    real.reply(Reply::Phone(REAL));
    let users: Vec<u64> = (44_001..=44_500).collect();
    process.track(users.iter().copied()).await;
    calltracking.reply(Reply::Hang);
    let outage = Duration::from_secs(10 + 5 * crate::support::scale());
    let done = std::sync::atomic::AtomicBool::new(false);
    let lookups = async {
        let asked = crate::support::open_loop(Duration::from_millis(20), outage, |n| {
            let n = n + 1;
            let path = given(users[(n % 500) as usize], n, &phone_of(n));
            let process = &process;
            async move { kind_of(&process.get_public_with(&path, &[]).await) }
        })
        .await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        asked
    };
    let throttling = throttle_until(
        &process,
        (Duration::from_millis(25), Duration::from_millis(75)),
        &done,
    );
    let (kinds, paused) = tokio::join!(lookups, throttling);
    assert!(paused >= 50, "the throttle ran {paused} times");
    crate::support::assert_fell_through_after_ten_seconds(
        "throttled outage, after 10 s",
        &kinds,
        &"",
    );
}

/// A stall ending just after the timers were due is seen by them before the
/// lost-time probe runs again; the time is given back and the answers read.
#[tokio::test]
async fn a_stall_ending_just_after_the_timer_was_due_is_given_back() {
    let (process, real, calltracking, _dir) = gateway_process(&[]).await;
    real.reply(Reply::Phone(REAL));
    calltracking.reply_after(Reply::Phone(VIRTUAL), Duration::from_millis(250));
    let (rounds, per_round) = (crate::support::scale(), 10 * crate::support::scale().min(5));
    let users: Vec<u64> = (43_001..=43_000 + rounds * per_round).collect();
    process.track(users.iter().copied()).await;
    let mut kinds = Vec::new();
    for round in users.chunks(per_round as usize) {
        let lookups = round.iter().map(|&user| {
            let process = &process;
            async move {
                let path = given(user, 1, &phone_of(user));
                kind_of(&process.get_public_with(&path, &[]).await)
            }
        });
        let pausing = async {
            tokio::time::sleep(Duration::from_millis(120)).await;
            pause(&process, Duration::from_millis(200)).await;
        };
        let (done, ()) = tokio::join!(futures_util::future::join_all(lookups), pausing);
        kinds.extend(done);
    }
    crate::support::tally("stall past the due time", &kinds);
    assert!(
        !kinds.iter().any(|k| k == "real"),
        "a stall over the timers' due time showed real numbers: {kinds:?}"
    );
}
