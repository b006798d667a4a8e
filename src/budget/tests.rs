//! The ledger's unit tests: the fleet key, windows and their carry, shares,
//! refusals, forgetting and eviction.

use super::*;

/// `[rate_limit]` with these budgets (and the default exchange interval).
pub(super) fn sizes(per_viewer_per_minute: u32, per_viewer_per_day: u32) -> BudgetsConfig {
    BudgetsConfig {
        per_viewer_per_minute,
        per_viewer_per_day,
        exchange_interval: Duration::from_millis(250),
    }
}

fn viewer(id: &str) -> Viewer {
    Viewer::parse(id.as_bytes()).unwrap()
}

/// A refusal for `retry_after_s`, as a check gives it.
pub(super) fn spent(retry_after_s: u64) -> Result<(), Refusal> {
    Err(Refusal::Spent { retry_after_s })
}

/// A refusal of `items` that a minute's `budget` can never pass.
fn never(items: u32, budget: u32) -> Result<(), Refusal> {
    let per = "minute";
    Err(Refusal::Never { items, budget, per })
}

fn kept(forgotten: usize, evicted: usize, dropped: u64, ledgers: usize) -> Kept {
    Kept {
        forgotten,
        evicted,
        dropped,
        ledgers,
    }
}

/// Sets a refusal of viewer `key` by the fleet until second `until_s`.
fn refuse_until(budgets: &Budgets, key: u64, until_s: u64) {
    budgets.viewers.get_mut(&key).unwrap().refused_until_s = u32::try_from(until_s).unwrap();
}

#[test]
fn the_fleet_key_of_a_viewer_never_changes() {
    // Pinned: a dependency update that changed it would hand every viewer a
    // fresh budget while old and new replicas run side by side.
    assert_eq!(Budgets::key(&viewer("buyer-1")), 0x82fe_86f2_7620_0880);
}

const AT: Moment = Moment(1_800_000_000_000);

/// A new window carries what was spent and not reported, and the
/// proportion this replica spent of the window before (out of 255,
/// rounded up) once two reports showed it; nothing else.
#[test]
fn a_new_window_carries_the_pending_and_the_proportion_spent_here() {
    let reported = |known, own, reports| Window {
        id: 6,
        known,
        own,
        pending: 5,
        reports,
        hint: 9,
    };
    let next = |window: Window| window.next(7);
    let carried = |hint| Window {
        id: 7,
        pending: 5,
        hint,
        ..Window::default()
    };
    assert_eq!(next(reported(60, 30, 2)), carried(128));
    assert_eq!(next(reported(60, 1, 2)).hint, 5);
    assert_eq!(next(reported(60, 60, 2)).hint, 255);
    // One report may not have shown the others' spends yet; none, nothing.
    assert_eq!(next(reported(60, 30, 1)).hint, 0);
    assert_eq!(next(reported(0, 0, 2)).hint, 0);
    assert_eq!(next(reported(0, 0, 0)), carried(0));
}

/// Before any report in a window, a replica's share is the proportion it
/// spent of the window before, when known; else an even share. After one
/// report, no more than that; after two, what it spent of the total.
#[test]
fn a_lease_follows_the_reports_of_its_window() {
    let window = |own, known, reports, hint| Window {
        own,
        known,
        reports,
        hint,
        ..Window::default()
    };
    assert_eq!(window(0, 0, 0, 0).lease(60, 4), 15);
    assert_eq!(window(0, 0, 0, 128).lease(60, 4), 31);
    assert_eq!(window(0, 0, 0, 255).lease(60, 4), 60);
    // One report: 30 of 40 says three quarters, but no more than even.
    assert_eq!(window(30, 40, 1, 0).lease(20, 4), 5);
    assert_eq!(window(10, 40, 1, 0).lease(20, 4), 5);
    assert_eq!(window(1, 40, 1, 0).lease(20, 4), 1);
    assert_eq!(window(30, 40, 1, 255).lease(20, 4), 15);
    // Two: what it spent of the total.
    assert_eq!(window(30, 40, 2, 0).lease(20, 4), 15);
    assert_eq!(window(30, 40, 2, 255).lease(20, 4), 15);
}

/// The entry point, on the wall clock: a budget of one passes one request,
/// refuses the next, and one that can never pass says so.
#[test]
fn the_check_takes_from_the_viewers_budget() {
    let budgets = Budgets::new(&sizes(1, 0)).unwrap();
    budgets.check(&viewer("buyer-1"), 1).unwrap();
    let second = budgets.check(&viewer("buyer-1"), 1);
    assert!(matches!(second, Err(Refusal::Spent { .. })));
    budgets.check(&viewer("buyer-2"), 1).unwrap();
    assert_eq!(budgets.check(&viewer("buyer-3"), 2), never(2, 1));
}

