//! The exchange task: every `rate_limit.exchange_interval_ms` it reports this
//! replica's spends, learns the fleet's totals and refusals, and writes the
//! refusals it saw crossed; the keeper and retention run on the same task.
//! Faults and restarts: docs/budgets.md, "Faults".

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use std::collections::HashMap;

use super::window::{self, Moment, minute_fits, minute_wait};
use super::{Budgets, FORGET_EVERY, Ledger, count, low16};
use crate::store::{BudgetStore, Spend, Total};

/// Replicas count as alive while they exchanged within this many seconds.
const ALIVE_S: u32 = 5;
/// How often (in exchanges, at most) the live replicas are counted.
const COUNT_REPLICAS_EVERY: Duration = Duration::from_secs(1);
/// The shortest pause between tries to load the refusals in force at start, so
/// replicas facing a silent database do not ask it in a tight loop.
const PRIME_RETRY_MIN: Duration = Duration::from_millis(500);
/// Spends (or refusals) one statement reports at most: a few tens of
/// milliseconds of the database's time, far inside any statement bound.
pub const REPORT_CHUNK: usize = 5_000;
/// Spends one exchange reports at most; the rest stay pending for the next.
pub const REPORT_MAX: usize = 50_000;

struct Gauges {
    up: metrics::Gauge,
    lag: metrics::Gauge,
    replicas: metrics::Gauge,
    viewers: metrics::Gauge,
    took: metrics::Histogram,
    overshoot: metrics::Histogram,
}

impl Gauges {
    fn new() -> Self {
        Gauges {
            up: metrics::gauge!("phones_gateway_budget_database_up"),
            lag: metrics::gauge!("phones_gateway_budget_exchange_lag_seconds"),
            replicas: metrics::gauge!("phones_gateway_budget_replicas"),
            viewers: metrics::gauge!("phones_gateway_budget_viewers"),
            took: metrics::histogram!("phones_gateway_budget_exchange_seconds"),
            overshoot: metrics::histogram!("phones_gateway_budget_overshoot"),
        }
    }
}

/// Runs until `stop`, then reports what is left once, every
/// `rate_limit.exchange_interval_ms` (of the section the budgets hold).
pub async fn run(budgets: Arc<Budgets>, store: BudgetStore, stop: CancellationToken) {
    let replica = getrandom::u64().unwrap_or_else(|_| Moment::now().0);
    let gauges = Gauges::new();
    gauges.up.set(1.0);
    let exchanging = Exchanging {
        interval: budgets.config.exchange_interval,
        replica,
        budgets: &budgets,
        store: &store,
        gauges: &gauges,
        stop: &stop,
    };
    if !exchanging.prime().await {
        return;
    }
    tokio::join!(
        exchanging.exchanges(),
        exchanging.keeper(),
        super::retention::run(store.clone(), stop.clone())
    );
}

struct Exchanging<'a> {
    interval: Duration,
    replica: u64,
    budgets: &'a Budgets,
    store: &'a BudgetStore,
    gauges: &'a Gauges,
    stop: &'a CancellationToken,
}

