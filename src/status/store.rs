//! [`StatusStore`]: where the status set is made durable. The interface the
//! database-backed stores implement; [`MemoryStore`] keeps nothing beyond the
//! process (the in-memory set itself is the only copy).

use futures_util::future::BoxFuture;

use super::set::Status;
use crate::upstream::StatusItem;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// Durable storage of statuses. Each call is one transaction: it either takes the
/// whole change or none of it. Version rules are the same as `StatusSet`'s.
pub trait StatusStore: Send + Sync {
    fn apply_changes<'a>(
        &'a self,
        items: &'a [StatusItem],
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn apply_snapshot<'a>(
        &'a self,
        version: u64,
        enabled: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn load(&self) -> BoxFuture<'_, Result<Vec<(u64, Status)>, StoreError>>;
}

/// No durability: a restart forgets every status.
#[derive(Debug, Default)]
pub struct MemoryStore;

impl StatusStore for MemoryStore {
    fn apply_changes<'a>(&'a self, _: &'a [StatusItem]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
    fn apply_snapshot<'a>(&'a self, _: u64, _: &'a [u64]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
    fn load(&self) -> BoxFuture<'_, Result<Vec<(u64, Status)>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}
