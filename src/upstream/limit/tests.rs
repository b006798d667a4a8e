use super::*;

fn user(id: u64) -> UserId {
    UserId::new(id).unwrap()
}

/// An adaptive bound of `max` and floor `min` (tolerance 2, climb floor
/// 100 ms: a 300 ms timeout's), its limit shown on `gauge`.
fn adaptive_on(max: usize, min: usize, gauge: metrics::Gauge) -> Bound {
    let adapt = Adapt {
        min,
        tolerance: 2.0,
        climb_floor: Adapt::climb_floor(Duration::from_millis(300)),
    };
    Bound::new(max, Some(adapt), gauge)
}

fn adaptive(max: usize, min: usize) -> Bound {
    adaptive_on(max, min, metrics::Gauge::noop())
}

/// Answers of 0.1 ms, then of 60 ms: hundreds of times the long average, but
/// below the climb's floor (100 ms for a 300 ms timeout), as the
/// gateway's own queueing on busy cores is: nothing is cut.
#[tokio::test(start_paused = true)]
async fn a_climb_below_the_floor_is_the_gateways_own_queueing() {
    let bound = adaptive(64, 2);
    for latency in [Duration::from_micros(100); 50]
        .into_iter()
        .chain([Duration::from_millis(60); 20])
    {
        let held: Vec<_> = (0..40).map(|_| bound.slot().unwrap()).collect();
        let slot = bound.slot().unwrap();
        tokio::time::advance(latency).await;
        slot.finish(End::Answered);
        drop(held);
    }
    assert_eq!(bound.limit(), 64);
}

/// Answers of `latency`, one after another with up to 20 others in
/// flight; stops early once a cut leaves no place.
async fn answers(bound: &Bound, latency: Duration, count: usize) {
    for _ in 0..count {
        let held: Vec<_> = (0..20).map_while(|_| bound.slot()).collect();
        let Some(slot) = bound.slot() else {
            return;
        };
        tokio::time::advance(latency).await;
        slot.finish(End::Answered);
        drop(held);
    }
}

/// One slow answer among steady ones moves the short average an eighth
/// of the way: no cut. Many in a row are a climb.
#[tokio::test(start_paused = true)]
async fn one_slow_answer_is_not_a_climb_and_many_are() {
    let ms = Duration::from_millis;
    let bound = adaptive(64, 2);
    answers(&bound, ms(60), 300).await;
    answers(&bound, ms(200), 1).await;
    assert_eq!(bound.limit(), 64, "one slow answer");
    answers(&bound, ms(200), 6).await;
    assert!(bound.limit() < 64, "a climb: {}", bound.limit());
}

/// After a long stretch of slow answers, latency falls back: the long
/// average follows faster, so a later rise from the new level is seen.
#[tokio::test(start_paused = true)]
async fn the_long_average_follows_latency_down() {
    let ms = Duration::from_millis;
    let bound = adaptive(64, 2);
    answers(&bound, ms(280), 300).await;
    answers(&bound, ms(10), 200).await;
    assert_eq!(bound.limit(), 64);
    answers(&bound, ms(250), 6).await;
    assert!(bound.limit() < 64, "a rise from 10 ms: {}", bound.limit());
}

