//! The exchange task: every `rate_limit.exchange_interval_ms` it reports what
//! this replica's viewers spent (one upsert for all of them), learns the
//! fleet's totals back and with them each viewer's new share, writes the
//! refusals of viewers it saw cross a budget, and reads those others wrote.
//! At start it loads every refusal still in force before the replica counts
//! as primed (`/readyz`), so a restart hands nobody a fresh budget.
//!
//! The database down: the ledgers keep what was spent (reported once it is
//! back), shares are not renewed, so each replica holds a viewer to the share
//! it had (a metric and one log line say so); requests never wait on it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::window::{self, Moment, minute_fits, minute_wait, share};
use super::{Budgets, Window, clamp};
use crate::store::{BudgetStore, Spend, Total};

/// Replicas count as alive while they exchanged within this many seconds.
const ALIVE_S: u32 = 5;
/// How often (in exchanges, at most) the live replicas are counted.
const COUNT_REPLICAS_EVERY: Duration = Duration::from_secs(1);
/// How often idle viewers are forgotten and old rows pruned.
const FORGET_EVERY: Duration = Duration::from_secs(10);
const PRUNE_EVERY: Duration = Duration::from_secs(60);

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

/// Runs until `stop`, then reports what is left once.
pub async fn run(
    budgets: Arc<Budgets>,
    store: BudgetStore,
    interval: Duration,
    stop: CancellationToken,
) {
    let replica = getrandom::u64().unwrap_or_else(|_| Moment::now().0);
    let gauges = Gauges::new();
    gauges.up.set(1.0);
    // Load the refusals in force, retrying, before counting as primed.
    loop {
        let now = Moment::now();
        let loaded = async {
            budgets.set_replicas(store.replicas(replica, ALIVE_S).await?, &gauges);
            store.refusals(true, now.seconds()).await
        };
        match loaded.await {
            Ok(refusals) => {
                budgets.refused(&refusals, Moment::now());
                budgets.primed.store(true, Ordering::Release);
                break;
            }
            Err(error) => {
                tracing::warn!(%error, "viewer budgets: cannot load the refusals in force; retrying");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval.max(Duration::from_millis(500))) => {}
            () = stop.cancelled() => return,
        }
    }
    let mut state = State::default();
    let mut counted = tokio::time::Instant::now();
    let mut forgot = counted;
    let mut pruned = counted;
    let mut refusals: Vec<(u64, u64)> = Vec::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => break,
        }
        let now = Moment::now();
        let at = tokio::time::Instant::now();
        let ok = exchange(&budgets, &store, now, &mut refusals, &gauges).await;
        gauges.took.record(at.elapsed().as_secs_f64());
        state.after(ok, &gauges);
        if ok && at.duration_since(counted) >= COUNT_REPLICAS_EVERY {
            counted = at;
            if let Ok(n) = store.replicas(replica, ALIVE_S).await {
                budgets.set_replicas(n, &gauges);
            }
        }
        if at.duration_since(forgot) >= FORGET_EVERY {
            forgot = at;
            budgets.viewers.retain(|_, ledger| !ledger.is_idle(now));
            budgets.viewers.shrink_to_fit();
            gauges.viewers.set(budgets.viewers.len() as f64);
        }
        if ok && at.duration_since(pruned) >= PRUNE_EVERY {
            pruned = at;
            let (minute, day) = (now.minute(), now.day());
            if let Err(error) = store
                .prune(
                    minute.saturating_sub(2),
                    day.saturating_sub(1),
                    now.seconds(),
                )
                .await
            {
                tracing::warn!(%error, "viewer budgets: retention failed; retrying in a minute");
            }
        }
    }
    // Stopping: report what was spent since the last exchange, once, and the
    // refusals that report makes (the next replica to start loads them).
    let spends = budgets.take_spends();
    match store.report(&spends).await {
        Ok(totals) => refusals.extend(budgets.reported(&totals, Moment::now(), &gauges)),
        Err(error) => tracing::warn!(
            %error,
            viewers = spends.len(),
            "viewer budgets: the last spends could not be reported at shutdown"
        ),
    }
    if let Err(error) = store.refuse(&refusals).await {
        tracing::warn!(%error, "viewer budgets: the last refusals could not be written at shutdown");
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
    let spends = budgets.take_spends();
    match store.report(&spends).await {
        Ok(totals) => refusals.extend(budgets.reported(&totals, now, gauges)),
        Err(error) => {
            budgets.unreported(&spends);
            tracing::debug!(%error, "viewer budgets: report failed");
            return false;
        }
    }
    if !refusals.is_empty() {
        if let Err(error) = store.refuse(refusals).await {
            tracing::debug!(%error, "viewer budgets: refusals not written yet");
            return false;
        }
        refusals.clear();
    }
    if store.is_shared() {
        match store.refusals(false, now.seconds()).await {
            Ok(read) => budgets.refused(&read, Moment::now()),
            Err(error) => {
                tracing::debug!(%error, "viewer budgets: refusals not read");
                return false;
            }
        }
    }
    true
}

