//! [`Known`]: what this replica knows of something without asking an
//! upstream; the caches, the status set and the selection plan all speak it,
//! so no module translates another's.

/// What is known without asking. `Yes` holds what is known (a cached number;
/// `()` for a seller's call tracking being on), `No` that it is known to be
/// absent (a cached "no number", call tracking off), `NotKnown` that it is
/// not known here (a cache miss, to be asked; the status set not loaded yet,
/// so the seller may have call tracking on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known<T> {
    Yes(T),
    No,
    NotKnown,
}

impl<T> Known<T> {
    /// A known answer: `Some` is `Yes`, `None` is `No`.
    pub fn of(value: Option<T>) -> Self {
        value.map_or(Known::No, Known::Yes)
    }
}