/// Each row: calls held in flight, how one of them ends, the limit after.
#[tokio::test(start_paused = true)]
async fn the_adaptive_limit_cuts_on_refusals_and_climbs_and_grows_back() {
    let bound = adaptive(100, 4);
    let ms = Duration::from_millis;
    let (refused, latency) = (Signal::Refused, |n| Signal::Latency(ms(n)));
    // (held, signal, wait before it, limit after)
    #[rustfmt::skip]
    let rows = [
        (10, latency(20), ms(0), 100), // steady 20 ms, 10 of 100 in flight: app-limited, no growth
        (20, refused, ms(1), 18),      // a refusal with 20 in flight: cut to 0.9 x 20
        (20, refused, ms(0), 18),      // a refusal of a call started before the cut: ignored
        (17, latency(20), ms(5), 18),  // answers at the limit grow it by about 1/limit each
        (17, latency(800), ms(5), 15), // a latency climb (short past twice the long) cuts
        (3, refused, ms(5), 4),        // refusals, each after the last cut: down to the floor,
        (3, refused, ms(5), 4),        // not below
    ];
    let mut started = Instant::now();
    for (i, (held, signal, wait, after)) in rows.into_iter().enumerate() {
        let slots: Vec<_> = (0..held).map_while(|_| bound.slot()).collect();
        if !wait.is_zero() {
            // A call that starts after the last cut.
            started = Instant::now();
            tokio::time::advance(wait).await;
        }
        let slot = slots.first().unwrap();
        let slot = Slot {
            bound: &bound,
            started,
            before: slot.before,
        };
        bound.learn(signal, &slot);
        drop(slot);
        // The hand-made slot gave back a place it had not taken.
        bound.in_flight.fetch_add(1, Ordering::AcqRel);
        drop(slots);
        assert_eq!(bound.limit(), after, "row {i}");
        assert_eq!(bound.in_flight.load(Ordering::Acquire), 0, "row {i}");
    }
    // Back to 20 ms answers (the short average settles), then a second
    // without a cut: growth is one place per answer at the limit.
    for round in 0..30 {
        if round == 10 {
            tokio::time::advance(Duration::from_secs(2)).await;
        }
        let slots: Vec<_> = (0..bound.limit()).map_while(|_| bound.slot()).collect();
        tokio::time::advance(ms(20)).await;
        if let Some(slot) = slots.into_iter().last() {
            slot.finish(End::Answered);
        }
    }
    assert!(bound.limit() >= 20, "{}", bound.limit());
}

#[tokio::test(start_paused = true)]
async fn a_load_refusal_reported_on_a_slot_cuts_and_a_timeout_is_a_climb() {
    let bound = adaptive(64, 2);
    for _ in 0..50 {
        let slot = bound.slot().unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        slot.finish(End::Answered);
    }
    assert_eq!(bound.limit(), 64);
    let held: Vec<_> = (0..30).map(|_| bound.slot().unwrap()).collect();
    bound.slot().unwrap().finish(End::LoadRefused);
    assert_eq!(bound.limit(), 27, "0.9 x the 31 in flight");
    drop(held);
    // Cancelled or failed calls teach nothing.
    tokio::time::advance(Duration::from_millis(10)).await;
    drop(bound.slot().unwrap());
    bound.slot().unwrap().finish(End::Unknown);
    assert_eq!(bound.limit(), 27);
    // Answers of 300 ms in a row are a climb over 10 ms answers, once the
    // short average passes the floor (100 ms).
    let held: Vec<_> = (0..20).map(|_| bound.slot().unwrap()).collect();
    for _ in 0..3 {
        let slot = bound.slot().unwrap();
        tokio::time::advance(Duration::from_millis(300)).await;
        slot.finish(End::Answered);
    }
    assert_eq!(bound.limit(), 18, "0.9 x the 21 in flight");
    drop(held);
    assert_eq!(bound.in_flight.load(Ordering::Acquire), 0);
}

#[test]
fn a_refused_place_is_handed_back() {
    for bound in [Bound::new(2, None, metrics::Gauge::noop()), adaptive(2, 1)] {
        let a = bound.slot().unwrap();
        let b = bound.slot().unwrap();
        for _ in 0..10 {
            assert!(bound.slot().is_none());
        }
        assert_eq!(bound.in_flight.load(Ordering::Acquire), 2);
        drop(a);
        let c = bound.slot();
        assert!(c.is_some());
        drop((b, c));
        assert_eq!(bound.in_flight.load(Ordering::Acquire), 0);
    }
}

#[test]
fn two_threads_racing_for_the_last_place_never_both_have_it() {
    let bound = Bound::new(1, None, metrics::Gauge::noop());
    let holders = AtomicUsize::new(0);
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for _ in 0..20_000 {
                    barrier.wait();
                    if let Some(slot) = bound.slot() {
                        assert_eq!(holders.fetch_add(1, Ordering::AcqRel), 0);
                        holders.fetch_sub(1, Ordering::AcqRel);
                        drop(slot);
                    }
                }
            });
        }
    });
    assert_eq!(bound.in_flight.load(Ordering::Acquire), 0);
}

