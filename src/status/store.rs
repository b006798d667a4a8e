//! [`StatusStore`]: where the status set is made durable. The interface the
//! database-backed stores implement; [`MemoryStore`] keeps its copy in this
//! process only.

use futures_util::future::BoxFuture;

use super::set::{Status, StatusSet};
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

/// No durability: a copy in this process, lost on restart. Kept as a store of its
/// own so that loading (which replaces the in-memory set) behaves as with a database.
#[derive(Default)]
pub struct MemoryStore {
    statuses: StatusSet,
}

impl StatusStore for MemoryStore {
    fn apply_changes<'a>(
        &'a self,
        items: &'a [StatusItem],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.statuses.apply_changes(items);
        Box::pin(async { Ok(()) })
    }
    fn apply_snapshot<'a>(
        &'a self,
        version: u64,
        enabled: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.statuses.apply_snapshot(version, enabled);
        Box::pin(async { Ok(()) })
    }
    fn load(&self) -> BoxFuture<'_, Result<Vec<(u64, Status)>, StoreError>> {
        let rows = self.statuses.rows();
        Box::pin(async { Ok(rows) })
    }
}
