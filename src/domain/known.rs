//! [`Known`]: what this replica knows of something without asking an upstream,
//! the one language of the caches, the status set and the selection plan.

/// What is known without asking: `Yes` what (a cached number; `()` for call
/// tracking on), `No` known absent (a cached "no number", call tracking off),
/// `NotKnown` not known here (a miss; the status set not loaded: it may be on).
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
