//! The call-tracking status set: in-memory reads ([`StatusSet`]) and the write path
//! ([`StatusService`]) that makes a change durable in the [`StatusStore`] before it
//! changes memory.

mod set;
mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use set::{Applied, MAX_VERSION, Status, StatusSet};
pub use store::{MemoryStore, StatusStore, StoreError};

use crate::upstream::StatusItem;

/// Owns the write path: one writer at a time (a tokio mutex, held across the store
/// call), store first, memory second, so memory never holds a change the store
/// refused and the counts in memory match what was stored.
#[derive(Clone)]
pub struct StatusService {
    set: Arc<StatusSet>,
    store: Arc<dyn StatusStore>,
    writer: Arc<tokio::sync::Mutex<()>>,
    /// Set once the set was loaded from the store; `/readyz` waits for it.
    loaded: Arc<AtomicBool>,
}

impl StatusService {
    pub fn new(store: Arc<dyn StatusStore>) -> Self {
        StatusService {
            set: Arc::new(StatusSet::default()),
            store,
            writer: Arc::new(tokio::sync::Mutex::new(())),
            loaded: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The read side, for the request path.
    pub fn set(&self) -> &Arc<StatusSet> {
        &self.set
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Loads every stored status into memory.
    ///
    /// # Errors
    /// The store could not be read.
    pub async fn load(&self) -> Result<usize, StoreError> {
        let _writer = self.writer.lock().await;
        let rows = self.store.load().await?;
        let count = rows.len();
        self.set.load(rows);
        self.loaded.store(true, Ordering::Release);
        Ok(count)
    }

    /// Applies a delta delivery (webhook or feed page).
    ///
    /// # Errors
    /// The store refused it; memory is unchanged.
    pub async fn apply_changes(&self, items: &[StatusItem]) -> Result<Applied, StoreError> {
        let _writer = self.writer.lock().await;
        self.store.apply_changes(items).await?;
        Ok(self.set.apply_changes(items))
    }

    /// Applies a full snapshot; `enabled` is sorted and deduplicated here.
    ///
    /// # Errors
    /// The store refused it; memory is unchanged.
    pub async fn apply_snapshot(
        &self,
        version: u64,
        mut enabled: Vec<u64>,
    ) -> Result<(), StoreError> {
        enabled.sort_unstable();
        enabled.dedup();
        let _writer = self.writer.lock().await;
        self.store.apply_snapshot(version, &enabled).await?;
        self.set.apply_snapshot(version, &enabled);
        Ok(())
    }
}
