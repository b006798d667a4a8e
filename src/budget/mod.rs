//! Viewer budgets, the fleet's: how many numbers a viewer (`X-Viewer-Id`) may be
//! shown per minute and per UTC day on any replica. A request never waits on the
//! database: each replica spends alone within its share, and its [`exchange`]
//! task learns the fleet's totals. See docs/budgets.md.

pub mod exchange;
pub mod retention;
#[cfg(test)]
mod tests;
pub mod window;

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use crate::config::BudgetsConfig;
use crate::domain::Viewer;
use window::{Moment, minute_wait, share};

/// The viewers' fleet keys: the same 64-bit hash of an id on every replica and
/// version (a test pins it). Not keyed: viewer ids come from the trusted backend.
const FLEET_SEED: u64 = 0x7068_6f6e_6573_6777;

/// Ledgers a replica holds at most (docs/budgets.md, "Memory and the database").
pub const MAX_LEDGERS: usize = 1_000_000;
/// How often idle ledgers are forgotten (and, past the cap's three quarters,
/// the least recently used evicted); sooner when the table is full.
pub const FORGET_EVERY: Duration = Duration::from_secs(10);
/// Ages (minutes since a ledger's last use) told apart when evicting; older count as this.
const AGES: usize = 64;

/// Why a request was refused, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Past a budget (or this replica's share of it) for `retry_after_s`.
    Spent { retry_after_s: u64 },
    /// More items than a budget holds: the request can never pass.
    Never {
        items: u32,
        budget: u32,
        per: &'static str,
    },
}

/// Which rule refused, for the metric.
#[derive(Debug, Clone, Copy)]
enum By {
    Minute,
    Day,
    Share,
    Fleet,
    /// A viewer new to a table at [`MAX_LEDGERS`].
    Full,
}

/// One budget window of one viewer, as this replica knows it. Counts are 16
/// bits (budgets are at most 65,535: see the config), saturating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Window {
    /// Minutes or days since the epoch, the low 16 bits: a ledger is
    /// forgotten minutes after its last use, long before they wrap.
    id: u16,
    /// The fleet's total, as of this replica's last report (its own included).
    known: u16,
    /// What this replica reported in this window.
    own: u16,
    /// Spent here and not yet taken by a report (in flight included).
    pending: u16,
    /// This replica's reports in this window (up to 2).
    reports: u8,
    /// The proportion this replica spent of the window before, out of 255
    /// (0: none known): its share until this window's totals say otherwise.
    hint: u8,
}

impl Window {
    fn spent(&self) -> u64 {
        u64::from(self.known) + u64::from(self.pending)
    }

    /// This replica's share of `remaining` beyond what the fleet knew: at most an
    /// even one after one report, in proportion ([`share`]) after two.
    fn lease(&self, remaining: u64, replicas: u32) -> u64 {
        let even = if self.hint > 0 {
            (remaining * u64::from(self.hint)).div_ceil(255)
        } else {
            share(remaining, 0, 0, replicas)
        };
        let proportional = share(
            remaining,
            u64::from(self.own),
            u64::from(self.known),
            replicas,
        );
        match self.reports {
            0 => even,
            1 => proportional.min(even),
            _ => proportional,
        }
    }

    /// The next window, with what was spent here and not reported carried
    /// into it, and the proportion this replica spent of this one.
    fn next(self, id: u16) -> Window {
        let hint = if self.known == 0 || self.reports < 2 {
            0
        } else {
            u8::try_from(
                (u32::from(self.own.min(self.known)) * 255).div_ceil(u32::from(self.known)),
            )
            .unwrap_or(u8::MAX)
        };
        Window {
            id,
            pending: self.pending,
            hint,
            ..Window::default()
        }
    }
}

/// What a replica knows of one viewer: 28 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Ledger {
    minute: Window,
    day: Window,
    /// The fleet's total of the minute before `minute.id`.
    before: u16,
    /// Refused (by a budget crossed anywhere) until this second.
    refused_until_s: u32,
}

/// The viewers' ledgers and what the exchange learned of the fleet.
pub struct Budgets {
    config: BudgetsConfig,
    viewers: DashMap<u64, Ledger, foldhash::fast::RandomState>,
    /// Live replicas sharing the database (1 on SQLite or until known).
    replicas: AtomicU32,
    /// The refusals in force were loaded (at start): until then this replica
    /// could hand a refused viewer a fresh share.
    primed: AtomicBool,
    /// Ledgers in `viewers`, kept beside it (a `DashMap`'s `len` locks every
    /// shard): checked when a viewer is new.
    ledgers: AtomicUsize,
    /// [`MAX_LEDGERS`], smaller in tests.
    max_ledgers: usize,
    /// Woken when a new viewer finds the table full: room is made at once.
    full: tokio::sync::Notify,
    metrics: Metrics,
}

struct Metrics {
    limited: metrics::Counter,
    minute: metrics::Counter,
    day: metrics::Counter,
    share: metrics::Counter,
    fleet: metrics::Counter,
    full: metrics::Counter,
    evicted: metrics::Counter,
    dropped: metrics::Counter,
}

