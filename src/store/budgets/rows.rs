//! The budget store's rows as both dialects read and write them: a spend
//! reported, a total after a report, what a batch of retention deletes, and
//! the conversions to and from their columns.

/// What one replica spent on one viewer in one window since its last report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spend {
    /// The viewer's fleet key (a hash of the id, the same on every replica).
    pub viewer: u64,
    /// 0: the minute budget; 1: the day budget.
    pub kind: u8,
    pub window: u32,
    pub n: u32,
}

/// The fleet's total of one viewer's window after a report, and of the window
/// before it (PostgreSQL; SQLite, one replica, reports what it knows: 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Total {
    pub viewer: u64,
    pub kind: u8,
    pub window: u32,
    pub spent: u64,
    pub before: u64,
}

/// What one batch of retention deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub rows: u64,
    /// A statement deleted a full batch: there may be more.
    pub more: bool,
}

/// One statement of a batch of retention: at most a batch of the rows it
/// names. One kind of window at a time: a plain range of the (kind,
/// window_id) index, which a LIMIT stops early (an OR of both kinds is a
/// bitmap of every expired row on PostgreSQL, built again for each batch).
#[derive(Debug, Clone, Copy)]
pub(super) enum Expired {
    /// The windows of `kind` before `before`.
    Windows { kind: i16, before: i64 },
    /// The refusals that ended before `before_s`.
    Refusals { before_s: i64 },
}

/// A total as both dialects return it: (viewer, kind, window_id, spent,
/// spent in the window before).
pub(super) type TotalRow = (i64, i16, i64, i64, i64);

// Viewers are stored as the signed bit pattern of their 64-bit key.
#[allow(clippy::cast_possible_wrap, reason = "a bit pattern, both ways")]
pub(super) fn key(viewer: u64) -> i64 {
    viewer as i64
}
#[allow(clippy::cast_sign_loss, reason = "a bit pattern, both ways")]
pub(super) fn viewer_of(key: i64) -> u64 {
    key as u64
}

pub(super) fn total((viewer, kind, window, spent, before): TotalRow) -> Total {
    Total {
        viewer: viewer_of(viewer),
        kind: u8::try_from(kind).unwrap_or(u8::MAX),
        window: u32::try_from(window).unwrap_or(u32::MAX),
        spent: u64::try_from(spent).unwrap_or(0),
        before: u64::try_from(before).unwrap_or(0),
    }
}

pub(super) fn seconds(s: u64) -> i64 {
    i64::try_from(s).unwrap_or(i64::MAX)
}
