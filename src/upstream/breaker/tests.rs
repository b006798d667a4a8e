use super::*;

fn config() -> BreakerConfig {
    BreakerConfig {
        enabled: true,
        consecutive_failures: 3,
        failure_ratio: 0.5,
        min_calls: 10,
        min_sellers: 3,
        min_requests: 3,
        window: Duration::from_secs(10),
        open: Duration::from_secs(1),
    }
}

/// A breaker that needs no spread of sellers or requests (the status feed's).
fn breaker() -> Breaker {
    Breaker::new("test", config(), 1, 1)
}

/// One that needs three sellers in three requests.
fn spread() -> Breaker {
    Breaker::new("test", config(), 3, 3)
}

/// A call about `seller` in request `request`.
fn by(seller: u64, request: u64) -> Caller {
    Caller {
        seller,
        ticket: Ticket(request),
    }
}

const FAILED: Result<(), UpstreamError> = Err(UpstreamError::Status(500));
const ANSWERED: Result<(), UpstreamError> = Ok(());

fn fail(b: &Breaker, seller: u64, request: u64) {
    b.record(&FAILED, by(seller, request));
}

#[tokio::test(start_paused = true)]
async fn a_run_of_failures_opens_then_a_probe_closes() {
    let b = breaker();
    for _ in 0..2 {
        assert!(b.allows(0));
        fail(&b, 0, 0);
    }
    assert!(b.allows(0));
    b.record(&ANSWERED, by(0, 0)); // the run is broken
    for _ in 0..3 {
        assert!(b.allows(0));
        fail(&b, 0, 0);
    }
    assert!(!b.allows(0), "open after 3 in a row");
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(b.allows(0), "one probe");
    assert!(!b.allows(0), "only one probe at a time");
    b.record(&ANSWERED, by(0, 0));
    assert!(b.allows(0) && b.allows(0), "closed again");
}

