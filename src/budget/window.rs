//! The budgets' pure arithmetic: windows, the sliding minute's estimate and wait,
//! a replica's share. Why a sliding minute: docs/budgets.md, "The budgets".

use crate::domain::wall_clock;

pub const MINUTE_MS: u64 = 60_000;
pub const DAY_MS: u64 = 86_400_000;

/// A moment, in milliseconds since the Unix epoch (this replica's wall clock:
/// the fleet's windows agree as far as the clocks do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment(pub u64);

impl Moment {
    pub fn now() -> Moment {
        Moment(u64::try_from(wall_clock::since_epoch().as_millis()).unwrap_or(u64::MAX))
    }

    /// Minutes since the epoch (fits `u32` until the year 10136).
    pub fn minute(self) -> u32 {
        u32::try_from(self.0 / MINUTE_MS).unwrap_or(u32::MAX)
    }

    /// Milliseconds into the current minute.
    pub fn into_minute(self) -> u64 {
        self.0 % MINUTE_MS
    }

    /// UTC days since the epoch.
    pub fn day(self) -> u32 {
        u32::try_from(self.0 / DAY_MS).unwrap_or(u32::MAX)
    }

    /// Milliseconds until the next UTC midnight.
    pub fn rest_of_day(self) -> u64 {
        DAY_MS - self.0 % DAY_MS
    }

    pub fn seconds(self) -> u64 {
        self.0 / 1000
    }
}

/// Whether `n` more fit a minute budget of `budget`, with `before` spent in the
/// previous minute and `current` in this one, `into` ms into it.
pub fn minute_fits(before: u64, current: u64, n: u64, budget: u64, into: u64) -> bool {
    let Some(left) = budget.checked_sub(current + n) else {
        return false;
    };
    // before * (1 - into / M) <= left, in integers.
    before * (MINUTE_MS - into) <= left * MINUTE_MS
}

/// The minute's estimate, rounded up: what a viewer counts as having spent.
pub fn minute_estimate(before: u64, current: u64, into: u64) -> u64 {
    (before * (MINUTE_MS - into)).div_ceil(MINUTE_MS) + current
}

/// Milliseconds until `n` more fit if nothing more is spent (the previous
/// minute weighs less as time passes); `None` when `n` can never fit.
pub fn minute_wait(before: u64, current: u64, n: u64, budget: u64, into: u64) -> Option<u64> {
    if n > budget {
        return None;
    }
    if minute_fits(before, current, n, budget, into) {
        return Some(0);
    }
    if let Some(left) = budget.checked_sub(current + n) {
        // Later in this minute: before * (M - r) <= left * M, before > 0 here.
        let r = MINUTE_MS - left * MINUTE_MS / before.max(1);
        return Some(r.saturating_sub(into));
    }
    // In the next minute, with this one as its previous.
    let r = MINUTE_MS - (budget - n) * MINUTE_MS / current.max(1);
    Some(MINUTE_MS - into + r.min(MINUTE_MS))
}

/// A replica's share of `remaining`: in proportion to its `own` of the fleet's
/// `known` spend, rounded up so each serving replica may spend one while anything
/// remains; an even share over `replicas` while `known` is 0.
pub fn share(remaining: u64, own: u64, known: u64, replicas: u32) -> u64 {
    if remaining == 0 {
        0
    } else if known == 0 || own == 0 {
        remaining.div_ceil(u64::from(replicas.max(1)))
    } else {
        (remaining * own.min(known)).div_ceil(known)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_previous_minute_weighs_by_what_is_left_of_it() {
        // 10 spent last minute, none now, budget 10: at the start nothing
        // fits; halfway, 5 do.
        assert!(!minute_fits(10, 0, 1, 10, 0));
        assert!(minute_fits(10, 0, 5, 10, 30_000));
        assert!(!minute_fits(10, 0, 6, 10, 30_000));
        assert_eq!(minute_estimate(10, 0, 30_000), 5);
        assert_eq!(minute_estimate(10, 2, 59_999), 3);
    }

    #[test]
    fn the_wait_is_when_the_estimate_lets_the_request_in() {
        // Halfway through, 10 before: one more fits once before * (1 - f) <= 4.
        let wait = minute_wait(10, 5, 1, 10, 30_000).unwrap();
        assert_eq!(wait, 6_000);
        assert!(minute_fits(10, 5, 1, 10, 30_000 + wait));
        assert!(!minute_fits(10, 5, 1, 10, 30_000 + wait - 1));
        // All spent now: the next minute, a third into it (10 weighs 6.67 then).
        let wait = minute_wait(0, 10, 4, 10, 20_000).unwrap();
        assert_eq!(wait, 40_000 + 24_000);
        assert!(minute_fits(10, 0, 4, 10, 24_000));
        assert_eq!(minute_wait(0, 3, 1, 3, 59_000), Some(1_000 + 20_000));
        assert_eq!(minute_wait(0, 0, 11, 10, 0), None);
        assert_eq!(minute_wait(0, 0, 10, 10, 0), Some(0));
    }

    /// A replica that spent none of what the fleet knows is spent takes an
    /// even share, not none.
    #[test]
    fn a_replica_that_spent_none_of_the_total_takes_an_even_share() {
        assert_eq!(share(10, 0, 6, 2), 5);
        assert_eq!(share(10, 0, 6, 3), 4);
    }

    #[test]
    fn shares_follow_what_each_replica_spent_and_round_up() {
        // Alone: all of it.
        assert_eq!(share(8, 2, 2, 20), 8);
        // One of four equal replicas: a quarter, rounded up.
        assert_eq!(share(10, 5, 20, 4), 3);
        // Knowing nothing: an even share of the fleet.
        assert_eq!(share(60, 0, 0, 4), 15);
        assert_eq!(share(5, 0, 0, 20), 1);
        assert_eq!(share(0, 1, 1, 1), 0);
    }

    #[test]
    fn moments_fall_in_their_windows() {
        let m = Moment(86_400_000 * 3 + 61_500);
        assert_eq!(m.day(), 3);
        assert_eq!(m.minute(), 1440 * 3 + 1);
        assert_eq!(m.into_minute(), 1_500);
        assert_eq!(m.rest_of_day(), 86_400_000 - 61_500);
    }
}
