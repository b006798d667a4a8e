//! [`Known`]: what this replica knows of something without asking an
//! upstream. A cache's entry for a key (a number, a cached "no number", or a
//! miss), the status set's word on a seller's call tracking (on, off, or not
//! known before the set is loaded) and the selection plan's input are all one
//! of these, so no module translates another's.

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
