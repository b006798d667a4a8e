//! [`StatusSet`]: which sellers have call tracking on, in memory.
//!
//! A `papaya` lock-free hash map from user id to `(version, enabled)` packed in one
//! `u64`: readers never wait on a writer, not even for a shard lock (dashmap's
//! shards are `RwLock`s), and a delta costs one insert instead of the copy of a
//! whole copy-on-write set. The benches/status_set.rs table backs the choice.
//! Writers must be serialised by the caller (`StatusService` does); each user's
//! transition is then atomic, while a snapshot becomes visible user by user.
//!
//! Two facts beside the map: the *floor*, the version of the last snapshot, which
//! every user the map does not hold has (disabled: a snapshot speaks for every
//! user, listed or not); and whether the set was *loaded* at all. Before it is,
//! nothing is known of anyone ([`Tracking::Unknown`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use foldhash::fast::RandomState;

use crate::ids::UserId;
use crate::upstream::StatusItem;

/// A user's call-tracking status; version 0 means never seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    pub enabled: bool,
    pub version: u64,
}

impl Status {
    fn pack(self) -> u64 {
        (self.version << 1) | u64::from(self.enabled)
    }
    fn unpack(packed: u64) -> Self {
        Status {
            enabled: packed & 1 == 1,
            version: packed >> 1,
        }
    }
}

/// Counts of one delta delivery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Applied {
    pub applied: u64,
    pub ignored: u64,
}

/// Largest version accepted: versions are stored shifted by one bit (and as a
/// signed 64-bit integer in PostgreSQL).
pub const MAX_VERSION: u64 = i64::MAX as u64;

pub struct StatusSet {
    map: papaya::HashMap<u64, u64, RandomState>,
    /// The version of every user the map does not hold (disabled).
    floor: AtomicU64,
    /// Set once the stored set was read into the map.
    loaded: AtomicBool,
}

/// What this replica knows of a seller's call tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    On,
    Off,
    /// The set is not loaded yet: the seller may have call tracking on.
    Unknown,
}

impl Default for StatusSet {
    fn default() -> Self {
        StatusSet {
            map: papaya::HashMap::builder()
                .hasher(RandomState::default())
                .build(),
            floor: AtomicU64::new(0),
            loaded: AtomicBool::new(false),
        }
    }
}

impl StatusSet {
    /// The hot-path question: is call tracking on for this seller, and is that known?
    pub fn tracking(&self, user: UserId) -> Tracking {
        if !self.loaded.load(Ordering::Acquire) {
            return Tracking::Unknown;
        }
        if self.is_enabled(user) {
            Tracking::On
        } else {
            Tracking::Off
        }
    }

    /// Whether the map has call tracking on for this seller (loaded or not).
    pub fn is_enabled(&self, user: UserId) -> bool {
        self.map.pin().get(&user.get()).is_some_and(|p| p & 1 == 1)
    }

    pub fn get(&self, user: UserId) -> Status {
        self.map.pin().get(&user.get()).map_or(
            Status {
                enabled: false,
                version: self.floor(),
            },
            |p| Status::unpack(*p),
        )
    }

    /// The last snapshot's version: what an unlisted, never-changed user has.
    pub fn floor(&self) -> u64 {
        self.floor.load(Ordering::Acquire)
    }

    /// Sets the floor as stored (catch-up from the store).
    pub fn put_floor(&self, version: u64) {
        self.floor.store(version, Ordering::Release);
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// The stored set is in memory: from now on an absent user is known to be off.
    pub fn mark_loaded(&self) {
        self.loaded.store(true, Ordering::Release);
    }

    /// Users with any stored status (enabled or not).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn enabled_count(&self) -> usize {
        self.map.pin().values().filter(|p| *p & 1 == 1).count()
    }

    /// Applies each item whose version is above the stored one, in order, as if
    /// each were its own delivery (the rule of [`plan_changes`]).
    pub fn apply_changes(&self, items: &[StatusItem]) -> Applied {
        let map = self.map.pin();
        let stored = items
            .iter()
            .filter_map(|i| {
                map.get(&i.user_id)
                    .map(|p| (i.user_id, Status::unpack(*p).version))
            })
            .collect();
        let (counts, rows) = plan_changes(items, &stored, self.floor());
        for row in rows {
            map.insert(
                row.user_id,
                Status {
                    enabled: row.enabled,
                    version: row.version,
                }
                .pack(),
            );
        }
        counts
    }

