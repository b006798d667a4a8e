//! Why a database call failed, whichever store made it: the one cause every
//! store's own error wraps (the status store's, the reveal store's, the
//! budget store's), and what the database-wide work (opening, migrations,
//! the pooler check, leadership) returns bare.

use std::time::Duration;

/// Why a database call failed, whichever store made it. Each store hands it on
/// wrapped in its own error (`StatusStoreError`, `RevealStoreError`,
/// `BudgetStoreError`), so that whoever logs or answers it says which store
/// failed; the database-wide work (opening, migrations, leadership) returns it
/// bare.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("unsupported database URL (expected sqlite:// or postgres://)")]
    UnsupportedUrl,
    /// No connection could be had: the pool's own error ("pool timed out")
    /// hides why, so the store asks once more itself and names the cause.
    #[error("cannot connect to {target}: {cause}")]
    Unreachable { target: String, cause: String },
    /// The call did not finish within its bound (see [`Bounds`](super::Bounds)); on the
    /// database's side the statement is cancelled by its own timeout.
    #[error("{operation} did not finish within {bound:?}")]
    TimedOut {
        operation: &'static str,
        bound: Duration,
    },
    /// A write for a leased duty (the status feed's cursor) was refused: the
    /// lease it was made under has expired or another replica took it.
    #[error("the {0} lease is no longer this replica's")]
    LeaseLost(&'static str),
}