/// What one [`Budgets::keep`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kept {
    /// Idle ledgers forgotten (nothing lost).
    pub forgotten: usize,
    /// Ledgers evicted past three quarters of the cap.
    pub evicted: usize,
    /// Reveals spent on evicted ledgers and never reported: the fleet's
    /// totals never count them.
    pub dropped: u64,
    pub ledgers: usize,
}

impl Budgets {
    /// The budgets of `[rate_limit]`; `None` when both are off.
    pub fn new(config: &BudgetsConfig) -> Option<Arc<Budgets>> {
        Self::with_cap(config, MAX_LEDGERS)
    }

    /// As [`Budgets::new`], holding at most `max_ledgers` ledgers.
    pub fn with_cap(config: &BudgetsConfig, max_ledgers: usize) -> Option<Arc<Budgets>> {
        config.enabled().then(|| {
            let refused = |budget: &'static str| {
                metrics::counter!("phones_gateway_budget_refused_total", "budget" => budget)
            };
            Arc::new(Budgets {
                config: *config,
                viewers: DashMap::with_hasher(foldhash::fast::RandomState::default()),
                replicas: AtomicU32::new(1),
                primed: AtomicBool::new(false),
                ledgers: AtomicUsize::new(0),
                max_ledgers: max_ledgers.max(4),
                full: tokio::sync::Notify::new(),
                metrics: Metrics {
                    limited: metrics::counter!("phones_gateway_rate_limited_total"),
                    minute: refused("minute"),
                    day: refused("day"),
                    share: refused("share"),
                    fleet: refused("fleet"),
                    full: refused("full"),
                    evicted: metrics::counter!("phones_gateway_budget_ledgers_evicted_total"),
                    dropped: metrics::counter!("phones_gateway_budget_spends_dropped_total"),
                },
            })
        })
    }

    /// The viewer's key, the same on every replica.
    pub fn key(viewer: &Viewer) -> u64 {
        foldhash::fast::FixedState::with_seed(FLEET_SEED).hash_one(viewer.as_str().as_bytes())
    }

    /// Takes `items` from the viewer's budgets, or says why not (past a budget or
    /// this replica's share, or more than a budget holds). Never waits.
    pub fn check(&self, viewer: &Viewer, items: u32) -> Result<(), Refusal> {
        self.check_at(Self::key(viewer), items, Moment::now())
    }

    fn check_at(&self, key: u64, items: u32, now: Moment) -> Result<(), Refusal> {
        for (budget, per) in [
            (self.config.per_viewer_per_minute, "minute"),
            (self.config.per_viewer_per_day, "day"),
        ] {
            if budget > 0 && items > budget {
                return Err(Refusal::Never { items, budget, per });
            }
        }
        let replicas = self.replicas.load(Ordering::Relaxed);
        let Some(mut ledger) = self.ledger(key) else {
            return Err(self.refuse(By::Full, 1000));
        };
        ledger.roll(now);
        match ledger.spend(now, items, &self.config, replicas) {
            Ok(()) => Ok(()),
            Err((by, wait_ms)) => {
                drop(ledger);
                Err(self.refuse(by, wait_ms))
            }
        }
    }

    fn refuse(&self, by: By, wait_ms: u64) -> Refusal {
        self.metrics.limited.increment(1);
        match by {
            By::Minute => &self.metrics.minute,
            By::Day => &self.metrics.day,
            By::Share => &self.metrics.share,
            By::Fleet => &self.metrics.fleet,
            By::Full => &self.metrics.full,
        }
        .increment(1);
        Refusal::Spent {
            retry_after_s: wait_ms.div_ceil(1000).max(1),
        }
    }

    /// The viewer's ledger, made if new; `None` for a new viewer when the
    /// table holds [`MAX_LEDGERS`] (the keeper is woken to make room).
    fn ledger(&self, key: u64) -> Option<dashmap::mapref::one::RefMut<'_, u64, Ledger>> {
        match self.viewers.entry(key) {
            Entry::Occupied(ledger) => Some(ledger.into_ref()),
            Entry::Vacant(vacant) => {
                if self.ledgers.load(Ordering::Relaxed) >= self.max_ledgers {
                    drop(vacant);
                    self.full.notify_one();
                    return None;
                }
                self.ledgers.fetch_add(1, Ordering::Relaxed);
                Some(vacant.insert(Ledger::default()))
            }
        }
    }

    /// Forgets idle ledgers, then past three quarters of the cap evicts the least
    /// recently used (docs/budgets.md, "Memory and the database"). Runs every
    /// [`FORGET_EVERY`] and at once when a new viewer found it full.
    pub fn keep(&self, now: Moment) -> Kept {
        let mut kept = Kept::default();
        self.viewers.retain(|_, ledger| {
            let idle = ledger.is_idle(now);
            kept.forgotten += usize::from(idle);
            !idle
        });
        self.ledgers.fetch_sub(kept.forgotten, Ordering::Relaxed);
        let target = self.max_ledgers / 4 * 3;
        let over = self.ledgers.load(Ordering::Relaxed).saturating_sub(target);
        if over > 0 {
            // Eviction order: a rank per (refused, age), lowest first.
            let rank = |ledger: &Ledger| {
                let age = usize::from(low16(now.minute()).wrapping_sub(ledger.minute.id));
                let refused = u64::from(ledger.refused_until_s) > now.seconds();
                usize::from(refused) * AGES + (AGES - 1 - age.min(AGES - 1))
            };
            let mut counts = [0usize; 2 * AGES];
            for entry in self.viewers.iter() {
                counts[rank(entry.value())] += 1;
            }
            let (mut cut, mut partial, mut below) = (counts.len(), 0, 0);
            for (r, &n) in counts.iter().enumerate() {
                if below + n >= over {
                    (cut, partial) = (r, over - below);
                    break;
                }
                below += n;
            }
            self.viewers.retain(|_, ledger| {
                let r = rank(ledger);
                let evict = r < cut || (r == cut && partial > 0);
                if evict {
                    if r == cut {
                        partial -= 1;
                    }
                    kept.evicted += 1;
                    kept.dropped += u64::from(ledger.minute.pending.max(ledger.day.pending));
                }
                !evict
            });
            self.ledgers.fetch_sub(kept.evicted, Ordering::Relaxed);
            self.metrics.evicted.increment(kept.evicted as u64);
            self.metrics.dropped.increment(kept.dropped);
        }
        self.viewers.shrink_to_fit();
        kept.ledgers = self.ledgers.load(Ordering::Relaxed);
        kept
    }

    pub fn len(&self) -> usize {
        self.ledgers.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the refusals in force have been loaded since start.
    pub fn is_primed(&self) -> bool {
        self.primed.load(Ordering::Acquire)
    }
}

