//! The reveal log's rows as both dialects read them: a row of `reveals`
//! ([`RevealRow`]) and the reveal it stands for.

use crate::domain::{AdId, CategoryId, Reveal, Source, StoredReveal, UserId, Viewer};
use crate::store::pool::unsigned;

/// A row of `reveals`: (id, at_us, viewer, user_id, ad_id, category_id, kind).
pub(super) type RevealRow = (i64, i64, Option<String>, i64, i64, i64, String);

/// The reveal a row stands for; `None` for a row no reveal could hold.
pub(super) fn stored(row: RevealRow) -> Option<StoredReveal> {
    let (id, at_us, viewer, user, ad, category, kind) = row;
    Some(StoredReveal {
        id,
        reveal: Reveal {
            at_us,
            viewer: viewer.and_then(|v| Viewer::parse(v.as_bytes()).ok()),
            user: UserId::new(unsigned(user)).ok()?,
            ad: AdId::new(unsigned(ad)).ok()?,
            category: CategoryId::new(unsigned(category)).ok()?,
            kind: Source::from_name(&kind)?,
        },
    })
}
