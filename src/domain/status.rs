//! The call-tracking status model: a user's status, its changes, and the one rule
//! that decides which applies (a newer version wins), for the set and both stores.

use std::collections::HashMap;
use std::fmt;

use super::ids::UserId;

/// Largest version accepted: versions are stored shifted by one bit in memory
/// (and as a signed 64-bit integer in PostgreSQL).
pub const MAX_VERSION: u64 = i64::MAX as u64;

/// A user's call-tracking status; version 0 means never seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    pub enabled: bool,
    pub version: u64,
}

/// Counts of one delta delivery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Applied {
    pub applied: u64,
    pub ignored: u64,
}

/// A version of a user's status at the source: `1..=MAX_VERSION`, monotonic per user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(u64);

impl Version {
    /// `value`, if within `1..=MAX_VERSION`.
    pub fn new(value: u64) -> Result<Self, InvalidItem> {
        if (1..=MAX_VERSION).contains(&value) {
            Ok(Version(value))
        } else {
            Err(InvalidItem {
                field: "version",
                reason: format!("must be an integer in 1..={MAX_VERSION}"),
            })
        }
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

/// One status change, valid by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusChange {
    pub user: UserId,
    pub enabled: bool,
    pub version: Version,
}

/// A status change as delivered (a webhook item, a feed item): the integers as
/// given, turned into a [`StatusChange`] by [`StatusItem::parse`], the one place
/// they are checked.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema,
)]
pub struct StatusItem {
    #[schema(value_type = i64, minimum = 1)]
    pub user_id: u64,
    pub enabled: bool,
    /// Monotonic per user at the source.
    #[schema(value_type = i64, minimum = 1)]
    pub version: u64,
}

/// Why a delivered item is not a valid change: the field and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidItem {
    pub field: &'static str,
    pub reason: String,
}

impl fmt::Display for InvalidItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl StatusItem {
    /// Checks the ranges; an error names the field out of range.
    pub fn parse(self) -> Result<StatusChange, InvalidItem> {
        let user = UserId::new(self.user_id).map_err(|e| InvalidItem {
            field: "user_id",
            reason: e.to_string(),
        })?;
        Ok(StatusChange {
            user,
            enabled: self.enabled,
            version: Version::new(self.version)?,
        })
    }
}

impl From<StatusChange> for StatusItem {
    fn from(change: StatusChange) -> Self {
        StatusItem {
            user_id: change.user.get(),
            enabled: change.enabled,
            version: change.version.get(),
        }
    }
}

/// Which changes of a delivery apply, given the stored versions by user id (the
/// `floor` for none), each as if its own delivery; and each changed user's final
/// row, by user id.
pub fn plan_changes(
    changes: &[StatusChange],
    stored: &HashMap<u64, u64>,
    floor: u64,
) -> (Applied, Vec<StatusChange>) {
    let mut latest: HashMap<UserId, StatusChange> = HashMap::new();
    let mut counts = Applied::default();
    for change in changes {
        let current = latest
            .get(&change.user)
            .map(|c| c.version.get())
            .or_else(|| stored.get(&change.user.get()).copied())
            .unwrap_or(floor);
        if change.version.get() > current {
            latest.insert(change.user, *change);
            counts.applied += 1;
        } else {
            counts.ignored += 1;
        }
    }
    let mut rows: Vec<StatusChange> = latest.into_values().collect();
    rows.sort_unstable_by_key(|r| r.user);
    (counts, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(user: u64, enabled: bool, version: u64) -> StatusChange {
        StatusItem {
            user_id: user,
            enabled,
            version,
        }
        .parse()
        .unwrap()
    }

    fn applied(applied: u64, ignored: u64) -> Applied {
        Applied { applied, ignored }
    }

    #[test]
    fn plan_takes_changes_in_order_against_stored_versions() {
        let stored = HashMap::from([(1, 10), (2, 3)]);
        let changes = [
            change(1, true, 10),
            change(1, false, 11),
            change(1, true, 11),
            change(2, true, 4),
            change(3, true, 1),
            change(3, false, 1),
            change(2, false, 2),
        ];
        let (counts, rows) = plan_changes(&changes, &stored, 0);
        assert_eq!(counts, applied(3, 4));
        let want = [change(1, false, 11), change(2, true, 4), change(3, true, 1)];
        assert_eq!(rows, want);
    }

    #[test]
    fn users_without_a_row_have_the_floor() {
        let changes = [
            change(7, true, 50),
            change(7, true, 100),
            change(8, true, 101),
        ];
        let (counts, rows) = plan_changes(&changes, &HashMap::new(), 100);
        assert_eq!(counts, applied(1, 2));
        assert_eq!(rows, [change(8, true, 101)]);
    }

    #[test]
    fn items_are_checked_once_naming_the_field() {
        let item = |user_id, version| StatusItem {
            user_id,
            enabled: true,
            version,
        };
        assert_eq!(item(0, 1).parse().unwrap_err().field, "user_id");
        assert_eq!(item(1, 0).parse().unwrap_err().field, "version");
        let past = item(1, MAX_VERSION + 1).parse().unwrap_err();
        assert_eq!(past.field, "version");
        let largest = item(1, MAX_VERSION).parse().unwrap();
        assert_eq!(largest, change(1, true, MAX_VERSION));
    }
}
