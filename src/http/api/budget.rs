//! The viewer budgets as the public API speaks them (docs/budgets.md): a 429 with
//! `Retry-After`, or a 400 for a batch larger than a budget (no wait lets it in).

use super::error::ApiError;
use crate::budget::{Budgets, Refusal};
use crate::domain::Viewer;

/// The header the trusted backend sets to the buyer's id.
pub const VIEWER_HEADER: &str = "x-viewer-id";

/// Takes `items` reveals from the viewer's budgets (none without a viewer or
/// items): a 429 with the seconds until it fits, or a 400 when it never can.
pub fn check(budgets: &Budgets, viewer: Option<&Viewer>, items: usize) -> Result<(), ApiError> {
    let Some(viewer) = viewer.filter(|_| items > 0) else {
        return Ok(());
    };
    match budgets.check(viewer, u32::try_from(items).unwrap_or(u32::MAX)) {
        Ok(()) => Ok(()),
        Err(Refusal::Spent { retry_after_s }) => Err(ApiError::TooManyRequests { retry_after_s }),
        Err(Refusal::Never { items, budget, per }) => Err(ApiError::bad_request(format!(
            "items: {items} numbers asked at once, more than a viewer may see in a {per} \
             (rate_limit.per_viewer_per_{per} = {budget}); send at most {budget} per request"
        ))),
    }
}