impl Exchanging<'_> {
    /// Loads the refusals in force (retried) and counts the replica primed; false if stopped.
    async fn prime(&self) -> bool {
        let (budgets, store) = (self.budgets, self.store);
        loop {
            let now = Moment::now();
            let loaded = async {
                budgets.set_replicas(store.replicas(self.replica, ALIVE_S).await?, self.gauges);
                store.refusals(true, now.seconds()).await
            };
            match loaded.await {
                Ok(refusals) => {
                    budgets.refused(&refusals, Moment::now());
                    budgets.primed.store(true, Ordering::Release);
                    return true;
                }
                Err(error) => {
                    tracing::warn!(%error, "viewer budgets: cannot load the refusals in force; retrying");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval.max(PRIME_RETRY_MIN)) => {}
                () = self.stop.cancelled() => return false,
            }
        }
    }

    /// An exchange every interval (and a count of the live replicas at most
    /// every [`COUNT_REPLICAS_EVERY`]) until stopped, then the last report.
    async fn exchanges(&self) {
        let (budgets, store, gauges) = (self.budgets, self.store, self.gauges);
        let mut state = State::default();
        let mut counted = tokio::time::Instant::now();
        let mut refusals: Vec<(u64, u64)> = Vec::new();
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = self.stop.cancelled() => break,
            }
            let now = Moment::now();
            let at = tokio::time::Instant::now();
            let ok = exchange(budgets, store, now, &mut refusals, gauges).await;
            gauges.took.record(at.elapsed().as_secs_f64());
            state.after(ok, gauges);
            if ok && at.duration_since(counted) >= COUNT_REPLICAS_EVERY {
                counted = at;
                if let Ok(n) = store.replicas(self.replica, ALIVE_S).await {
                    budgets.set_replicas(n, gauges);
                }
            }
        }
        self.report_at_shutdown(refusals).await;
    }

    /// Stopping: reports what was spent since the last exchange and writes
    /// `refusals` (those not yet written) with the ones that report makes.
    async fn report_at_shutdown(&self, mut refusals: Vec<(u64, u64)>) {
        let (budgets, store) = (self.budgets, self.store);
        let now = Moment::now();
        let spends = budgets.take_spends(now, REPORT_MAX);
        for chunk in spends.chunks(REPORT_CHUNK) {
            match store.report(chunk).await {
                Ok(totals) => {
                    refusals.extend(budgets.reported(chunk, &totals, now, self.gauges));
                }
                Err(error) => {
                    tracing::warn!(%error, "viewer budgets: a report failed at shutdown");
                    break;
                }
            }
        }
        let left = budgets.take_spends(now, usize::MAX).len();
        if left > 0 {
            tracing::warn!(
                spends = left,
                "viewer budgets: spends not reported at shutdown (the database failed, or more than an exchange reports)"
            );
        }
        for chunk in refusals.chunks(REPORT_CHUNK) {
            if let Err(error) = store.refuse(chunk).await {
                tracing::warn!(%error, "viewer budgets: the last refusals could not be written at shutdown");
                break;
            }
        }
    }

    /// The keeper: holds the ledgers under their cap every [`FORGET_EVERY`],
    /// and at once when a new viewer finds the table full, until stopped.
    async fn keeper(&self) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(FORGET_EVERY) => {}
                () = self.budgets.full.notified() => {}
                () = self.stop.cancelled() => break,
            }
            let kept = self.budgets.keep(Moment::now());
            self.gauges.viewers.set(kept.ledgers as f64);
            if kept.evicted > 0 {
                tracing::warn!(
                    evicted = kept.evicted,
                    dropped = kept.dropped,
                    ledgers = kept.ledgers,
                    "viewer budgets: ledgers past three quarters of their cap; the least recently used were evicted, with the spends they had not reported"
                );
            }
        }
    }
}

/// Whether the database answered, for one log line per change.
#[derive(Default)]
struct State {
    down_since: Option<tokio::time::Instant>,
    last_ok: Option<tokio::time::Instant>,
}

impl State {
    fn after(&mut self, ok: bool, gauges: &Gauges) {
        let now = tokio::time::Instant::now();
        if ok {
            if let Some(since) = self.down_since.take() {
                tracing::info!(
                    down_for = ?since.elapsed(),
                    "viewer budgets: the database answers again; what was spent meanwhile is reported"
                );
            }
            self.last_ok = Some(now);
            gauges.up.set(1.0);
        } else if self.down_since.is_none() {
            self.down_since = Some(now);
            gauges.up.set(0.0);
            tracing::warn!(
                "viewer budgets: the database does not answer; each viewer is held to this replica's share until it does"
            );
        }
        gauges.lag.set(
            self.last_ok
                .map_or(0.0, |t| now.duration_since(t).as_secs_f64()),
        );
    }
}

