//! The number sources (`anonymous`, `calltracking`, `real`), what a failed one
//! does, and [`Sources`], one value per source (a fourth source is a variant
//! here and a column in each table, found by the compiler).

use std::ops::{Index, IndexMut};

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
    #[serde(rename = "real")]
    RealPhone,
}

impl Source {
    /// Every source, in the order of [`Sources`]' columns.
    pub const ALL: [Source; 3] = [Source::Anonymous, Source::Calltracking, Source::RealPhone];

    /// The source as `selection.order`, answers' `kind` and the reveal log
    /// name it (the real phone is `real` there).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Anonymous => "anonymous",
            Source::Calltracking => "calltracking",
            Source::RealPhone => "real",
        }
    }

    /// The source's upstream name, as its config sections (`[upstreams.real_phone]`)
    /// and the `upstream` and `cache` metric labels write it.
    pub fn upstream_name(self) -> &'static str {
        match self {
            Source::Anonymous => "anonymous",
            Source::Calltracking => "calltracking",
            Source::RealPhone => "real_phone",
        }
    }

    /// The source named `text` (as [`Source::as_str`] writes it), if any.
    pub fn from_name(text: &str) -> Option<Source> {
        Source::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// This source's column in a [`Sources`] and [`Source::ALL`] (declaration
    /// order, so indexing needs no bounds check); the reveal's reason stores it.
    pub const fn column(self) -> usize {
        self as usize
    }
}

/// One `T` per source, indexed by [`Source`]: an array, so a lookup is an
/// offset (the hit path reads states and counters through it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sources<T>([T; 3]);

impl<T> Sources<T> {
    /// The table with these values, in [`Source::ALL`]'s order.
    pub const fn new(anonymous: T, calltracking: T, real: T) -> Self {
        Sources([anonymous, calltracking, real])
    }

    /// The table of `f(source)` for every source.
    pub fn from_fn(f: impl FnMut(Source) -> T) -> Self {
        Sources(Source::ALL.map(f))
    }

    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Sources<U> {
        Sources(self.0.map(f))
    }

    /// Each source with its value, in [`Source::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = (Source, &T)> {
        Source::ALL.into_iter().zip(self.0.iter())
    }

    /// The values, in [`Source::ALL`]'s order.
    pub fn values(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

impl<T> Index<Source> for Sources<T> {
    type Output = T;

    #[inline]
    fn index(&self, source: Source) -> &T {
        &self.0[source.column()]
    }
}

impl<T> IndexMut<Source> for Sources<T> {
    #[inline]
    fn index_mut(&mut self, source: Source) -> &mut T {
        &mut self.0[source.column()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_columns_follow_all() {
        for source in Source::ALL {
            assert_eq!(Source::from_name(source.as_str()), Some(source));
        }
        assert_eq!(Source::from_name("real_phone"), None);
        let upstreams = Sources::from_fn(Source::upstream_name);
        let names = Sources::new("anonymous", "calltracking", "real_phone");
        assert_eq!(upstreams, names);
        let table = Sources::from_fn(Source::as_str);
        assert_eq!(table, Sources::new("anonymous", "calltracking", "real"));
        for (source, name) in table.iter() {
            assert_eq!(table[source], *name);
        }
        let mut lengths = table.map(str::len);
        lengths[Source::RealPhone] = 0;
        assert_eq!(lengths.values().copied().collect::<Vec<_>>(), [9, 12, 0]);
        for (position, source) in Source::ALL.into_iter().enumerate() {
            assert_eq!(source.column(), position);
        }
    }
}
