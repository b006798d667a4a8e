//! The number sources (`anonymous`, `calltracking`, `real`) as named in
//! `selection.order` and answers' `kind`, and what a failed one does.

use serde::Deserialize;

/// What a failed source does (docs/rules.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Answer 503; reveal nothing further down the order.
    FailClosed,
    /// Go on to the next source.
    FallThrough,
}

/// A number source, as named in `selection.order` and in answers' `kind`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Anonymous,
    Calltracking,
    Real,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Anonymous => "anonymous",
            Source::Calltracking => "calltracking",
            Source::Real => "real",
        }
    }
}