/// One exchange; false when the database did not answer.
async fn exchange(
    budgets: &Budgets,
    store: &BudgetStore,
    now: Moment,
    refusals: &mut Vec<(u64, u64)>,
    gauges: &Gauges,
) -> bool {
    let spends = budgets.take_spends(now, REPORT_MAX);
    // Chunk by chunk: what a chunk reported is no longer pending, whatever
    // becomes of the next.
    for chunk in spends.chunks(REPORT_CHUNK) {
        match store.report(chunk).await {
            Ok(totals) => refusals.extend(budgets.reported(chunk, &totals, now, gauges)),
            Err(error) => {
                tracing::debug!(%error, "viewer budgets: report failed");
                return false;
            }
        }
    }
    while !refusals.is_empty() {
        let chunk = refusals.len().min(REPORT_CHUNK);
        if let Err(error) = store.refuse(&refusals[..chunk]).await {
            tracing::debug!(%error, "viewer budgets: refusals not written yet");
            return false;
        }
        refusals.drain(..chunk);
    }
    // Others' refusals (none on SQLite: one replica wrote them all).
    match store.refusals(false, now.seconds()).await {
        Ok(read) => budgets.refused(&read, Moment::now()),
        Err(error) => {
            tracing::debug!(%error, "viewer budgets: refusals not read");
            return false;
        }
    }
    true
}

impl Budgets {
    fn set_replicas(&self, n: u32, gauges: &Gauges) {
        self.replicas.store(n.max(1), Ordering::Relaxed);
        gauges.replicas.set(f64::from(n));
    }

    /// What was spent since the last acknowledged report, about `max` spends at
    /// most; pending until a report succeeds, so a failed one needs no undoing.
    fn take_spends(&self, now: Moment, max: usize) -> Vec<Spend> {
        let (minute, day) = (now.minute(), now.day());
        let mut spends = Vec::new();
        for entry in self.viewers.iter() {
            if spends.len() >= max {
                break;
            }
            let ledger = entry.value();
            for (kind, window, current) in [(0, &ledger.minute, minute), (1, &ledger.day, day)] {
                if window.pending > 0 {
                    // The full id back from its low bits: a few windows before `current`.
                    let back = u32::from(low16(current).wrapping_sub(window.id));
                    spends.push(Spend {
                        viewer: *entry.key(),
                        kind,
                        window: current.wrapping_sub(back),
                        n: u32::from(window.pending),
                    });
                }
            }
        }
        spends
    }

    /// The fleet's totals after a report of `spends`: updates the shares and
    /// returns the viewers this report saw cross a budget, with the second until
    /// which every replica should refuse them.
    fn reported(
        &self,
        spends: &[Spend],
        totals: &[Total],
        now: Moment,
        gauges: &Gauges,
    ) -> Vec<(u64, u64)> {
        let sent: HashMap<(u64, u8, u32), u32> = spends
            .iter()
            .map(|s| ((s.viewer, s.kind, s.window), s.n))
            .collect();
        let mut crossed = Vec::new();
        for total in totals {
            let Some(n) = sent.get(&(total.viewer, total.kind, total.window)) else {
                continue;
            };
            let Some(mut ledger) = self.viewers.get_mut(&total.viewer) else {
                continue;
            };
            let Some(until_ms) =
                self.apply_total(&mut ledger, total, count(u64::from(*n)), now, gauges)
            else {
                continue;
            };
            let until_s = (now.0 + until_ms).div_ceil(1000);
            if until_s > u64::from(ledger.refused_until_s) {
                ledger.refused_until_s = u32::try_from(until_s).unwrap_or(u32::MAX);
                crossed.push((total.viewer, until_s));
            }
        }
        crossed
    }

