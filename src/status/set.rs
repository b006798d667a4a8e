//! [`StatusSet`]: which sellers have call tracking on, in memory: a lock-free
//! map (why: docs/status-sync.md, "Why a lock-free map"), the snapshot's
//! *floor*, and whether the set was *loaded* (before, nothing is known).
//! Writers must be serialised by the caller (`StatusService` does); each user's
//! transition is then atomic, while a snapshot becomes visible user by user.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use foldhash::fast::RandomState;

use super::ROWS_PER_YIELD;
use super::listed::Listed;
use crate::domain::{Applied, Known, Status, StatusChange, UserId, plan_changes};

/// A status packed in one `u64`: the version shifted left, `enabled` in bit 0.
fn pack(status: Status) -> u64 {
    (status.version << 1) | u64::from(status.enabled)
}

fn unpack(packed: u64) -> Status {
    Status {
        enabled: packed & 1 == 1,
        version: packed >> 1,
    }
}

pub struct StatusSet {
    map: papaya::HashMap<u64, u64, RandomState>,
    /// The version of every user the map does not hold (disabled).
    floor: AtomicU64,
    /// Set once the stored set was read into the map.
    loaded: AtomicBool,
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
    /// The hot-path question: is call tracking on for this seller (`Yes`), off
    /// (`No`), or not known (the set is not loaded yet: it may be on)?
    pub fn tracking(&self, user: UserId) -> Known<()> {
        if !self.loaded.load(Ordering::Acquire) {
            return Known::NotKnown;
        }
        Known::of(self.is_enabled(user).then_some(()))
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
            |p| unpack(*p),
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

    /// Applies each change whose version is above the stored one, in order, as if
    /// each were its own delivery (the rule of [`plan_changes`]).
    pub fn apply_changes(&self, changes: &[StatusChange]) -> Applied {
        let map = self.map.pin();
        let stored: HashMap<u64, u64> = changes
            .iter()
            .filter_map(|c| {
                let user = c.user.get();
                map.get(&user).map(|p| (user, unpack(*p).version))
            })
            .collect();
        let (counts, rows) = plan_changes(changes, &stored, self.floor());
        for row in rows {
            let status = Status {
                enabled: row.enabled,
                version: row.version.get(),
            };
            map.insert(row.user.get(), pack(status));
        }
        counts
    }

    /// Sets a user's status as stored (catch-up from the store, which is the truth).
    pub fn put(&self, user_id: u64, status: Status) {
        self.map.pin().insert(user_id, pack(status));
    }

    /// The user's own entry, if the map holds one (not the floor's).
    fn entry(&self, user_id: u64) -> Option<Status> {
        self.map.pin().get(&user_id).map(|p| unpack(*p))
    }

    /// Applies a full snapshot at `version` enabling `listed` (docs/status-sync.md,
    /// "The snapshot and its floor"), telling `flipped` of each user whose call
    /// tracking flips before it is visible. Listed users first, so a seller
    /// enabled before and after is never seen disabled. Returns how many it set.
    pub(super) async fn apply_snapshot(
        &self,
        listed: &Listed,
        version: u64,
        mut flipped: impl FnMut(u64),
    ) -> usize {
        let floor = self.floor();
        let on = Status {
            enabled: true,
            version,
        };
        let mut set = 0;
        for (i, user) in listed.iter().enumerate() {
            let entry = self.entry(user);
            if entry.map_or(floor, |s| s.version) <= version {
                if !entry.is_some_and(|s| s.enabled) {
                    flipped(user);
                }
                self.put(user, on);
                set += 1;
            }
            if i % ROWS_PER_YIELD == ROWS_PER_YIELD - 1 {
                tokio::task::yield_now().await;
            }
        }
        if floor <= version {
            self.put_floor(version);
        }
        let off = Status {
            enabled: false,
            version,
        };
        for (i, user) in self.unlisted(listed, version).await.into_iter().enumerate() {
            if self.entry(user).is_some_and(|s| s.enabled) {
                flipped(user);
            }
            self.put(user, off);
            set += 1;
            if i % ROWS_PER_YIELD == ROWS_PER_YIELD - 1 {
                tokio::task::yield_now().await;
            }
        }
        set
    }

    /// The users whose entry a snapshot at `version` disables (or moves up to
    /// `version`): below `version`, or enabled at exactly it and not listed.
    /// The guard held across `await`s keeps no retired entry alive: the caller
    /// is the only writer and does not write during the pass.
    async fn unlisted(&self, listed: &Listed, version: u64) -> Vec<u64> {
        let map = self.map.pin_owned();
        let mut users = Vec::new();
        for (i, (user, packed)) in map.iter().enumerate() {
            let status = unpack(*packed);
            let stale = status.version < version
                || (status.version == version && status.enabled && !listed.contains(*user));
            if stale {
                users.push(*user);
            }
            if i % (4 * ROWS_PER_YIELD) == 4 * ROWS_PER_YIELD - 1 {
                tokio::task::yield_now().await;
            }
        }
        users
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::MAX_VERSION;

    fn item(user_id: u64, enabled: bool, version: u64) -> StatusChange {
        crate::domain::StatusItem {
            user_id,
            enabled,
            version,
        }
        .parse()
        .unwrap()
    }

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    fn status(enabled: bool, version: u64) -> Status {
        Status { enabled, version }
    }

    fn applied(applied: u64, ignored: u64) -> Applied {
        Applied { applied, ignored }
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
        assert_eq!(got, applied(3, 2));
        assert_eq!(set.get(user(1)), status(false, 6));
        assert!(set.is_enabled(user(2)));
        assert_eq!(set.get(user(3)), status(false, 0));
    }

    #[test]
    fn an_unseen_user_has_the_floor() {
        let set = StatusSet::default();
        set.put_floor(100);
        assert_eq!(set.get(user(7)), status(false, 100));
        let got = set.apply_changes(&[item(7, true, 50), item(7, true, 100), item(8, true, 101)]);
        assert_eq!(got, applied(1, 2));
        assert!(!set.is_enabled(user(7)));
        assert!(set.is_enabled(user(8)));
    }

    #[test]
    fn tracking_is_unknown_until_loaded() {
        let set = StatusSet::default();
        set.apply_changes(&[item(1, true, 1)]);
        assert_eq!(set.tracking(user(1)), Known::NotKnown);
        assert_eq!(set.tracking(user(2)), Known::NotKnown);
        set.mark_loaded();
        assert_eq!(set.tracking(user(1)), Known::Yes(()));
        assert_eq!(set.tracking(user(2)), Known::No);
    }

    /// The store's rule for a snapshot at `version` (the finish's UPDATE and
    /// INSERT), on a map of (enabled, version) and a floor: the model the set's
    /// own apply must agree with.
    fn stored_after_snapshot(
        before: &HashMap<u64, Status>,
        floor: u64,
        listed: &[u64],
        version: u64,
    ) -> (HashMap<u64, Status>, u64) {
        let mut after = before.clone();
        for (user, status) in after.iter_mut() {
            if status.version <= version {
                *status = self::status(listed.contains(user), version);
            }
        }
        if floor <= version {
            for user in listed {
                after.entry(*user).or_insert(status(true, version));
            }
        }
        (after, floor.max(version))
    }

    #[tokio::test]
    async fn a_snapshot_applies_to_memory_as_the_store_applies_it() {
        // A small deterministic generator: many shapes, the same each run.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..300 {
            let set = StatusSet::default();
            let floor = next(6);
            set.put_floor(floor);
            let mut before = HashMap::new();
            for user in 1..=40 {
                if next(3) > 0 {
                    let status = status(next(2) == 1, floor + 1 + next(6));
                    set.put(user, status);
                    before.insert(user, status);
                }
            }
            let version = 1 + next(10);
            // Duplicates and users with no entry among the listed.
            let listed: Vec<u64> = (0..next(30)).map(|_| 1 + next(50)).collect();
            let (want, want_floor) = stored_after_snapshot(&before, floor, &listed, version);
            let mut flipped = Vec::new();
            let flip = |user| flipped.push(user);
            set.apply_snapshot(&Listed::new(vec![listed.clone()]), version, flip)
                .await;
            assert_eq!(set.floor(), want_floor, "round {round}");
            assert_eq!(set.len(), want.len(), "round {round}");
            for user in 1..=60 {
                let want_status = want.get(&user).copied();
                let want_status = want_status.unwrap_or(status(false, want_floor));
                let at = format!("round {round}, user {user}");
                assert_eq!(set.get(self::user(user)), want_status, "{at}");
                let was = before.get(&user).is_some_and(|s| s.enabled);
                let flip = was != want_status.enabled;
                assert_eq!(flipped.contains(&user), flip, "{at}: told of a flip");
            }
        }
    }

    #[test]
    fn the_largest_version_round_trips() {
        let set = StatusSet::default();
        set.apply_changes(&[item(1, true, MAX_VERSION)]);
        assert_eq!(set.get(user(1)), status(true, MAX_VERSION));
    }
}