impl Budgets {
    fn set_replicas(&self, n: u32, gauges: &Gauges) {
        self.replicas.store(n.max(1), Ordering::Relaxed);
        gauges.replicas.set(f64::from(n));
    }

    /// Moves what was spent since the last report into the report under way.
    fn take_spends(&self) -> Vec<Spend> {
        let mut spends = Vec::new();
        for mut entry in self.viewers.iter_mut() {
            let viewer = *entry.key();
            let ledger = &mut *entry;
            for (kind, window) in [(0, &mut ledger.minute), (1, &mut ledger.day)] {
                if window.pending > 0 {
                    spends.push(Spend {
                        viewer,
                        kind,
                        window: window.id,
                        n: window.pending,
                    });
                    window.sending = window.sending.saturating_add(window.pending);
                    window.pending = 0;
                }
            }
        }
        spends
    }

    /// A report failed: what it carried is spent here again, to be reported
    /// next time (in the current window if the one it was for has passed).
    fn unreported(&self, spends: &[Spend]) {
        for spend in spends {
            if let Some(mut ledger) = self.viewers.get_mut(&spend.viewer) {
                let window = if spend.kind == 0 {
                    &mut ledger.minute
                } else {
                    &mut ledger.day
                };
                if window.id == spend.window {
                    window.pending = window.pending.saturating_add(window.sending);
                    window.sending = 0;
                } else {
                    window.pending = window.pending.saturating_add(spend.n);
                }
            }
        }
    }

    /// The fleet's totals after a report: renews each viewer's share and
    /// returns the viewers this report saw cross a budget, with the second
    /// until which every replica should refuse them.
    fn reported(&self, totals: &[Total], now: Moment, gauges: &Gauges) -> Vec<(u64, u64)> {
        let replicas = self.replicas.load(Ordering::Relaxed);
        let (per_minute, per_day) = (
            u64::from(self.limits.per_minute),
            u64::from(self.limits.per_day),
        );
        let mut crossed = Vec::new();
        for total in totals {
            let Some(mut ledger) = self.viewers.get_mut(&total.viewer) else {
                continue;
            };
            let ledger = &mut *ledger;
            let until_ms = if total.kind == 0 {
                if ledger.minute.id == total.window.wrapping_add(1) {
                    ledger.before = ledger.before.max(clamp(total.spent));
                    continue;
                }
                if ledger.minute.id != total.window || per_minute == 0 {
                    continue;
                }
                ledger.before = ledger.before.max(clamp(total.before));
                learn(&mut ledger.minute, total.spent);
                let before = u64::from(ledger.before);
                let into = now.into_minute();
                let remaining = per_minute.saturating_sub(window::minute_estimate(
                    before,
                    u64::from(ledger.minute.known),
                    into,
                ));
                renew(&mut ledger.minute, remaining, replicas);
                let spent = ledger.minute.spent();
                (!minute_fits(before, spent, 1, per_minute, into)).then(|| {
                    gauges
                        .overshoot
                        .record(spent.saturating_sub(per_minute) as f64);
                    minute_wait(before, spent, 1, per_minute, into).unwrap_or(0)
                })
            } else {
                if ledger.day.id != total.window || per_day == 0 {
                    continue;
                }
                learn(&mut ledger.day, total.spent);
                let remaining = per_day.saturating_sub(u64::from(ledger.day.known));
                renew(&mut ledger.day, remaining, replicas);
                let spent = ledger.day.spent();
                (spent >= per_day).then(|| {
                    gauges
                        .overshoot
                        .record(spent.saturating_sub(per_day) as f64);
                    now.rest_of_day()
                })
            };
            if let Some(until_ms) = until_ms {
                let until_s = (now.0 + until_ms).div_ceil(1000);
                if until_s > u64::from(ledger.refused_until_s) {
                    ledger.refused_until_s = clamp(until_s);
                    crossed.push((total.viewer, until_s));
                }
            }
        }
        crossed
    }

    /// Refusals written by this or another replica: each viewer is refused
    /// here until then.
    fn refused(&self, refusals: &[(u64, u64)], now: Moment) {
        let replicas = self.replicas.load(Ordering::Relaxed);
        for &(viewer, until_s) in refusals {
            let mut ledger = self.viewers.entry(viewer).or_default();
            ledger.roll(now, replicas, self.limits);
            ledger.refused_until_s = ledger.refused_until_s.max(clamp(until_s));
        }
    }
}

/// The report was taken: what was sent is this replica's, and the fleet's
/// total is known.
fn learn(window: &mut Window, total: u64) {
    window.own = window.own.saturating_add(window.sending);
    window.sending = 0;
    window.known = clamp(total).max(window.own);
}

/// This replica's share of what remains, until its next report.
fn renew(window: &mut Window, remaining: u64, replicas: u32) {
    window.lease = clamp(share(
        remaining,
        u64::from(window.own),
        u64::from(window.known),
        replicas,
    ));
}