    /// Applies the fleet's `total` of a window after a report that sent `n` of
    /// it; returns how long from `now` to refuse the viewer if it crossed its budget.
    fn apply_total(
        &self,
        ledger: &mut Ledger,
        total: &Total,
        n: u16,
        now: Moment,
        gauges: &Gauges,
    ) -> Option<u64> {
        let (id, next) = (low16(total.window), low16(total.window.wrapping_add(1)));
        let window = if total.kind == 0 {
            &mut ledger.minute
        } else {
            &mut ledger.day
        };
        if window.id == next {
            // Reported for the window before, after the ledger moved on: it counts there.
            window.pending = window.pending.saturating_sub(n);
            if total.kind == 0 {
                ledger.before = ledger.before.max(count(total.spent));
            }
            return None;
        }
        if window.id != id {
            return None;
        }
        window.pending = window.pending.saturating_sub(n);
        window.own = window.own.saturating_add(n);
        window.reports = window.reports.saturating_add(1).min(2);
        window.known = count(total.spent).max(window.own);
        let spent = window.spent();
        if total.kind == 0 {
            let per_minute = u64::from(self.config.per_viewer_per_minute);
            if per_minute == 0 {
                return None;
            }
            ledger.before = ledger.before.max(count(total.before));
            let (before, into) = (u64::from(ledger.before), now.into_minute());
            (!minute_fits(before, spent, 1, per_minute, into)).then(|| {
                gauges.overshoot.record(
                    window::minute_estimate(before, spent, into).saturating_sub(per_minute) as f64,
                );
                minute_wait(before, spent, 1, per_minute, into).unwrap_or(0)
            })
        } else {
            let per_day = u64::from(self.config.per_viewer_per_day);
            if per_day == 0 {
                return None;
            }
            (spent >= per_day).then(|| {
                gauges
                    .overshoot
                    .record(spent.saturating_sub(per_day) as f64);
                now.rest_of_day()
            })
        }
    }

