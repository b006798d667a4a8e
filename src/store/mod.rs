//! Everything that speaks SQL (the one module that imports sqlx:
//! `tests/imports.rs` holds it): SQLite (one replica, the embedded default) or
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
//! No caller matches on the database kind.

mod budgets;
mod database;
mod error;
#[cfg(feature = "test-faults")]
pub mod faults;
mod hints;
mod leadership;
mod migrations;
mod pool;
mod reveals;
mod status;

pub use budgets::{BudgetStore, BudgetStoreError, Pruned, Spend, Total};
pub use database::{Database, PROBE_BOUND, keeps_sessions};
pub use error::StoreError;
pub use hints::ChangeHints;
pub use leadership::{Fence, Leader, Leadership};
pub use migrations::{MIGRATION_BOUND, Migrations, migration_lock_key};
pub use pool::{ACQUIRE_TIMEOUT, Bounds};
pub use reveals::{RevealStore, RevealStoreError};
pub use status::{
    CHANGES_PAGE, Change, FLOOR_USER, PreparedSnapshot, Row, SnapshotLoad, StatusStore,
    StatusStoreError, Watermark,
};

pub use database::MigrationState;
