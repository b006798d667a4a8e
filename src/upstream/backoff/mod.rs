//! Back off first, judge after: whether a health failure (a timeout, a 5xx,
//! a refused or reset connection) is the upstream's verdict or load the
//! gateway may have put on it, decided only once the gateway has cut what it
//! sends. The rule is docs/rules.md, "Whose load"; this is its gate.
//!
//! Each upstream keeps, per [`BUCKET`], the calls sent, answered well and
//! failed, and what the upstream *carried*: a moving average of calls
//! answered well (about the last 30 s), which stands still while the gateway
//! backs off; and the same over about ten minutes, *settled*, which one
//! caller's minute of warm-up hardly moves. Then:
//!
//! - A failure of a call sent at the usual rate (the calls sent over the last
//!   bucket no more than [`MARGIN`] above the lesser of the two, plus
//!   [`SLACK`]) is the upstream's verdict at once: it was answering others at
//!   that rate for long. One seller's failures, or sporadic 5xx, are judged
//!   so. A caller that first raises what was carried, then bursts past what
//!   the upstream takes, is still above the usual rate.
//! - A failure of a call sent above it is [`Load`](super::UpstreamError::Load):
//!   undecided. When such failures are more than [`TRIGGER`] of the calls
//!   that ended lately, the gateway backs off: sends to that upstream are held
//!   to [`BETA`] of what it carried before (a token bucket; a call over it is
//!   [`BackingOff`](super::UpstreamError::BackingOff), undecided, and each
//!   `Load` also cuts the adaptive bound, `limit`).
//! - A failure of a call sent once backed off (held to the fraction, and
//!   [`settle`] after the cut, so the upstream has drained what it was sent
//!   before) is the upstream's verdict: it fails at a rate it carried. That
//!   is the end of the excuse: an outage is judged within `settle` (1 s with
//!   the default 300 ms timeout) of the back-off, whatever the demand. While
//!   such verdicts go on, about as many sellers in as many requests as open
//!   a breaker, a call over the hold is [`Unsent::Failing`] (the call takes
//!   `circuit_open`, a verdict) rather than held: `on_error` applies to every
//!   call of an outage, not only to those sent.
//! - While the share of failures stays under [`TRIGGER`], the hold climbs by
//!   [`CLIMB`] of what was carried each bucket in which calls ended (additive
//!   increase; silence, such as an open breaker's, is no news); a failure
//!   of a call sent while it climbed is load again and cuts it back to the
//!   fraction, with a new settling time. Above the usual rate the back-off
//!   ends.
//!
//! A caller's calls can lower the hold (they add to what is sent); they can
//! never make a failure a verdict sooner: a verdict needs the gateway to have
//! been sending no more than the fraction of what the upstream carried
//! before. The same shape as Google SRE's client-side throttling (the client
//! rejects locally what the backend would not accept, judged on what it
//! accepted) and Netflix's concurrency limits (AIMD on a load signal).
//!
//! Its cost is on the cold path only: one uncontended mutex and a few float
//! operations per call sent and per call ended.

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
/// Calls per bucket above that before anything is unusual (32 a second), so
/// that a few calls a second are never load.
pub(super) const SLACK: f64 = 8.0;
/// Buckets of history (2 s) before what was carried is known: until then
/// nothing is unusual, since the gateway cannot say it sends more than the
/// upstream has been carrying.
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

/// Why a call was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unsent {
    /// Over the hold while the gateway backs off: undecided.
    Held,
    /// Over the hold while failures go on at the fraction, spread over as
    /// many sellers and requests as open a breaker: the upstream's verdict
    /// on the calls sent stands for this one too (it is failing for
    /// everyone, and asking it more would add nothing). One seller's
    /// failures, one caller's, are not enough.
    Failing,
}

/// Whose a health failure is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Judgement {
    Verdict,
    Load,
}

pub(super) struct Backoff {
    settle: Duration,
    /// The spread of verdicts that makes calls over the hold [`Unsent::Failing`]:
    /// the breaker's.
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
    /// start is corrected for, so that a new replica learns as fast as its
    /// history allows).
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
    /// Whom the verdicts on calls sent at the fraction were about, since the
    /// last calm bucket.
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
    /// The back-off of an upstream whose calls time out after `timeout`,
    /// whose breaker opens on failures of `spread`.
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

    /// A call about to be sent at `now`: why not when the hold is reached
    /// (it is not sent), else how it was sent.
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

    /// A call answered well (its health up).
    pub(super) fn answered(&self, now: Instant) {
        let mut state = self.lock();
        state.roll(now);
        state.now.good = state.now.good.saturating_add(1);
    }

    /// A health failure of a call by `caller` sent as `sent`, at `now`: whose
    /// it is.
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

    /// The counts of this bucket and the recent ones together.
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
                        // The first bucket sets it; each after moves it.
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
