//! The domain: types that can only hold valid values, parsed once at the edge,
//! and the rules that need no I/O. Everything else imports from here; this
//! module imports nothing of the crate above it.
//!
//! - [`phone`]: `Phone`, an E.164 number held as eight bytes, masked for display.
//! - [`ids`]: `UserId`, `AdId`, `CategoryId`.
//! - [`known`]: `Known`, what is known without asking an upstream (a cache's
//!   entry, a seller's call tracking, the selection plan's input).
//! - [`source`]: `Source` (anonymous, calltracking, real), `OnError`, and
//!   `Sources<T>`, one value per source indexed by `Source`.
//! - [`reason`]: why an answer is of its kind (`Reason`, its codes and
//!   their packed form), given by the rules and stored with each reveal.
//! - [`reveal`]: the reveal log's records (`Reveal`, `Viewer`) and queries.
//! - [`status`]: the call-tracking status model (`Status`, `StatusChange`,
//!   `Version`, `Applied`) and the version rule, `plan_changes`.
//! - [`wall_clock`]: the replica's wall clock, `since_epoch`, read in one place,
//!   and `Stopwatch`, elapsed wall time.

pub mod ids;
pub mod known;
pub mod phone;
pub mod reason;
pub mod reveal;
pub mod source;
pub mod status;
pub mod wall_clock;

pub use ids::{AdId, CategoryId, IdError, UserId};
pub use known::Known;
pub use phone::Phone;
pub use reason::{Code, Failure, Origin, Reason, Skip};
pub use reveal::{Reveal, RevealCounts, RevealQuery, RevealsOf, StoredReveal, Viewer};
pub use source::{OnError, Source, Sources};
pub use status::{
    Applied, InvalidItem, MAX_VERSION, Status, StatusChange, StatusItem, Version, plan_changes,
};
