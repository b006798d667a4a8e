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
//! | [`Database`] | opening, migrations, the pooler check, closing | `app` |
//!
//! No caller matches on the database kind: each handle hides it. Each store
//! has its own error ([`StatusStoreError`], [`RevealStoreError`]) around the
//! one cause ([`StoreError`]), so a log line or an HTTP answer can say which
//! store failed; the database-wide work returns the cause bare.
//!
//! **The files are split by capability**, each holding both dialects:
//! `database.rs` (connecting, [`Bounds`], the bounded and timed call wrappers,
//! migrations, the pooler probe), `status/` (the status store; its two
//! dialects are long and differ in shape, so they are a file each within it),
//! `reveals.rs`, `signals.rs` (change hints and leadership). By capability
//! rather than by backend because capabilities are what change: a new query
//! is written once per dialect side by side, where a reader sees the two stay
//! equal, and the error, the bounds and the operation label are decided in the
//! same room. A backend is added rarely and is the wider change either way.
//!
//! - *A new capability* (as `budgets.rs` was): one file here with its
//!   handle, its error and its SQL in both dialects, plus a migration per
//!   dialect in `migrations/`; a constructor on [`Database`], one line of the
//!   table above; `app` hands the handle to its owner.
//! - *A new query in a capability*: that capability's file(s) only.
//! - *A new backend*: a variant of `database::Backend` with its connection in
//!   `database.rs`, then its dialect in each capability's file (the compiler
//!   lists every `match` that lacks it), and a `migrations/` directory.

/// Runs one query-building expression on whichever database `$backend` holds
/// (a `database::Backend`; sqlx's query types differ per database, so one
/// function cannot take both), with `$conn` the connection to run it on: on
/// PostgreSQL a transaction, a lone statement too, so that it is pooler-safe
/// (see `database::Pg`); on SQLite a pooled connection, a lone statement being
/// atomic there. Evaluates to the expression's value, or returns the error.
/// For queries whose text is the same in both dialects; the using file imports
/// `Backend`.
macro_rules! on_connection {
    ($backend:expr, $conn:ident => $query:expr) => {
        match $backend {
            Backend::Postgres(pg) => {
                let mut $conn = pg.begin().await?;
                let value = $query;
                $conn.commit().await?;
                value
            }
            Backend::Sqlite(pool) => {
                let mut $conn = pool.acquire().await?;
                $query
            }
        }
    };
}

mod budgets;
mod database;
mod priority;
mod reveals;
mod signals;
mod status;

pub use budgets::{BudgetStore, BudgetStoreError, Pruned, Spend, Total};
pub use database::{ACQUIRE_TIMEOUT, Bounds, Database, PROBE_BOUND, StoreError, keeps_sessions};
pub use reveals::{RevealStore, RevealStoreError};
pub use signals::{ChangeHints, Fence, Leader, Leadership};
pub use status::{
    CHANGES_PAGE, Change, FLOOR_USER, Row, SnapshotLoad, StatusStore, StatusStoreError, Watermark,
};