#[test]
fn alone_a_replica_spends_the_whole_budget_then_refuses_until_it_fits() {
    let budgets = Budgets::new(&sizes(3, 0)).unwrap();
    for _ in 0..3 {
        budgets.check_at(1, 1, AT).unwrap();
    }
    let Err(Refusal::Spent { retry_after_s }) = budgets.check_at(1, 1, AT) else {
        panic!("the fourth passed");
    };
    // 3 spent at the minute's start: in the next one, a third in.
    assert_eq!(retry_after_s, 60 + 20);
    budgets.check_at(2, 3, AT).unwrap();
    assert_eq!(budgets.check_at(3, 4, AT), never(4, 3));
}

#[test]
fn a_first_sight_in_a_fleet_takes_an_even_share() {
    let budgets = Budgets::new(&sizes(60, 0)).unwrap();
    budgets.replicas.store(4, Ordering::Relaxed);
    for _ in 0..15 {
        budgets.check_at(1, 1, AT).unwrap();
    }
    let past_the_share = "past the share until the next exchange";
    assert_eq!(budgets.check_at(1, 1, AT), spent(1), "{past_the_share}");
}

#[test]
fn the_day_budget_refuses_until_midnight() {
    let budgets = Budgets::new(&sizes(0, 2)).unwrap();
    budgets.check_at(1, 2, AT).unwrap();
    let Err(Refusal::Spent { retry_after_s }) = budgets.check_at(1, 1, AT) else {
        panic!("passed");
    };
    assert_eq!(retry_after_s, AT.rest_of_day().div_ceil(1000));
}

/// The table never holds more than its cap, also while nothing is ever
/// reported (the database down): a new viewer at the cap is refused and the
/// keeper woken, which evicts down to three quarters; then new viewers pass.
#[test]
fn the_ledgers_stay_under_their_cap_evicting_the_least_recently_used() {
    let budgets = Budgets::with_cap(&sizes(10, 100), 8).unwrap();
    let earlier = Moment(AT.0 - 5 * 60_000);
    for viewer in 1..=4 {
        budgets.check_at(viewer, 2, earlier).unwrap();
    }
    for viewer in 5..=8 {
        budgets.check_at(viewer, 1, AT).unwrap();
    }
    // The oldest of all, but refused by the fleet: evicted last.
    refuse_until(&budgets, 1, AT.seconds() + 600);
    assert_eq!(budgets.len(), 8);
    assert_eq!(budgets.check_at(9, 1, AT), spent(1));
    assert_eq!(budgets.len(), 8);
    // Known viewers still pass.
    budgets.check_at(5, 1, AT).unwrap();
    // The keeper was woken (a permit is stored).
    let woken = budgets.full.notified();
    tokio::pin!(woken);
    let permit = futures_util::FutureExt::now_or_never(woken.as_mut());
    assert!(permit.is_some(), "the keeper was not woken");

    assert_eq!(budgets.keep(AT), kept(0, 2, 4, 6));
    assert_eq!(budgets.viewers.len(), 6);
    let refused = budgets.viewers.contains_key(&1);
    assert!(refused, "the refused one was evicted");
    for viewer in 5..=8 {
        assert!(budgets.viewers.contains_key(&viewer), "{viewer}");
    }
    budgets.check_at(9, 1, AT).unwrap();
    budgets.check_at(10, 1, AT).unwrap();
    assert_eq!(budgets.len(), 8);

    // A report acknowledged the spends of viewers 9 and 10 (as the
    // exchange's `reported` does): nothing of theirs is pending.
    for viewer in [9, 10] {
        let mut ledger = budgets.viewers.get_mut(&viewer).unwrap();
        (ledger.minute.pending, ledger.day.pending) = (0, 0);
    }
    // Three minutes later, those two are idle and forgotten without loss;
    // the others still have spends pending (5 to 8) or a refusal in force
    // (1), so are not idle; six left, under three quarters: no eviction.
    let later = Moment(AT.0 + 3 * 60_000);
    assert_eq!(budgets.keep(later), kept(2, 0, 0, 6));
    assert!(!budgets.viewers.contains_key(&9));
    assert!(!budgets.viewers.contains_key(&10));
    assert_eq!(budgets.len(), 6);
    assert_eq!(budgets.len(), budgets.viewers.len());
}

/// What the exchange's report does to viewer `key`'s ledger when this
/// replica is the only one: its pending spends become the fleet's known
/// total.
fn reported_alone(budgets: &Budgets, key: u64) {
    let mut ledger = budgets.viewers.get_mut(&key).unwrap();
    let ledger = &mut *ledger;
    for window in [&mut ledger.minute, &mut ledger.day] {
        window.own += window.pending;
        window.known = window.own;
        window.pending = 0;
        window.reports = 2;
    }
}

