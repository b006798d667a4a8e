//! The change log's rows as both dialects read and write them: a row in
//! change order ([`Row`]), a position in the log ([`Watermark`]), the
//! snapshot floor's row ([`FLOOR_USER`]), and a delivery's plan against the
//! stored versions.

use std::collections::HashMap;

use crate::domain::{Applied, Status, StatusChange};
use crate::store::pool::unsigned;

/// The row that holds the snapshot floor (migration 0002): user ids start at 1,
/// so user 0 is free. Its version is the last snapshot's; every user without a
/// row of their own has that version, disabled. A snapshot moves it like any
/// other row at or below its version; deltas read it as the version of users
/// without a row; catch-up hands it over with the other rows, in change order.
pub const FLOOR_USER: u64 = 0;

/// A row of the change log, in change order: a status as stored, or a cache
/// invalidation (PostgreSQL only; with SQLite invalidations stay local).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub user_id: u64,
    pub seq: i64,
    pub change: Change,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Status {
        status: Status,
        /// The change that last turned call tracking on or off (0: never).
        flip_seq: i64,
    },
    /// Every cached number of the seller is to be dropped.
    Invalidated,
}

/// A row as both databases return it: (user_id, enabled, version, change_seq,
/// flip_seq, is an invalidation).
pub(super) type RowTuple = (i64, bool, i64, i64, i64, bool);

impl From<RowTuple> for Row {
    fn from((user_id, enabled, version, seq, flip_seq, invalidation): RowTuple) -> Self {
        Row {
            user_id: unsigned(user_id),
            seq,
            change: if invalidation {
                Change::Invalidated
            } else {
                Change::Status {
                    status: Status {
                        enabled,
                        version: unsigned(version),
                    },
                    flip_seq,
                }
            },
        }
    }
}

/// A position in the change log: (change_seq, user_id) of the last row seen.
pub type Watermark = (i64, i64);

/// Distinct users of a delivery, and the floor row: the stored versions a
/// delivery is planned against.
pub(super) fn users_of(items: &[StatusChange]) -> Vec<u64> {
    let mut users: Vec<u64> = items.iter().map(|i| i.user.get()).collect();
    users.push(FLOOR_USER);
    users.sort_unstable();
    users.dedup();
    users
}

/// Plans a delivery against the stored versions read with [`users_of`] (the
/// floor row among them).
pub(super) fn plan(
    items: &[StatusChange],
    mut stored: HashMap<u64, u64>,
) -> (Applied, Vec<StatusChange>) {
    let floor = stored.remove(&FLOOR_USER).unwrap_or(0);
    crate::domain::plan_changes(items, &stored, floor)
}