fn low16(id: u32) -> u16 {
    // The low bits: only compared for equality and short distances.
    #[allow(clippy::cast_possible_truncation, reason = "the low 16 bits are meant")]
    let low = id as u16;
    low
}

fn count(n: u64) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

impl Ledger {
    /// Moves to the windows `now` falls in, carrying what is unreported (a reveal
    /// near a boundary may count in the next window, never in none).
    fn roll(&mut self, now: Moment) {
        let minute = low16(now.minute());
        if self.minute.id != minute {
            self.before = if self.minute.id.wrapping_add(1) == minute {
                count(self.minute.spent())
            } else {
                0
            };
            self.minute = self.minute.next(minute);
        }
        let day = low16(now.day());
        if self.day.id != day {
            self.day = self.day.next(day);
        }
    }

    /// Takes `n` if every budget and this replica's share allow it; else the
    /// rule that refused and the milliseconds until the request would fit.
    fn spend(
        &mut self,
        now: Moment,
        n: u32,
        limits: &BudgetsConfig,
        replicas: u32,
    ) -> Result<(), (By, u64)> {
        let now_s = now.seconds();
        if u64::from(self.refused_until_s) > now_s {
            return Err((By::Fleet, (u64::from(self.refused_until_s) - now_s) * 1000));
        }
        let n = u64::from(n);
        let mut refused: Option<(By, u64)> = None;
        let mut refuse = |by: By, wait: u64| {
            if refused.is_none_or(|(_, w)| wait > w) {
                refused = Some((by, wait));
            }
        };
        // A share refusal lasts until the next report renews the share.
        let share_wait = 1000;
        if limits.per_viewer_per_minute > 0 {
            let (budget, before, into) = (
                u64::from(limits.per_viewer_per_minute),
                u64::from(self.before),
                now.into_minute(),
            );
            let wait =
                minute_wait(before, self.minute.spent(), n, budget, into).unwrap_or(u64::MAX);
            let remaining = budget.saturating_sub(window::minute_estimate(
                before,
                u64::from(self.minute.known),
                into,
            ));
            if wait > 0 {
                refuse(By::Minute, wait);
            } else if u64::from(self.minute.pending) + n > self.minute.lease(remaining, replicas) {
                refuse(By::Share, share_wait);
            }
        }
        if limits.per_viewer_per_day > 0 {
            let budget = u64::from(limits.per_viewer_per_day);
            let remaining = budget.saturating_sub(u64::from(self.day.known));
            if self.day.spent() + n > budget {
                refuse(By::Day, now.rest_of_day());
            } else if u64::from(self.day.pending) + n > self.day.lease(remaining, replicas) {
                refuse(By::Share, share_wait);
            }
        }
        if let Some(refused) = refused {
            return Err(refused);
        }
        // Only the budgets that are on are counted (and reported).
        if limits.per_viewer_per_minute > 0 {
            self.minute.pending = count(u64::from(self.minute.pending) + n);
        }
        if limits.per_viewer_per_day > 0 {
            self.day.pending = count(u64::from(self.day.pending) + n);
        }
        Ok(())
    }

    /// Whether the exchange may forget this viewer: idle for over a minute,
    /// nothing unreported, refused by nobody.
    fn is_idle(&self, now: Moment) -> bool {
        low16(now.minute()).wrapping_sub(self.minute.id) > 1
            && self.minute.pending == 0
            && self.day.pending == 0
            && u64::from(self.refused_until_s) <= now.seconds()
    }
}