/// A ledger moves to the windows of now: the minute before weighs by
/// what is left of it (the minute before that, nothing), and a new UTC
/// day starts with the day's budget whole.
#[test]
fn a_ledger_moves_to_the_windows_of_now() {
    let start = Moment(AT.0 - AT.into_minute());
    let at = |ms: u64| Moment(start.0 + ms);
    let spent_alone = |size: BudgetsConfig, items, at| {
        let budgets = Budgets::new(&size).unwrap();
        budgets.check_at(1, items, at).unwrap();
        reported_alone(&budgets, 1);
        budgets
    };
    let budgets = spent_alone(sizes(3, 0), 3, at(0));
    // The next minute's start: all 3 still weigh.
    assert!(budgets.check_at(1, 1, at(60_000)).is_err());
    // Halfway through it: 1.5 weigh, one more fits.
    budgets.check_at(1, 1, at(90_000)).unwrap();
    // Two minutes on, nothing of the first weighs.
    let budgets = spent_alone(sizes(3, 0), 3, at(0));
    budgets.check_at(1, 3, at(120_000)).unwrap();

    let midnight = Moment(AT.0 + AT.rest_of_day());
    let budgets = spent_alone(sizes(0, 2), 2, Moment(midnight.0 - 1));
    assert!(budgets.check_at(1, 1, Moment(midnight.0 - 1)).is_err());
    budgets.check_at(1, 2, midnight).unwrap();
    assert!(budgets.check_at(1, 1, midnight).is_err());
}

/// A refusal the fleet wrote holds the viewer until its second, whatever
/// the budgets here say, and says how long; at that second it is over.
#[test]
fn a_refusal_from_the_fleet_holds_until_its_second() {
    let budgets = Budgets::new(&sizes(10, 0)).unwrap();
    budgets.check_at(1, 1, AT).unwrap();
    refuse_until(&budgets, 1, AT.seconds() + 10);
    assert_eq!(budgets.check_at(1, 1, AT), spent(10));
    assert_eq!(budgets.check_at(1, 1, Moment(AT.0 + 9_000)), spent(1));
    budgets.check_at(1, 1, Moment(AT.0 + 10_000)).unwrap();
}

/// Refused by both budgets, the viewer is told the longer wait.
#[test]
fn refused_by_both_budgets_the_longer_wait_is_said() {
    let budgets = Budgets::new(&sizes(3, 3)).unwrap();
    budgets.check_at(1, 3, AT).unwrap();
    let midnight_s = AT.rest_of_day().div_ceil(1000);
    assert_eq!(budgets.check_at(1, 1, AT), spent(midnight_s));
}

#[test]
fn the_count_of_viewers_follows_the_table() {
    let budgets = Budgets::new(&sizes(10, 0)).unwrap();
    assert!(budgets.is_empty());
    assert_eq!(budgets.len(), 0);
    budgets.check_at(1, 1, AT).unwrap();
    assert!(!budgets.is_empty());
    assert_eq!(budgets.len(), 1);
}

/// The eviction order over every rank: the oldest first, those idle past
/// the ages told apart (an hour and more) as the oldest of all; the
/// refused after every one that is not, the oldest of them first, and one
/// refused this very minute last (the highest rank); a refusal that ends
/// this second no longer counts. The cut may fall inside a rank after a
/// whole one: only as many of it go as are over.
#[test]
fn eviction_takes_the_oldest_then_the_refused_and_only_as_many_as_are_over() {
    let budgets = Budgets::with_cap(&sizes(10, 100), 8).unwrap();
    let ago = |minutes: u64| Moment(AT.0 - minutes * 60_000);
    // (viewer, minutes since its last use, refused until)
    let refused = AT.seconds() + 600;
    let ledgers = [
        (1, 0, refused),
        (2, 5, refused),
        (3, 70, AT.seconds()),
        (4, 3, 0),
        (5, 3, 0),
        (6, 1, 0),
        (7, 1, 0),
        (8, 1, 0),
    ];
    for (viewer, minutes, until) in ledgers {
        budgets.check_at(viewer, 1, ago(minutes)).unwrap();
        refuse_until(&budgets, viewer, until);
    }
    assert_eq!(budgets.keep(AT), kept(0, 2, 2, 6));
    assert!(!budgets.viewers.contains_key(&3), "the oldest was kept");
    let of_3_minutes = [4, 5].map(|v| budgets.viewers.contains_key(&v));
    assert_eq!(of_3_minutes.iter().filter(|&&kept| kept).count(), 1);
    for viewer in [1, 2, 6, 7, 8] {
        assert!(budgets.viewers.contains_key(&viewer), "{viewer} evicted");
    }
}

/// A flood of distinct viewers, never reported: the table stays at the cap
/// between two keeper passes and at three quarters after each.
#[test]
fn a_flood_of_viewers_never_grows_the_table_past_its_cap() {
    let budgets = Budgets::with_cap(&sizes(0, 5), 1000).unwrap();
    let mut refused = 0;
    for round in 0..10u64 {
        for viewer in 0..700 {
            if budgets.check_at(round * 1000 + viewer, 1, AT).is_err() {
                refused += 1;
            }
            assert!(budgets.viewers.len() <= 1000);
        }
        let kept = budgets.keep(AT);
        assert_eq!(kept.ledgers, if round == 0 { 700 } else { 750 }, "{kept:?}");
    }
    assert!(refused > 0);
}
