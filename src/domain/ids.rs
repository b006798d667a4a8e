//! Identifiers parsed once at the edge: `UserId`, `AdId`, `CategoryId`, each
//! holding only what the contract allows (users and ads 1..=2^63-1, categories
//! 1..=2^31-1), so nothing inside the service re-validates them.

use std::fmt;

/// Why an identifier did not parse; safe to show to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be an integer in 1..={max}")]
pub struct IdError {
    pub max: u64,
}

macro_rules! id_type {
    ($name:ident, $max:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(u64);

        impl $name {
            pub const MAX: u64 = $max;

            /// `value`, if within `1..=MAX`.
            pub fn new(value: u64) -> Result<Self, IdError> {
                if (1..=Self::MAX).contains(&value) {
                    Ok(Self(value))
                } else {
                    Err(IdError { max: Self::MAX })
                }
            }

            /// Parses decimal text in `1..=MAX`; a leading `+` is refused.
            pub fn parse(text: &str) -> Result<Self, IdError> {
                if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(IdError { max: Self::MAX });
                }
                text.parse::<u64>()
                    .map_err(|_| IdError { max: Self::MAX })
                    .and_then(Self::new)
            }

            pub fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(UserId, i64::MAX as u64, "A seller.");
id_type!(AdId, i64::MAX as u64, "A classified ad.");
id_type!(CategoryId, i32::MAX as u64, "An ad category.");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive() {
        assert!(UserId::new(1).is_ok());
        assert!(UserId::new(i64::MAX as u64).is_ok());
        assert!(UserId::new(0).is_err());
        assert!(UserId::new(i64::MAX as u64 + 1).is_err());
        assert!(CategoryId::new(i32::MAX as u64).is_ok());
        assert!(CategoryId::new(i32::MAX as u64 + 1).is_err());
    }

    #[test]
    fn parse_rejects_non_decimal_text() {
        #[rustfmt::skip]
        let refused = ["", "-1", "+1", "1.0", "1e3", " 1", "0x10", "abc", "99999999999999999999"];
        for bad in refused {
            assert!(AdId::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(AdId::parse("0042").map(AdId::get), Ok(42));
    }
}