/// Open for `open_ms` exactly, and a probe goes out at its end.
#[tokio::test(start_paused = true)]
async fn it_stays_open_for_open_ms_exactly() {
    let b = breaker();
    for _ in 0..3 {
        fail(&b, 0, 0);
    }
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(!b.allows(0), "a probe before open_ms");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert!(b.allows(0), "no probe at open_ms");
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_opens_again_and_a_lost_probe_is_replaced() {
    let b = breaker();
    for _ in 0..3 {
        fail(&b, 0, 0);
    }
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(b.allows(0));
    fail(&b, 0, 0);
    assert!(!b.allows(0));
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(b.allows(0), "probe");
    // The probe never reports; after open_ms another is let through.
    assert!(!b.allows(0));
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(!b.allows(0));
    tokio::time::advance(Duration::from_millis(2)).await;
    assert!(b.allows(0));
}

#[tokio::test(start_paused = true)]
async fn a_high_failure_ratio_opens() {
    // 5 of 10 failing opens it; below the ratio, 4 of 10 (never 3 in a row), not.
    let every = |k: u64, at: u64| move |i: u64| i % k == at;
    for (failing, n) in [(every(2, 1), 5), (every(3, 0), 4)] {
        let b = breaker();
        for i in 0..10 {
            assert!(b.allows(0), "opened at {i} calls, {n} of 10 failing");
            b.record(if failing(i) { &FAILED } else { &ANSWERED }, by(0, 0));
        }
        assert_eq!(b.allows(0), n < 5, "{n} of 10 failed");
    }
}

#[tokio::test(start_paused = true)]
async fn one_sellers_failures_do_not_open_it() {
    let b = spread();
    for request in 1..=50 {
        assert!(b.allows(7), "opened by one seller");
        fail(&b, 7, request);
    }
    // A second seller's failures: two sellers, still below three.
    for request in 51..=55 {
        fail(&b, 8, request);
    }
    assert!(b.allows(1), "opened by two sellers");
    fail(&b, 9, 56);
    assert!(!b.allows(1), "three sellers failing in a run opens it");
}

#[tokio::test(start_paused = true)]
async fn one_requests_failures_do_not_open_it() {
    let b = spread();
    // One batch over fifty sellers: one request.
    for seller in 1..=50 {
        fail(&b, seller, 1);
    }
    fail(&b, 51, 2);
    assert!(b.allows(1), "opened by two requests");
    fail(&b, 52, 3);
    assert!(!b.allows(1), "three requests over three sellers open it");
}

#[tokio::test(start_paused = true)]
async fn the_sellers_are_counted_per_window() {
    let b = spread();
    fail(&b, 1, 1);
    fail(&b, 2, 2);
    tokio::time::advance(Duration::from_secs(11)).await;
    // A new window: the first two sellers are forgotten.
    fail(&b, 3, 3);
    fail(&b, 3, 4);
    assert!(b.allows(1));
}

/// Only health signs count: a 4xx, an answer that does not validate and every
/// undecided outcome are recorded neither as failures nor as calls.
#[tokio::test(start_paused = true)]
async fn only_health_signs_are_recorded() {
    let b = spread();
    use UpstreamError::*;
    #[rustfmt::skip]
    let told_nothing = [
        Status(400), Status(422), Status(403), Decode("invalid JSON body"), LoadRefused(429),
        LoadRefused(503), Local("EMFILE".into()), LocalTimeout, LostTime, Load, Panicked,
        Cancelled, Request, Saturated, SellerSaturated, CircuitOpen,
    ];
    for (i, error) in told_nothing.iter().cycle().take(160).enumerate() {
        let id = i as u64 + 1;
        b.record(&Err::<(), _>(error.clone()), by(id, id));
    }
    let opened_by = "a 4xx, a bad answer or an undecided outcome";
    assert!(b.allows(1), "{opened_by} opened it");
    // Nor as calls: three health failures in a row still open it.
    for (id, error) in (1..).zip([Timeout, Connect("reset".into()), Status(502)]) {
        b.record(&Err::<(), _>(error), by(id, id));
    }
    assert!(!b.allows(1));
}

fn opened() -> Breaker {
    let b = spread();
    for id in 1..=3 {
        fail(&b, id, id);
    }
    assert!(!b.allows(1));
    b
}

/// Half-open, it probes one call per seller for `min_sellers` sellers, and
/// opens again only on that many sellers' failed probes in as many requests.
#[tokio::test(start_paused = true)]
async fn half_open_probes_several_sellers_and_one_seller_cannot_reopen_it() {
    let b = opened();
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(b.allows(10), "a probe for seller 10");
    assert!(!b.allows(10), "one probe per seller");
    assert!(b.allows(11) && b.allows(12), "three sellers' probes");
    assert!(!b.allows(13), "no more than min_sellers at once");
    // Seller 10's probe fails again and again: never re-opened by it.
    for request in 100..110 {
        fail(&b, 10, request);
        assert!(b.allows(10), "seller 10 may probe again");
    }
    assert!(!b.allows(13));
    // Two more sellers fail, in other requests: three sellers, open.
    fail(&b, 11, 200);
    fail(&b, 12, 201);
    assert!(!b.allows(13) && !b.allows(10), "open again");
}

#[tokio::test(start_paused = true)]
async fn half_open_one_answer_closes_and_a_probe_that_told_nothing_frees_its_place() {
    let b = opened();
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(b.allows(10) && b.allows(11) && b.allows(12));
    b.record(&Err::<(), _>(UpstreamError::Status(422)), by(10, 1));
    // Its place is freed, and only its: the others' probes are still out.
    let second = b.allows(12) || b.allows(11);
    assert!(!second, "a second probe for a seller");
    assert!(b.allows(13), "the 4xx probe's place is free");
    assert!(!b.allows(14));
    // One batch fails three sellers' probes: one request, not open.
    for seller in [11, 12, 13] {
        fail(&b, seller, 7);
    }
    assert!(b.allows(20), "one request's probes re-opened it");
    b.record(&ANSWERED, by(20, 8));
    assert!((30..34).all(|seller| b.allows(seller)), "closed");
}
