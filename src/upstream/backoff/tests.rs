//! The back-off's branches on a paused clock: calls are sent and end at
//! chosen instants, as an upstream carrying a given rate would answer them.

use super::*;

const TIMEOUT: Duration = Duration::from_millis(300);
/// A spread of one: any verdict at the fraction is the upstream failing.
const ANYONE: Spread = (1, 1);
const CALLER: Caller = Caller {
    seller: 7,
    ticket: crate::upstream::Ticket(1),
};

/// `n` calls sent now, each answered well.
fn answered_now(backoff: &Backoff, n: u32) {
    let now = Instant::now();
    for _ in 0..n {
        backoff.send(now).expect("sent");
        backoff.answered(now);
    }
}

/// `per_bucket` calls a bucket for `buckets` buckets, each answered well.
async fn carry(backoff: &Backoff, per_bucket: u32, buckets: u32) {
    for _ in 0..buckets {
        answered_now(backoff, per_bucket);
        tokio::time::advance(BUCKET).await;
    }
}

/// A back-off that learned 10 calls a bucket, past the warm-up.
async fn warmed(spread: Spread) -> Backoff {
    let backoff = Backoff::new(TIMEOUT, spread);
    carry(&backoff, 10, WARM_UP + 4).await;
    backoff
}

/// One warmed, then backed off by a burst of 30 failures.
async fn backed_off(spread: Spread) -> Backoff {
    let backoff = warmed(spread).await;
    burst_failing(&backoff, 30);
    backoff
}

/// A bucket later, calls sent until the hold stops them, each answered.
async fn calm_bucket(backoff: &Backoff) {
    tokio::time::advance(BUCKET).await;
    let now = Instant::now();
    for _ in 0..100 {
        if backoff.send(now).is_err() {
            break;
        }
        backoff.answered(now);
    }
}

/// Calls sent now until one is not: why it was not.
fn over_the_hold(backoff: &Backoff) -> Unsent {
    loop {
        if let Err(unsent) = backoff.send(Instant::now()) {
            break unsent;
        }
    }
}

/// One call sent now, failed by `caller`: its judgement.
fn fail_one(backoff: &Backoff, caller: Caller) -> Judgement {
    let now = Instant::now();
    let sent = backoff.send(now).expect("sent");
    backoff.failed(sent, now, caller)
}

fn is_beta_of_40(hold: Option<f64>) -> bool {
    (hold.unwrap() - BETA * 40.0).abs() < 0.01
}

