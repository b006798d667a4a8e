//! Reveals (the reveal log): who was shown which seller's number, and when.
//! The number itself is never part of one.

use std::fmt;

use super::ids::{AdId, CategoryId, UserId};
use super::reason::Reason;
use super::source::Source;

/// The buyer as the trusted backend names them (`X-Viewer-Id`): 1 to 128 visible ASCII.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Viewer(Box<str>);

/// Why a viewer id was refused; safe to show to a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be 1 to {} visible ASCII characters", Viewer::MAX_LEN)]
pub struct ViewerError;

impl Viewer {
    pub const MAX_LEN: usize = 128;

    /// Parses 1 to [`Viewer::MAX_LEN`] bytes of visible ASCII.
    pub fn parse(bytes: &[u8]) -> Result<Self, ViewerError> {
        if bytes.is_empty()
            || bytes.len() > Self::MAX_LEN
            || !bytes.iter().all(u8::is_ascii_graphic)
        {
            return Err(ViewerError);
        }
        // Visible ASCII is UTF-8; the fallback is never taken.
        std::str::from_utf8(bytes)
            .map(|s| Viewer(s.into()))
            .map_err(|_| ViewerError)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Viewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// One number shown: when (microseconds since the Unix epoch), to whom, for
/// which seller, ad and category, of which kind, and why that kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reveal {
    pub at_us: i64,
    pub viewer: Option<Viewer>,
    pub user: UserId,
    pub ad: AdId,
    pub category: CategoryId,
    pub kind: Source,
    /// Why this kind (`None`: a reveal recorded before reasons were kept).
    pub reason: Option<Reason>,
}

/// A reveal as stored: with its row id, which orders reveals of the same instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredReveal {
    pub id: i64,
    pub reveal: Reveal,
}

/// Whose reveals to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevealsOf {
    Seller(UserId),
    Viewer(Viewer),
}

/// A page of the log, newest first: reveals at `since_us` or later and before
/// `until_us`, strictly before `after` (the keyset cursor: time, then row id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevealQuery {
    pub of: RevealsOf,
    pub since_us: i64,
    pub until_us: i64,
    pub after: Option<(i64, i64)>,
    pub limit: u32,
}

impl RevealQuery {
    /// The first page, up to `limit` reveals, of `of` over all time.
    pub fn newest(of: RevealsOf, limit: u32) -> Self {
        RevealQuery {
            of,
            since_us: i64::MIN,
            until_us: i64::MAX,
            after: None,
            limit,
        }
    }
}

/// How many numbers of each kind were shown for one ad.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RevealCounts {
    pub anonymous: u64,
    pub calltracking: u64,
    pub real: u64,
}

impl RevealCounts {
    pub fn total(&self) -> u64 {
        self.anonymous + self.calltracking + self.real
    }

    pub fn add(&mut self, kind: Source, n: u64) {
        match kind {
            Source::Anonymous => self.anonymous += n,
            Source::Calltracking => self.calltracking += n,
            Source::RealPhone => self.real += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viewer_ids_are_visible_ascii_up_to_128() {
        assert_eq!(Viewer::parse(b"v-1").unwrap().as_str(), "v-1");
        assert!(Viewer::parse(&[b'x'; 128]).is_ok());
        for bad in [
            &b""[..],
            &[b'x'; 129],
            b"a b",
            b"caf\xc3\xa9",
            b"tab\t",
            b"\x7f",
        ] {
            assert_eq!(Viewer::parse(bad), Err(ViewerError), "{bad:?}");
        }
    }
}
