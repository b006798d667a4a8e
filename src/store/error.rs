//! Why a database call failed: the one cause every store's own error wraps.

use std::time::Duration;

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
    /// The call did not finish within its bound (see [`Bounds`](super::Bounds)).
    #[error("{operation} did not finish within {bound:?}")]
    TimedOut {
        operation: &'static str,
        bound: Duration,
    },
    /// A feed write was refused: its lease expired or another replica took it.
    #[error("the {0} lease is no longer this replica's")]
    LeaseLost(&'static str),
}
