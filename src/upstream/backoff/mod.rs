//! Back off first, judge after: whether a health failure is the upstream's
//! verdict or load the gateway may have put on it, decided only once the
//! gateway has cut what it sends. The rule and its thresholds: docs/rules.md,
//! "Whose load". Cold path only: one uncontended mutex and a few float
//! operations per call.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::breaker::{Caller, Failed, Spread};

/// The window of the rates.
pub(super) const BUCKET: Duration = Duration::from_millis(250);
/// The weight of a bucket in what the upstream carried: about the last 30 s.
const WEIGHT: f64 = 1.0 / 120.0;
/// The weight of a bucket in what it carried settled: about ten minutes.
const SETTLED_WEIGHT: f64 = 1.0 / 2400.0;
/// How far above what the upstream carried a send rate is still usual.
pub(super) const MARGIN: f64 = 0.25;
/// Calls per bucket above that before anything is unusual (32 a second).
pub(super) const SLACK: f64 = 8.0;
/// Buckets of history (2 s) before what was carried is known: until then
/// nothing is unusual.
pub(super) const WARM_UP: u32 = 8;
/// The share of failed calls among calls ended lately above which the gateway
/// backs off, and under which its hold climbs.
pub(super) const TRIGGER: f64 = 0.1;
/// Failures in the last second below which nothing is backed off from.
pub(super) const MIN_FAILED: u32 = 3;
/// The fraction of what the upstream carried that the gateway backs off to.
pub(super) const BETA: f64 = 0.5;
/// The hold's climb per calm bucket, a share of what was carried.
pub(super) const CLIMB: f64 = 0.05;
/// The least hold, calls per bucket (4 a second).
pub(super) const FLOOR: f64 = 1.0;
/// Buckets of counts kept for the share of failures (one second).
const RECENT: usize = 4;

/// How long after a cut the upstream is given to drain what it was sent
/// before: twice the call's timeout, at least a second.
pub(super) fn settle(timeout: Duration) -> Duration {
    (timeout * 2).max(Duration::from_secs(1))
}

