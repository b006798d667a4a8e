//! [`Request`], what the buyer asked about: the resolver's input, which the
//! pure [`super::plan`] reads too, so it sits below both.

use crate::domain::{AdId, CategoryId, Phone, UserId};

/// What the buyer asked about.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub user: UserId,
    pub ad: AdId,
    pub category: CategoryId,
    /// The seller's real number, when the caller already has it.
    pub phone: Option<Phone>,
}