#[test]
fn a_seller_holds_at_most_its_bound_and_others_are_not_affected() {
    let bound = PerSeller::new(2);
    let a = bound.slot(user(1)).unwrap();
    let b = bound.slot(user(1)).unwrap();
    assert!(bound.slot(user(1)).is_none());
    let other = bound.slot(user(2));
    assert!(other.is_some());
    drop(a);
    let c = bound.slot(user(1));
    assert!(c.is_some());
    drop((b, c, other));
    // Every place given back: no seller is left in the map.
    assert_eq!(bound.sellers(), 0);
}

#[test]
fn a_bound_of_zero_is_one() {
    let bound = PerSeller::new(0);
    let held = bound.slot(user(1));
    assert!(held.is_some());
    assert!(bound.slot(user(1)).is_none());
}

#[tokio::test]
async fn places_are_given_back_when_a_call_task_is_cancelled_or_panics() {
    let bound = std::sync::Arc::new(PerSeller::new(4));
    for panics in [false, true] {
        let (held, holding) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let bound = bound.clone();
            async move {
                let _slot = bound.slot(user(7));
                let _ = held.send(());
                if panics {
                    panic!("a bug inside the call");
                }
                std::future::pending::<()>().await;
            }
        });
        let _ = holding.await;
        if !panics {
            assert_eq!(bound.sellers(), 1);
            task.abort();
        }
        assert!(task.await.is_err());
        assert_eq!(bound.sellers(), 0, "panics: {panics}");
    }
}

/// A `Limit` at `limit` (of 100, floor 2, tolerance 2, climb floor
/// 100 ms) with these averages, its last cut at the returned instant.
fn limit_state(limit: f64, short: Option<f64>, long: Option<f64>) -> (Limit, Instant) {
    let last_cut = Instant::now();
    let state = Limit {
        min: 2.0,
        max: 100.0,
        tolerance: 2.0,
        climb_floor: 0.1,
        limit,
        short,
        long,
        last_cut,
    };
    (state, last_cut)
}

/// The long average moves 1/256 of the way to each latency, up or down;
/// when it is past twice the short one, it then moves a twentieth of the
/// way to the short one. Values in seconds, exact in binary.
#[test]
fn the_long_average_moves_as_its_formulas_say() {
    let secs = Duration::from_secs_f64;
    // Up: 1 + (3 - 1) / 256.
    let (mut state, t) = limit_state(100.0, Some(1.0), Some(1.0));
    state.learn(Signal::Latency(secs(3.0)), t, 1, 1, t);
    assert_eq!(state.long, Some(1.0078125));
    // Down, with the short average at a quarter: 1 - 0.75 / 256, then
    // 0.95 of that plus 0.05 of the short one.
    let (mut state, t) = limit_state(100.0, Some(0.25), Some(1.0));
    state.learn(Signal::Latency(secs(0.25)), t, 1, 1, t);
    let long = state.long.unwrap();
    let want = 0.997_070_312_5 * 0.95 + 0.25 * 0.05;
    assert!((long - want).abs() < 1e-12, "{long} != {want}");
}

/// Each comparison of the averages is strict: at exact equality nothing
/// happens. The averages after one answer are exact in binary.
#[test]
fn the_averages_compare_strictly() {
    // (case, short, long, climb floor, latency in us; short, long and limit after)
    #[rustfmt::skip]
    let cases = [
        // 0.875 and 0.375 + 0.5 / 8: the long average does not follow the short one down
        ("long at twice short", 0.375, 0.875, 0.1, 875_000, 0.4375, 0.875, 100.0),
        // 0.9375 - 0.5 / 8 and 0.4375: no cut
        ("short at tolerance x long", 0.9375, 0.4375, 0.1, 437_500, 0.875, 0.4375, 100.0),
        // far above twice the long one: no cut
        ("short at the climb floor", 0.25, 0.0625, 0.25, 250_000, 0.25, 0.063_232_421_875, 100.0),
        // a cut to 0.9 x the 10 in flight
        ("short above the floor", 0.25, 0.0625, 0.249, 250_000, 0.25, 0.063_232_421_875, 9.0),
    ];
    for (case, short, long, floor, latency, short_after, long_after, limit) in cases {
        let (mut state, t) = limit_state(100.0, Some(short), Some(long));
        state.climb_floor = floor;
        let learned = state.learn(Signal::Latency(Duration::from_micros(latency)), t, 1, 10, t);
        assert_eq!(learned, limit, "{case}");
        assert_eq!(
            (state.short, state.long),
            (Some(short_after), Some(long_after)),
            "{case}"
        );
    }
}