    /// Refusals written by this or another replica: each viewer is refused here until then.
    fn refused(&self, refusals: &[(u64, u64)], now: Moment) {
        for &(viewer, until_s) in refusals {
            // A viewer new here, the table full: read again by the next
            // exchanges for a few seconds, and refused then.
            let Some(mut ledger) = self.ledger(viewer) else {
                continue;
            };
            ledger.roll(now);
            ledger.refused_until_s = ledger
                .refused_until_s
                .max(u32::try_from(until_s).unwrap_or(u32::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::MAX_LEDGERS;
    use crate::budget::Refusal;
    use crate::budget::tests::{sizes, spent};

    const AT: Moment = Moment(1_800_000_000_000 + 5_000);

    fn admitted(budgets: &Budgets, key: u64, now: Moment) -> u32 {
        let mut n = 0;
        while budgets.check_at(key, 1, now).is_ok() {
            n += 1;
        }
        n
    }

    /// The fleet's total `spent` of viewer 1's window `window` of `kind`.
    fn total(kind: u8, window: u32, spent: u64) -> Total {
        let (viewer, before) = (1, 0);
        Total {
            viewer,
            kind,
            window,
            spent,
            before,
        }
    }

    fn report(budgets: &Budgets, total: u64, now: Moment) -> Vec<(u64, u64)> {
        let spends = budgets.take_spends(now, usize::MAX);
        let totals: Vec<Total> = spends
            .iter()
            .map(|s| Total {
                viewer: s.viewer,
                ..self::total(s.kind, s.window, total)
            })
            .collect();
        budgets.reported(&spends, &totals, now, &Gauges::new())
    }

    async fn scratch() -> (tempfile::TempDir, BudgetStore) {
        let (dir, database) = crate::store::Database::scratch().await;
        (dir, database.budgets())
    }

    #[test]
    fn a_share_follows_the_totals_only_once_two_reports_show_it() {
        let budgets = Budgets::new(&sizes(60, 0)).unwrap();
        budgets.replicas.store(4, Ordering::Relaxed);
        // First sight: an even share of 60 over 4.
        assert_eq!(admitted(&budgets, 1, AT), 15);
        // The first report shows only this replica's 15: others may not have
        // reported yet, so still an even share of the 45 left.
        assert!(report(&budgets, 15, AT).is_empty());
        assert_eq!(admitted(&budgets, 1, AT), 12);
        // The second shows it alone: all that remains (60 - 27).
        assert!(report(&budgets, 27, AT).is_empty());
        assert_eq!(admitted(&budgets, 1, AT), 33);
        // The third crosses the budget: a refusal for the fleet, until the
        // sliding minute lets one more in.
        let crossed = report(&budgets, 60, AT);
        assert_eq!(crossed.len(), 1);
        assert!(crossed[0].1 > AT.seconds() + 55, "{crossed:?}");
        assert!(matches!(
            budgets.check_at(1, 1, AT),
            Err(Refusal::Spent { retry_after_s }) if retry_after_s > 55
        ));
    }

    #[test]
    fn spread_over_replicas_a_share_is_what_this_one_spent_of_the_total() {
        let budgets = Budgets::new(&sizes(0, 100)).unwrap();
        budgets.replicas.store(4, Ordering::Relaxed);
        assert_eq!(admitted(&budgets, 1, AT), 25);
        report(&budgets, 40, AT);
        // One report: min(60 x 25/40, 60 / 4) = 15.
        assert_eq!(admitted(&budgets, 1, AT), 15);
        // Two: this replica spent 40 of 80: half of the 20 left.
        report(&budgets, 80, AT);
        assert_eq!(admitted(&budgets, 1, AT), 10);
        // A failed report changes nothing: the spends stay pending.
        let pending = budgets.take_spends(AT, usize::MAX);
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].n, 10);
        assert_eq!(budgets.take_spends(AT, usize::MAX), pending);
    }

    /// Only the budgets that are on are counted and reported: with the day's
    /// off, a spend is the minute's alone (and the other way round above).
    #[test]
    fn a_budget_that_is_off_is_not_reported() {
        let budgets = Budgets::new(&sizes(10, 0)).unwrap();
        budgets.check_at(1, 3, AT).unwrap();
        let spends = budgets.take_spends(AT, usize::MAX);
        assert_eq!(spends.len(), 1, "{spends:?}");
        assert_eq!((spends[0].kind, spends[0].n), (0, 3));
    }

    /// `take_spends` stops near its bound, a viewer's two windows together.
    #[test]
    fn spends_are_taken_up_to_a_bound() {
        let budgets = Budgets::new(&sizes(10, 10)).unwrap();
        for viewer in 0..10 {
            budgets.check_at(viewer, 1, AT).unwrap();
        }
        assert_eq!(budgets.take_spends(AT, usize::MAX).len(), 20);
        assert_eq!(budgets.take_spends(AT, 5).len(), 6);
        assert_eq!(budgets.take_spends(AT, 1).len(), 2);
    }

    /// A replica counts as primed only once the refusals in force are
    /// loaded: a viewer another replica refused is refused here from its
    /// first request after that.
    #[tokio::test]
    async fn primed_once_the_refusals_in_force_are_loaded() {
        let (_dir, store) = scratch().await;
        let viewer = 7;
        let until_s = Moment::now().seconds() + 600;
        store.refuse(&[(viewer, until_s)]).await.unwrap();
        let budgets = Budgets::new(&sizes(10, 10)).unwrap();
        assert!(!budgets.is_primed(), "primed before the task ran");
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(budgets.clone(), store, stop.clone()));
        until_primed(&budgets).await;
        let checked = budgets.check_at(viewer, 1, Moment::now());
        let refused = matches!(checked, Err(Refusal::Spent { .. }));
        assert!(refused, "the refusal in force was not loaded");
        assert!(budgets.check_at(8, 1, Moment::now()).is_ok());
        stop.cancel();
        task.await.unwrap();
    }

    /// Waits (at most `within`, polling) until `done`; else fails saying `late`.
    async fn until(late: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
        let start = tokio::time::Instant::now();
        while !done().await {
            assert!(start.elapsed() < within, "{late}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (at most 10 s) until the task has loaded the refusals in force.
    async fn until_primed(budgets: &Budgets) {
        let primed = async || budgets.is_primed();
        until("not primed within 10 s", Duration::from_secs(10), primed).await;
    }

    /// The task on a scratch SQLite store, `interval` between exchanges, once
    /// primed: its budgets (a minute's only, at most `cap` ledgers) and handles.
    async fn running(
        interval: Duration,
        cap: usize,
    ) -> (
        tempfile::TempDir,
        Arc<Budgets>,
        BudgetStore,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let (dir, store) = scratch().await;
        let mut config = sizes(10, 0);
        config.exchange_interval = interval;
        let budgets = Budgets::with_cap(&config, cap).unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(budgets.clone(), store.clone(), stop.clone()));
        until_primed(&budgets).await;
        (dir, budgets, store, stop, task)
    }

    /// Running, the task reports what was spent every interval.
    #[tokio::test]
    async fn the_task_reports_what_was_spent_every_interval() {
        let (_dir, budgets, store, stop, task) =
            running(Duration::from_millis(50), MAX_LEDGERS).await;
        budgets.check_at(1, 3, Moment::now()).unwrap();
        let reported = async || store.rows().await.unwrap() == (1, 0, 0);
        until(
            "not reported within 10 s",
            Duration::from_secs(10),
            reported,
        )
        .await;
        assert!(budgets.take_spends(Moment::now(), usize::MAX).is_empty());
        stop.cancel();
        task.await.unwrap();
    }

    /// Stopped, the task reports what was spent since its last exchange (here
    /// before its first: the interval is longer than the test).
    #[tokio::test]
    async fn the_task_reports_what_is_left_when_stopped() {
        let (_dir, budgets, store, stop, task) =
            running(Duration::from_secs(3600), MAX_LEDGERS).await;
        budgets.check_at(1, 3, Moment::now()).unwrap();
        stop.cancel();
        task.await.unwrap();
        assert_eq!(store.rows().await.unwrap(), (1, 0, 0));
        assert!(budgets.take_spends(Moment::now(), usize::MAX).is_empty());
    }

    /// A new viewer that finds the table full is refused and wakes the
    /// keeper, which evicts down to three quarters of the cap at once (not
    /// at its next round, [`FORGET_EVERY`] away).
    #[tokio::test]
    async fn a_full_table_wakes_the_keeper() {
        let (_dir, budgets, _store, stop, task) = running(Duration::from_secs(3600), 8).await;
        for viewer in 1..=8 {
            budgets.check_at(viewer, 1, Moment::now()).unwrap();
        }
        let ninth = budgets.check_at(9, 1, Moment::now());
        assert!(ninth.is_err(), "a ninth ledger");
        let evicted = async || budgets.len() <= 6;
        until("not evicted at once", FORGET_EVERY / 2, evicted).await;
        stop.cancel();
        task.await.unwrap();
    }

    /// `phones_gateway_budget_database_up` follows each exchange's outcome:
    /// 1 once the database answered, 0 from the exchange it did not.
    #[test]
    fn the_database_gauge_follows_each_exchange() {
        let render = |outcomes: &[bool]| {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            metrics::with_local_recorder(&recorder, || {
                let gauges = Gauges::new();
                let mut state = State::default();
                for &ok in outcomes {
                    state.after(ok, &gauges);
                }
            });
            handle.render()
        };
        let up = "phones_gateway_budget_database_up ";
        for (outcomes, gauge) in [
            (&[true][..], 1),
            (&[true, false], 0),
            (&[true, false, true], 1),
        ] {
            let metrics = render(outcomes);
            assert!(metrics.contains(&format!("{up}{gauge}\n")), "{metrics}");
        }
    }

    /// A report whose total crosses the day's budget refuses the viewer until
    /// midnight and returns that refusal to be written; a later report of the
    /// same refusal returns nothing new to write.
    #[test]
    fn a_report_crossing_the_day_refuses_until_midnight_once() {
        let budgets = Budgets::new(&sizes(0, 10)).unwrap();
        budgets.check_at(1, 2, AT).unwrap();
        let spends = budgets.take_spends(AT, usize::MAX);
        assert_eq!(spends.len(), 1);
        let totals = [total(1, AT.day(), 10)];
        let midnight_s = (AT.0 + AT.rest_of_day()) / 1000;
        let gauges = Gauges::new();
        let refusals = budgets.reported(&spends, &totals, AT, &gauges);
        assert_eq!(refusals, vec![(1, midnight_s)]);
        let retry_after_s = AT.rest_of_day().div_ceil(1000);
        assert_eq!(budgets.check_at(1, 1, AT), spent(retry_after_s));
        assert_eq!(budgets.reported(&spends, &totals, AT, &gauges), vec![]);
    }

    /// A minute's total reported after the ledger moved to the next minute
    /// counts there as the minute before: the fleet spent the budget, so the
    /// viewer is refused at the start of the next minute.
    #[test]
    fn a_late_minute_total_weighs_as_the_minute_before() {
        let budgets = Budgets::new(&sizes(10, 0)).unwrap();
        budgets.check_at(1, 2, AT).unwrap();
        let spends = budgets.take_spends(AT, usize::MAX);
        let next = Moment((AT.minute() as u64 + 1) * 60_000);
        budgets.check_at(1, 1, next).unwrap();
        let totals = [total(0, AT.minute(), 10)];
        let refusals = budgets.reported(&spends, &totals, next, &Gauges::new());
        assert_eq!(refusals, vec![]);
        let weighed = budgets.check_at(1, 1, next).is_err();
        assert!(weighed, "the fleet's 10 of the minute before not weighed");
    }

    /// The count of live replicas sets the shares: four, a quarter each;
    /// none counted (a database that has not seen this one yet), this one.
    #[test]
    fn the_count_of_replicas_sets_the_shares() {
        for (replicas, share) in [(4, 25), (0, 100)] {
            let budgets = Budgets::new(&sizes(0, 100)).unwrap();
            budgets.set_replicas(replicas, &Gauges::new());
            assert_eq!(admitted(&budgets, 1, AT), share, "{replicas} replicas");
        }
    }

    /// A ledger is forgotten only once idle for over a minute: in the minute
    /// after its last use it still holds what that minute weighs.
    #[test]
    fn a_ledger_is_forgotten_only_after_a_minute_idle() {
        let budgets = Budgets::new(&sizes(60, 0)).unwrap();
        budgets.check_at(1, 3, AT).unwrap();
        report(&budgets, 3, AT);
        assert!(budgets.take_spends(AT, usize::MAX).is_empty());
        for now in [AT, Moment(AT.0 + 60_000)] {
            assert_eq!(budgets.keep(now).forgotten, 0, "forgotten at {now:?}");
            assert_eq!(budgets.len(), 1);
        }
        assert_eq!(budgets.keep(Moment(AT.0 + 120_000)).forgotten, 1);
        assert!(budgets.is_empty());
    }

    /// A backlog larger than an exchange reports (as after an outage) goes in
    /// bounded exchanges of bounded statements, and every spend reaches the
    /// fleet's totals exactly once.
    #[tokio::test]
    async fn a_backlog_is_reported_a_bounded_amount_an_exchange() {
        let (_dir, store) = scratch().await;
        let budgets = Budgets::new(&sizes(10, 10)).unwrap();
        let viewers = 40_000u64;
        for viewer in 0..viewers {
            budgets.check_at(viewer, 1, AT).unwrap();
        }
        let gauges = Gauges::new();
        let mut refusals = Vec::new();
        let mut exchanges = 0;
        while !budgets.take_spends(AT, 1).is_empty() {
            let before = budgets.take_spends(AT, usize::MAX).len();
            assert!(exchange(&budgets, &store, AT, &mut refusals, &gauges).await);
            let after = budgets.take_spends(AT, usize::MAX).len();
            assert!(before - after <= REPORT_MAX + 1, "{before} -> {after}");
            exchanges += 1;
            assert!(exchanges <= 3, "more exchanges than the backlog needs");
        }
        assert_eq!(exchanges, 2);
        assert_eq!(store.rows().await.unwrap(), (viewers, viewers, 0));
    }
}
