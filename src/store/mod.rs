//! Everything that speaks SQL (the one module that imports sqlx:
//! `tests/arrows.rs` holds it): SQLite (one replica, the embedded default) or
//! PostgreSQL (a cluster), opened once as a [`Database`] by `app`, which hands
//! each part the narrow handle of the capability it uses:
//!
//! | handle | capability | held by |
//! |---|---|---|
//! | [`StatusStore`] | the status set's writes, snapshot loads, the change log (status changes and cache invalidations, in one order), the feed cursor | the status service |
//! | [`RevealStore`] | the reveal log: batch writes with per-ad counts, keyset pages, an ad's counts, retention | the reveal flush and retention tasks, the reveal routes |
//! | [`BudgetStore`] | viewer budgets: each replica's spends added to the fleet's totals per window, refusals, the replicas alive, retention | the budgets' exchange task |
//! | [`Leadership`] | feed leadership (one replica polls the status feed) | the feed loop |
//! | [`ChangeHints`] | "the change log may have grown" | the sync loop |
//! | [`Database`] | opening, migrations, the pooler check, closing; makes the handles | `app` |
//!
//! No caller matches on the database kind: each handle hides it. Each store
//! has its own error ([`StatusStoreError`], [`RevealStoreError`],
//! [`BudgetStoreError`]) around the one cause ([`StoreError`]), so a log line
//! or an HTTP answer can say which store failed; the database-wide work
//! returns the cause bare.
//!
//! **Split by capability, then by dialect.** Each capability is a module of
//! one shape: its interface (the handle, its error, its operations, the rows
//! both dialects read and write, and the queries whose text is the same in
//! both) first, then a file per
//! dialect with that dialect's SQL, side by side where a reader sees the two
//! stay equal. By capability first because capabilities are what change: a
//! new query is one capability's interface and dialects, and its error, its
//! bounds and its operation label are decided in the same module. A backend is
//! added rarely and is the wider change either way. Beside the capabilities,
//! what they all share: the pool of either kind with its bounds and timed
//! calls (`pool`), the one cause of every failure (`error`), and the
//! [`Database`], which opens SQLite or PostgreSQL (with the reveal log's own
//! SQLite writer) and builds the handles.
//!
//! - *A new capability*: a module with its handle, its error and its SQL in
//!   each dialect, plus a migration per dialect in `migrations/`; a
//!   constructor on [`Database`], one line of the table above; `app` hands the
//!   handle to its owner.
//! - *A new query in a capability*: that capability's interface and
//!   dialects only.
//! - *A new backend*: a variant of the pool's backend and its connection in
//!   [`Database`], then a dialect in each capability (the compiler lists every
//!   `match` that lacks it), and a `migrations/` directory.

mod budgets;
mod database;
mod error;
#[cfg(feature = "test-faults")]
pub mod faults;
mod hints;
mod leadership;
mod pool;
mod reveals;
mod status;

pub use budgets::{BudgetStore, BudgetStoreError, Pruned, Spend, Total};
pub use database::{Database, MIGRATION_BOUND, PROBE_BOUND, keeps_sessions};
pub use error::StoreError;
pub use hints::ChangeHints;
pub use leadership::{Fence, Leader, Leadership};
pub use pool::{ACQUIRE_TIMEOUT, Bounds};
pub use reveals::{RevealStore, RevealStoreError};
pub use status::{
    CHANGES_PAGE, Change, FLOOR_USER, PreparedSnapshot, Row, SnapshotLoad, StatusStore,
    StatusStoreError, Watermark,
};
