//! The domain: types that hold only valid values, parsed once at the edge, and
//! the rules that need no I/O; it imports nothing of the crate above it.

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