/// How a call was sent, for judging how it failed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sent {
    /// Above the usual rate.
    hot: bool,
    /// Held to the fraction, past the settling time.
    backed_off: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unsent {
    /// Over the hold while the gateway backs off: undecided.
    Held,
    /// Over the hold while failures at the fraction span as many sellers and
    /// requests as open a breaker: the verdict on the calls sent stands.
    Failing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judgement {
    Verdict,
    Load,
}

pub(super) struct Backoff {
    settle: Duration,
    /// The spread of verdicts that makes calls over the hold [`Unsent::Failing`].
    spread: Spread,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    sent: u32,
    good: u32,
    failed: u32,
}

struct State {
    bucket_start: Instant,
    /// This bucket's counts, then the last [`RECENT`] closed ones.
    now: Counts,
    recent: [Counts; RECENT],
    /// Calls answered well per bucket; `None` until the first bucket closes.
    carried: Option<f64>,
    /// The slow average of the same, from 0, and the buckets it has seen (its
    /// start is corrected for).
    settled: f64,
    settled_buckets: u32,
    history: u32,
    episode: Option<Episode>,
}

struct Episode {
    /// What the upstream carried when it began, calls per bucket.
    before: f64,
    /// The hold on sends, calls per bucket.
    hold: f64,
    tokens: f64,
    refilled: Instant,
    /// Calls sent from then on at the fraction are judged.
    judged_from: Instant,
    /// Whom the verdicts at the fraction were about, since the last calm bucket.
    verdicts: Failed,
}

impl Episode {
    fn fraction(&self) -> f64 {
        (BETA * self.before).max(FLOOR)
    }

    fn cut(&mut self, now: Instant, settle: Duration) {
        self.hold = self.fraction();
        self.tokens = self.tokens.min(self.hold);
        self.judged_from = now + settle;
    }
}

impl Backoff {
    pub(super) fn new(timeout: Duration, spread: Spread) -> Self {
        Backoff {
            settle: settle(timeout),
            spread,
            state: Mutex::new(State {
                bucket_start: Instant::now(),
                now: Counts::default(),
                recent: [Counts::default(); RECENT],
                carried: None,
                settled: 0.0,
                settled_buckets: 0,
                history: 0,
                episode: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the state valid (counters and floats).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A call about to be sent at `now`: why not, or how it was sent.
    pub(super) fn send(&self, now: Instant) -> Result<Sent, Unsent> {
        let mut state = self.lock();
        state.roll(now);
        let usual = state.usual();
        let recent = state.sent_rate(now) + 1.0;
        let spread = self.spread;
        let backed_off = match &mut state.episode {
            Some(episode) => {
                let per_bucket = episode.hold / BUCKET.as_secs_f64();
                let since = now.saturating_duration_since(episode.refilled);
                episode.tokens =
                    (episode.tokens + since.as_secs_f64() * per_bucket).min(episode.hold.max(1.0));
                episode.refilled = now;
                if episode.tokens < 1.0 {
                    return Err(if episode.verdicts.spans(spread) {
                        Unsent::Failing
                    } else {
                        Unsent::Held
                    });
                }
                episode.tokens -= 1.0;
                episode.hold <= episode.fraction() + f64::EPSILON && now >= episode.judged_from
            }
            None => false,
        };
        state.now.sent = state.now.sent.saturating_add(1);
        Ok(Sent {
            hot: recent > usual,
            backed_off,
        })
    }

    pub(super) fn answered(&self, now: Instant) {
        let mut state = self.lock();
        state.roll(now);
        state.now.good = state.now.good.saturating_add(1);
    }

    pub(super) fn failed(&self, sent: Sent, now: Instant, caller: Caller) -> Judgement {
        let settle = self.settle;
        let mut state = self.lock();
        state.roll(now);
        state.now.failed = state.now.failed.saturating_add(1);
        let lately = state.lately();
        let troubled = lately.failed >= MIN_FAILED
            && f64::from(lately.failed) > TRIGGER * f64::from(lately.good + lately.failed);
        let carried = state.carried.unwrap_or(0.0);
        match &mut state.episode {
            Some(episode) if sent.backed_off => {
                episode.verdicts.add(caller);
                Judgement::Verdict
            }
            Some(episode) => {
                if episode.hold > episode.fraction() + f64::EPSILON {
                    episode.cut(now, settle);
                }
                Judgement::Load
            }
            None if !sent.hot => Judgement::Verdict,
            None => {
                if troubled {
                    let mut episode = Episode {
                        before: carried,
                        hold: 0.0,
                        tokens: 0.0,
                        refilled: now,
                        judged_from: now,
                        verdicts: Failed::NONE,
                    };
                    episode.cut(now, settle);
                    state.episode = Some(episode);
                    tracing::debug!("backing off an upstream");
                }
                Judgement::Load
            }
        }
    }

    /// The hold on sends now, in calls a second (`None`: not backing off).
    #[cfg(test)]
    fn hold(&self) -> Option<f64> {
        self.lock()
            .episode
            .as_ref()
            .map(|e| e.hold / BUCKET.as_secs_f64())
    }

    /// What the upstream carried, calls a second (tests).
    #[cfg(test)]
    fn carried(&self) -> Option<f64> {
        self.lock().carried.map(|c| c / BUCKET.as_secs_f64())
    }
}

impl State {
    /// The most calls per bucket that are usual.
    fn usual(&self) -> f64 {
        match self.carried {
            Some(carried) if self.history >= WARM_UP => {
                carried.min(self.settled()) * (1.0 + MARGIN) + SLACK
            }
            _ => f64::INFINITY,
        }
    }

    /// The slow average, corrected for its start at 0.
    fn settled(&self) -> f64 {
        let seen = 1.0 - (1.0 - SETTLED_WEIGHT).powi(self.settled_buckets.min(1 << 20) as i32);
        if seen > 0.0 { self.settled / seen } else { 0.0 }
    }

    /// Calls sent over the last bucket's length: this bucket's and the share
    /// of the last one still inside it.
    fn sent_rate(&self, now: Instant) -> f64 {
        let into = now
            .saturating_duration_since(self.bucket_start)
            .as_secs_f64()
            / BUCKET.as_secs_f64();
        f64::from(self.now.sent) + f64::from(self.recent[0].sent) * (1.0 - into.min(1.0))
    }

    fn lately(&self) -> Counts {
        self.recent.iter().fold(self.now, |sum, c| Counts {
            sent: sum.sent.saturating_add(c.sent),
            good: sum.good.saturating_add(c.good),
            failed: sum.failed.saturating_add(c.failed),
        })
    }

    /// Closes the buckets that ended before `now`.
    fn roll(&mut self, now: Instant) {
        // A long quiet spell (two minutes): what was carried has all but
        // faded, and nothing of before is recent.
        if now >= self.bucket_start + BUCKET * 480 {
            self.bucket_start = now;
            self.now = Counts::default();
            self.recent = [Counts::default(); RECENT];
            self.carried = self.carried.map(|c| c * 0.02);
            self.settled *= 0.02;
            self.episode = None;
            return;
        }
        while now >= self.bucket_start + BUCKET {
            let closed = std::mem::take(&mut self.now);
            self.recent.rotate_right(1);
            self.recent[0] = closed;
            self.bucket_start += BUCKET;
            match &mut self.episode {
                Some(episode) => {
                    // A bucket in which nothing ended (the breaker open, no
                    // demand) says nothing of the upstream: no climb.
                    let ended = closed.good + closed.failed;
                    let calm = ended > 0 && f64::from(closed.failed) <= TRIGGER * f64::from(ended);
                    if calm {
                        episode.verdicts = Failed::NONE;
                        episode.hold += (CLIMB * episode.before).max(FLOOR);
                        let usual = episode.before * (1.0 + MARGIN) + SLACK;
                        if episode.hold >= usual {
                            self.episode = None;
                            tracing::debug!("backed off an upstream no longer");
                        }
                    }
                }
                None => {
                    let good = f64::from(closed.good);
                    self.carried = Some(match self.carried {
                        None => good,
                        Some(carried) => carried + WEIGHT * (good - carried),
                    });
                    self.settled += SETTLED_WEIGHT * (good - self.settled);
                    self.settled_buckets = self.settled_buckets.saturating_add(1);
                    self.history = self.history.saturating_add(1).min(WARM_UP);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
