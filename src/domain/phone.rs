//! The `Phone` type: an E.164 number parsed and normalised once at the edge,
//! held as the integer value of its digits (at most 15, no leading zero: unique,
//! fits a `u64`). `Display` gives the full number for API bodies; `Debug` and
//! [`Phone::masked`] give the form that may be logged.

use std::fmt;
use std::num::NonZeroU64;

/// Shortest and longest digit counts accepted after the `+`.
const MIN_DIGITS: usize = 8;
const MAX_DIGITS: usize = 15;

/// A valid E.164 number. Cannot hold anything else.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Phone(NonZeroU64);

/// Why a string is not a phone number; the text is safe to show to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PhoneError {
    #[error("is empty")]
    Empty,
    #[error("must start with '+'")]
    MissingPlus,
    #[error("may contain only digits after '+' (spaces, hyphens and parentheses are dropped)")]
    BadCharacter,
    #[error("must have 8 to 15 digits")]
    BadLength,
    #[error("must not start with 0 after '+'")]
    LeadingZero,
}

impl Phone {
    /// Parses `+` and 8 to 15 digits (first not 0), dropping spaces, hyphens and
    /// parentheses.
    pub fn parse(input: &str) -> Result<Self, PhoneError> {
        let mut chars = input
            .bytes()
            .filter(|b| !matches!(b, b' ' | b'-' | b'(' | b')'))
            .peekable();
        match chars.next() {
            None => return Err(PhoneError::Empty),
            Some(b'+') => {}
            Some(_) => return Err(PhoneError::MissingPlus),
        }
        if chars.peek() == Some(&b'0') {
            return Err(PhoneError::LeadingZero);
        }
        let mut value: u64 = 0;
        let mut digits = 0usize;
        for b in chars {
            if !b.is_ascii_digit() {
                return Err(PhoneError::BadCharacter);
            }
            digits += 1;
            if digits > MAX_DIGITS {
                return Err(PhoneError::BadLength);
            }
            value = value * 10 + u64::from(b - b'0');
        }
        if digits < MIN_DIGITS {
            return Err(PhoneError::BadLength);
        }
        // The first digit is 1..=9, so the value is at least 10^7: never zero.
        NonZeroU64::new(value)
            .map(Phone)
            .ok_or(PhoneError::LeadingZero)
    }

    /// Rebuilds a phone from [`Phone::to_u64`]; `None` if the value is not one.
    pub fn from_u64(value: u64) -> Option<Self> {
        let digits = value.checked_ilog10()? as usize + 1;
        (MIN_DIGITS..=MAX_DIGITS)
            .contains(&digits)
            .then(|| NonZeroU64::new(value).map(Phone))
            .flatten()
    }

    /// The digits as one integer (the compact cached form).
    pub fn to_u64(self) -> u64 {
        self.0.get()
    }

    /// The loggable form: `+` and stars for all but the last two digits.
    pub fn masked(self) -> Masked {
        Masked(self)
    }
}

impl fmt::Display for Phone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "+{}", self.0)
    }
}

/// Masked on purpose: `{:?}` ends up in logs.
impl fmt::Debug for Phone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.masked(), f)
    }
}

/// A phone as it may appear in logs, traces and labels.
pub struct Masked(Phone);

impl fmt::Display for Masked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.0.0.get();
        let digits = value.ilog10() + 1;
        f.write_str("+")?;
        for _ in 0..digits.saturating_sub(2) {
            f.write_str("*")?;
        }
        write!(f, "{:02}", value % 100)
    }
}

impl serde::Serialize for Phone {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_separators() {
        let p = Phone::parse("+7 (916) 123-45-67").unwrap();
        assert_eq!(p.to_string(), "+79161234567");
        assert_eq!(serde_json::to_string(&p).unwrap(), r#""+79161234567""#);
        assert_eq!(p.to_u64(), 79_161_234_567);
    }

    #[test]
    fn accepts_the_length_bounds() {
        assert_eq!(Phone::parse("+12345678").unwrap().to_string(), "+12345678");
        let longest = "+123456789012345";
        assert_eq!(Phone::parse(longest).unwrap().to_string(), longest);
    }

    #[test]
    fn rejects_what_is_not_e164() {
        use PhoneError::*;
        let cases = [
            ("", Empty),
            ("   ", Empty),
            ("79161234567", MissingPlus),
            ("8 916 123 45 67", MissingPlus),
            ("+0123456789", LeadingZero),
            ("+1234567", BadLength),
            ("+1234567890123456", BadLength),
            ("+7916123456a", BadCharacter),
            ("+7916.123.4567", BadCharacter),
            ("++79161234567", BadCharacter),
            ("+7916+1234567", BadCharacter),
            ("+", BadLength),
            ("+７9161234567", BadCharacter),
        ];
        for (input, want) in cases {
            assert_eq!(Phone::parse(input), Err(want), "input {input:?}");
        }
    }

    #[test]
    fn masks_all_but_the_last_two_digits() {
        let p = Phone::parse("+79161234567").unwrap();
        assert_eq!(p.masked().to_string(), "+*********67");
        assert_eq!(format!("{p:?}"), "+*********67");
        let p = Phone::parse("+12345601").unwrap();
        assert_eq!(p.masked().to_string(), "+******01");
    }

    #[test]
    fn round_trips_through_u64() {
        let p = Phone::parse("+441234567890").unwrap();
        assert_eq!(Phone::from_u64(p.to_u64()), Some(p));
        assert_eq!(Phone::from_u64(0), None);
        assert_eq!(Phone::from_u64(1234567), None);
        assert_eq!(Phone::from_u64(u64::MAX), None);
    }
}