/// Sends `n` calls at once and fails each; their judgements.
fn burst_failing(backoff: &Backoff, n: u32) -> Vec<Option<Judgement>> {
    let now = Instant::now();
    (0..n)
        .map(|_| {
            backoff
                .send(now)
                .ok()
                .map(|sent| backoff.failed(sent, now, CALLER))
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn what_the_upstream_carried_is_learned_from_answers_outside_trouble() {
    let backoff = Backoff::new(TIMEOUT, ANYONE);
    assert_eq!(backoff.carried(), None);
    carry(&backoff, 10, 1).await;
    tokio::time::advance(Duration::from_millis(1)).await;
    backoff.answered(Instant::now());
    assert_eq!(backoff.carried(), Some(40.0), "the first bucket sets it");
    carry(&backoff, 0, 120).await;
    backoff.send(Instant::now()).expect("sent");
    let faded = backoff.carried().unwrap();
    assert!(faded < 40.0 * 0.5 && faded > 40.0 * 0.2, "{faded}");
}

/// A failure at the usual rate (one seller's, or sporadic) is a verdict at
/// once, and backs nothing off.
#[tokio::test(start_paused = true)]
async fn a_failure_at_the_usual_rate_is_a_verdict_at_once() {
    let backoff = warmed(ANYONE).await;
    assert_eq!(fail_one(&backoff, CALLER), Judgement::Verdict);
    assert_eq!(backoff.hold(), None);
}

/// Before what was carried is known, nothing is unusual.
#[tokio::test(start_paused = true)]
async fn with_no_history_every_failure_is_a_verdict() {
    let backoff = Backoff::new(TIMEOUT, ANYONE);
    carry(&backoff, 10, WARM_UP - 1).await;
    let judged = burst_failing(&backoff, 50);
    let verdicts = judged.iter().all(|j| *j == Some(Judgement::Verdict));
    assert!(verdicts, "{judged:?}");
    assert_eq!(backoff.hold(), None);
}

/// Failures above the usual rate are load, and once many the gateway backs
/// off to a fraction of what was carried: calls over the hold are not sent.
#[tokio::test(start_paused = true)]
async fn failures_above_the_usual_rate_are_load_and_back_off() {
    let backoff = warmed(ANYONE).await;
    // Usual: up to 10 x 1.25 + 8 = 20.5 a bucket, the last bucket's 10 included.
    let judged = burst_failing(&backoff, 30);
    let verdicts = judged[..10].iter().all(|j| *j == Some(Judgement::Verdict));
    assert!(verdicts, "{judged:?}");
    // The first failure above it is load and, with the verdicts, over a
    // tenth of the calls ended lately: the rest of the burst is not sent.
    assert_eq!(judged[10], Some(Judgement::Load), "{judged:?}");
    assert!(judged[11..].iter().all(Option::is_none), "{judged:?}");
    assert!(is_beta_of_40(backoff.hold()), "{:?}", backoff.hold());
    assert!(backoff.send(Instant::now()).is_err());
}

/// Failures that stop at the lower rate were load: they stay undecided, and
/// the hold climbs back until the back-off ends.
#[tokio::test(start_paused = true)]
async fn failures_that_stop_at_the_lower_rate_were_load() {
    let backoff = backed_off(ANYONE).await;
    assert!(backoff.hold().is_some());
    // Calm buckets: answered at the hold's rate.
    let mut buckets = 0;
    while backoff.hold().is_some() {
        calm_bucket(&backoff).await;
        buckets += 1;
        assert!(buckets < 100, "never ended");
    }
    // From half of 10 a bucket to 20.5, at 1 a bucket (5% of 10, at least 1).
    assert!((14..=18).contains(&buckets), "{buckets}");
}

/// Failures that go on once the gateway sends only the fraction, past the
/// settling time, are the upstream's verdict; before it, load.
#[tokio::test(start_paused = true)]
async fn failures_that_go_on_once_backed_off_are_verdicts() {
    let backoff = backed_off(ANYONE).await;
    let began = Instant::now();
    let mut first_verdict = None;
    for _ in 0..16 {
        tokio::time::advance(BUCKET).await;
        let now = Instant::now();
        for _ in 0..100 {
            let Ok(sent) = backoff.send(now) else { break };
            if backoff.failed(sent, now, CALLER) == Judgement::Verdict && first_verdict.is_none() {
                first_verdict = Some(now - began);
            }
        }
    }
    let at = first_verdict.expect("judged");
    assert!(at >= settle(TIMEOUT), "{at:?}");
    assert!(at <= settle(TIMEOUT) + BUCKET, "{at:?}");
    // Still held to the fraction: failures do not let it climb.
    assert!(is_beta_of_40(backoff.hold()));
}

/// Once a call sent at the fraction failed as a verdict, a call over the hold
/// takes the verdict too (`Failing`); before that, and after a calm bucket, it
/// is held.
#[tokio::test(start_paused = true)]
async fn calls_over_the_hold_take_the_verdict_while_it_goes_on() {
    let backoff = backed_off(ANYONE).await;
    assert_eq!(over_the_hold(&backoff), Unsent::Held, "cutting");
    tokio::time::advance(settle(TIMEOUT) + BUCKET).await;
    assert_eq!(fail_one(&backoff, CALLER), Judgement::Verdict);
    assert_eq!(over_the_hold(&backoff), Unsent::Failing);
    // A bucket in which the calls sent were answered well: calm again.
    tokio::time::advance(BUCKET).await;
    let now = Instant::now();
    backoff.send(now).expect("a token refilled");
    backoff.answered(now);
    tokio::time::advance(BUCKET).await;
    assert_eq!(over_the_hold(&backoff), Unsent::Held);
}

/// One seller's verdicts at the fraction do not make calls over the hold take
/// a verdict: that needs the spread that opens a breaker.
#[tokio::test(start_paused = true)]
async fn one_sellers_verdicts_leave_the_others_held() {
    let backoff = backed_off((3, 3)).await;
    tokio::time::advance(settle(TIMEOUT) + BUCKET).await;
    let fail = |seller, ticket| {
        let ticket = crate::upstream::Ticket(ticket);
        let judged = fail_one(&backoff, Caller { seller, ticket });
        assert_eq!(judged, Judgement::Verdict);
    };
    for ticket in 1..=5 {
        fail(42, ticket);
    }
    assert_eq!(over_the_hold(&backoff), Unsent::Held, "one seller");
    tokio::time::advance(BUCKET).await;
    for seller in [43, 44] {
        fail(seller, 10 + seller);
    }
    assert_eq!(over_the_hold(&backoff), Unsent::Failing, "three sellers");
}

/// A failure of a call sent while the hold climbed is load again, and cuts
/// the hold back to the fraction with a new settling time.
#[tokio::test(start_paused = true)]
async fn a_failure_while_climbing_cuts_back_and_settles_again() {
    let backoff = backed_off(ANYONE).await;
    for _ in 0..3 {
        calm_bucket(&backoff).await;
    }
    assert!(backoff.hold().unwrap() > BETA * 40.0);
    tokio::time::advance(settle(TIMEOUT)).await;
    let judged = fail_one(&backoff, CALLER);
    assert_eq!(judged, Judgement::Load, "sent while climbing");
    assert!(is_beta_of_40(backoff.hold()), "cut back");
    // Sent at the fraction but before the new settling time: load.
    tokio::time::advance(BUCKET).await;
    assert_eq!(fail_one(&backoff, CALLER), Judgement::Load);
}

/// Buckets in which no call ended do not let the hold climb: the first call
/// after them, past the settling time, is sent at the fraction: a verdict.
#[tokio::test(start_paused = true)]
async fn silence_does_not_climb_the_hold() {
    let backoff = backed_off(ANYONE).await;
    tokio::time::advance(settle(TIMEOUT) + BUCKET * 8).await;
    let now = Instant::now();
    let sent = backoff.send(now).unwrap();
    assert!(is_beta_of_40(backoff.hold()));
    assert_eq!(backoff.failed(sent, now, CALLER), Judgement::Verdict);
}

/// A caller that raises what the upstream carried for half a minute, then
/// bursts, is still above the usual rate: what settled over minutes bounds it.
#[tokio::test(start_paused = true)]
async fn a_callers_warm_up_does_not_raise_the_usual_rate() {
    let backoff = Backoff::new(TIMEOUT, ANYONE);
    carry(&backoff, 10, 480).await;
    carry(&backoff, 30, 120).await;
    tokio::time::advance(BUCKET / 2).await;
    answered_now(&backoff, 15);
    let now = Instant::now();
    // 31 sent over the last bucket's length (half of the last bucket's 30,
    // 15, this one): usual by the 30 s average alone (about 22.6 a bucket),
    // not by the settled one (about 14.4).
    let carried = backoff.carried().unwrap() * BUCKET.as_secs_f64();
    assert!(31.0 < carried * (1.0 + MARGIN) + SLACK, "{carried}");
    let sent = backoff.send(now).unwrap();
    assert_eq!(backoff.failed(sent, now, CALLER), Judgement::Load);
}

/// A caller's own calls cannot make a failure a verdict sooner: nothing past
/// the hold goes out, and before the settling time every failure is load.
#[tokio::test(start_paused = true)]
async fn a_callers_calls_cannot_hasten_a_verdict() {
    let backoff = backed_off(ANYONE).await;
    let began = Instant::now();
    while Instant::now() < began + settle(TIMEOUT) - Duration::from_millis(10) {
        tokio::time::advance(Duration::from_millis(10)).await;
        for judged in burst_failing(&backoff, 100).into_iter().flatten() {
            assert_eq!(judged, Judgement::Load);
        }
    }
}

/// Sporadic failures (under the trigger's share) above the usual rate are
/// load, but back nothing off.
#[tokio::test(start_paused = true)]
async fn sporadic_failures_above_the_usual_rate_back_nothing_off() {
    let backoff = warmed(ANYONE).await;
    carry(&backoff, 30, 2).await;
    answered_now(&backoff, 29);
    assert_eq!(fail_one(&backoff, CALLER), Judgement::Load);
    assert_eq!(backoff.hold(), None);
}

/// After two quiet minutes nothing of before counts.
#[tokio::test(start_paused = true)]
async fn a_long_quiet_spell_forgets_the_back_off() {
    let backoff = backed_off(ANYONE).await;
    assert!(backoff.hold().is_some());
    tokio::time::advance(BUCKET * 481).await;
    assert!(backoff.send(Instant::now()).is_ok());
    assert_eq!(backoff.hold(), None);
}

#[test]
fn settling_is_twice_the_timeout_and_at_least_a_second() {
    let ms = Duration::from_millis;
    assert_eq!(settle(ms(300)), ms(1000));
    assert_eq!(settle(ms(800)), ms(1600));
}