    /// Sets a user's status as stored (catch-up from the store, which is the truth).
    pub fn put(&self, user_id: u64, status: Status) {
        self.map.pin().insert(user_id, status.pack());
    }
}

/// Which items of a delivery apply, given the stored versions, taking items in
/// order as if each were its own delivery; and the final row of each changed user.
/// A user with no stored version has the `floor` (the last snapshot's version).
pub fn plan_changes(
    items: &[StatusItem],
    stored: &HashMap<u64, u64>,
    floor: u64,
) -> (Applied, Vec<StatusItem>) {
    let mut latest: HashMap<u64, StatusItem> = HashMap::new();
    let mut counts = Applied::default();
    for item in items {
        let current = latest
            .get(&item.user_id)
            .map(|i| i.version)
            .or_else(|| stored.get(&item.user_id).copied())
            .unwrap_or(floor);
        if item.version > current {
            latest.insert(item.user_id, *item);
            counts.applied += 1;
        } else {
            counts.ignored += 1;
        }
    }
    let mut rows: Vec<StatusItem> = latest.into_values().collect();
    rows.sort_unstable_by_key(|r| r.user_id);
    (counts, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(user_id: u64, enabled: bool, version: u64) -> StatusItem {
        StatusItem {
            user_id,
            enabled,
            version,
        }
    }

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    #[test]
    fn newer_versions_apply_older_and_equal_are_ignored() {
        let set = StatusSet::default();
        let got = set.apply_changes(&[
            item(1, true, 5),
            item(1, false, 5),
            item(1, false, 4),
            item(2, true, 1),
            item(1, false, 6),
        ]);
        assert_eq!(
            got,
            Applied {
                applied: 3,
                ignored: 2
            }
        );
        assert_eq!(
            set.get(user(1)),
            Status {
                enabled: false,
                version: 6
            }
        );
        assert!(set.is_enabled(user(2)));
        assert_eq!(
            set.get(user(3)),
            Status {
                enabled: false,
                version: 0
            }
        );
    }

    #[test]
    fn plan_takes_items_in_order_against_stored_versions() {
        let stored = HashMap::from([(1, 10), (2, 3)]);
        let items = [
            item(1, true, 10),
            item(1, false, 11),
            item(1, true, 11),
            item(2, true, 4),
            item(3, true, 1),
            item(3, false, 1),
            item(2, false, 2),
        ];
        let (counts, rows) = plan_changes(&items, &stored, 0);
        assert_eq!(
            counts,
            Applied {
                applied: 3,
                ignored: 4
            }
        );
        assert_eq!(
            rows,
            [item(1, false, 11), item(2, true, 4), item(3, true, 1)]
        );
    }

    #[test]
    fn an_unseen_user_has_the_floor() {
        let set = StatusSet::default();
        set.put_floor(100);
        assert_eq!(
            set.get(user(7)),
            Status {
                enabled: false,
                version: 100
            }
        );
        let got = set.apply_changes(&[item(7, true, 50), item(7, true, 100), item(8, true, 101)]);
        assert_eq!(
            got,
            Applied {
                applied: 1,
                ignored: 2
            }
        );
        assert!(!set.is_enabled(user(7)));
        assert!(set.is_enabled(user(8)));
    }

    #[test]
    fn tracking_is_unknown_until_loaded() {
        let set = StatusSet::default();
        set.apply_changes(&[item(1, true, 1)]);
        assert_eq!(set.tracking(user(1)), Tracking::Unknown);
        assert_eq!(set.tracking(user(2)), Tracking::Unknown);
        set.mark_loaded();
        assert_eq!(set.tracking(user(1)), Tracking::On);
        assert_eq!(set.tracking(user(2)), Tracking::Off);
    }

    #[test]
    fn the_largest_version_round_trips() {
        let set = StatusSet::default();
        set.apply_changes(&[item(1, true, MAX_VERSION)]);
        assert_eq!(
            set.get(user(1)),
            Status {
                enabled: true,
                version: MAX_VERSION
            }
        );
    }
}
