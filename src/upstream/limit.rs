//! The bounds on one upstream's calls in flight: the whole upstream's
//! (`upstreams.<name>.max_in_flight`) and each seller's
//! (`upstreams.<name>.max_in_flight_per_seller`).
//!
//! Why a bound per seller: the upstream's own bound is shared by every seller,
//! and one caller can fill it alone. A batch of items for one seller, each with
//! another `phone`, makes one call-tracking call per item (each phone is a key of
//! its own, nothing coalesces), and a slow upstream keeps them all in flight; every
//! other seller's call is then refused. A refusal no longer reveals a lower source
//! (the source is undecided, docs/rules.md), but it still refuses other sellers
//! because of one caller. With a bound per seller, one seller holds at most its
//! share of the upstream's places and the rest stay for the others. It applies to
//! the three upstreams alike: the same flood with random ad ids instead of phones
//! fills the real-phone and anonymous bounds the same way.
//!
//! Its default (0) is an eighth of the upstream's bound, at least one call: a fixed
//! number would be either no bound at all under a small upstream bound or too tight
//! under a large one, and an eighth leaves one seller 512 calls at once under the
//! default bound (4096), far past what one seller's traffic needs (calls for one
//! key coalesce, so a seller's calls in flight are its distinct cold keys), while
//! eight sellers at once are needed to fill the upstream's bound.
//!
//! The seller's count is exact (a sharded map of sellers with calls in flight,
//! dashmap over foldhash), not a hashed table of counters, where a seller hashed
//! beside a flooding one would share its bound. It is taken on the cold path only
//! (a call about to be made), once per call and once more when the call ends, and
//! a seller's entry is removed when its last call ends, so the map holds only
//! sellers with calls in flight. Both places are guards released on drop, so a
//! call that ends any way (answered, timed out, its task cancelled or panicking)
//! gives them back.

use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use crate::domain::UserId;

/// Calls in flight to one upstream, and the most allowed at once.
pub(super) struct Bound {
    in_flight: AtomicUsize,
    max: usize,
}

impl Bound {
    pub(super) fn new(max: usize) -> Self {
        Bound {
            in_flight: AtomicUsize::new(0),
            max,
        }
    }

    /// A place among the calls in flight, or `None` when all are taken.
    pub(super) fn slot(&self) -> Option<Slot<'_>> {
        // Taken before it is checked, so two calls racing for the last place
        // cannot both have it; the loser gives it back.
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(&self.in_flight);
        (before < self.max).then_some(slot)
    }
}

/// A call in flight; dropping it (answered, timed out or cancelled) frees its place.
pub(super) struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Calls in flight to one upstream per seller, and the most one seller may have.
pub(super) struct PerSeller {
    /// Sellers with calls in flight and how many; a seller without is absent.
    in_flight: DashMap<UserId, u32, foldhash::fast::RandomState>,
    max: u32,
}

impl PerSeller {
    pub(super) fn new(max: usize) -> Self {
        PerSeller {
            in_flight: DashMap::with_hasher(foldhash::fast::RandomState::default()),
            max: u32::try_from(max).unwrap_or(u32::MAX).max(1),
        }
    }

    /// A place among `user`'s calls in flight, or `None` when all are taken.
    pub(super) fn slot(&self, user: UserId) -> Option<SellerSlot<'_>> {
        let mut count = self.in_flight.entry(user).or_insert(0);
        // `max` is at least 1, so a count just inserted at 0 is always taken
        // below: no entry at 0 is left behind.
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(SellerSlot { bound: self, user })
    }

    /// Sellers with calls in flight (tests).
    #[cfg(test)]
    fn sellers(&self) -> usize {
        self.in_flight.len()
    }
}

/// One of a seller's calls in flight; dropping it frees its place, and the
/// seller's entry with its last one.
pub(super) struct SellerSlot<'a> {
    bound: &'a PerSeller,
    user: UserId,
}

impl Drop for SellerSlot<'_> {
    fn drop(&mut self) {
        if let Entry::Occupied(mut count) = self.bound.in_flight.entry(self.user) {
            if *count.get() <= 1 {
                count.remove();
            } else {
                *count.get_mut() -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
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
}