/// An answer grows the limit when the calls in flight as it started were
/// at least half the limit; before `PROBE_AFTER` without a cut, by
/// 1/limit, and after it by one place.
#[test]
fn an_answer_grows_the_limit_by_one_over_it_and_only_at_half_of_it() {
    let ms = Duration::from_millis;
    // (case, limit, calls in flight as it started and as it ends, answered at; limit after)
    #[rustfmt::skip]
    let cases = [
        ("half of 6 in flight", 6.0, 3, ms(20), 6.0 + 1.0 / 6.0),
        ("4 + 1/4, exact", 4.0, 2, ms(20), 4.25),
        ("fewer than half of 4: no growth", 4.0, 1, ms(20), 4.0),
        ("a second without a cut: one place", 4.0, 2, PROBE_AFTER, 5.0),
    ];
    for (case, limit, in_flight, after, want) in cases {
        let (mut state, t) = limit_state(limit, None, None);
        let grown = state.learn(Signal::Latency(ms(20)), t, in_flight, in_flight, t + after);
        assert_eq!(grown, want, "{case}");
    }
}

#[test]
fn a_slot_counts_itself_among_the_calls_in_flight() {
    let bound = adaptive(8, 1);
    let a = bound.slot().unwrap();
    let b = bound.slot().unwrap();
    assert_eq!((a.before, b.before), (1, 2));
}

/// The values a gauge was set to.
#[derive(Default)]
struct Sets(Mutex<Vec<f64>>);

impl metrics::GaugeFn for Sets {
    fn increment(&self, _: f64) {
        unreachable!("the limit's gauge is only set");
    }
    fn decrement(&self, _: f64) {
        unreachable!("the limit's gauge is only set");
    }
    fn set(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// The gauge shows the limit at start and each time it moves, and is
/// left alone when it does not.
#[tokio::test(start_paused = true)]
async fn the_gauge_follows_the_limit_when_it_moves() {
    let sets = std::sync::Arc::new(Sets::default());
    let bound = adaptive_on(64, 2, metrics::Gauge::from_arc(sets.clone()));
    // An idle answer: the limit stays.
    let slot = bound.slot().unwrap();
    tokio::time::advance(Duration::from_millis(10)).await;
    slot.finish(End::Answered);
    assert_eq!(*sets.0.lock().unwrap(), [64.0]);
    let held: Vec<_> = (0..30).map(|_| bound.slot().unwrap()).collect();
    bound.slot().unwrap().finish(End::LoadRefused);
    assert_eq!(bound.limit(), 27);
    assert_eq!(*sets.0.lock().unwrap(), [64.0, 27.0]);
    drop(held);
}

/// Items of batches hold at most three quarters of the limit; a single lookup
/// still finds a place beside them, and a limit of one is the batches' too.
#[test]
fn batches_leave_a_quarter_of_the_bound_to_single_lookups() {
    let bound = Bound::new(8, None, metrics::Gauge::noop());
    let items: Vec<_> = (0..8).map_while(|_| bound.batch_slot()).collect();
    assert_eq!(items.len(), 6);
    let singles: Vec<_> = (0..8).map_while(|_| bound.slot()).collect();
    assert_eq!(singles.len(), 2);
    let one = Bound::new(1, None, metrics::Gauge::noop());
    assert!(one.batch_slot().is_some());
}
