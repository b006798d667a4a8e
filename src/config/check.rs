//! The small checks of every section's validation, each naming the key it checks.

use std::fmt;
use std::ops::RangeInclusive;

use super::error::{Mistake, invalid};

/// Ten minutes: the longest any wait, pause or timeout key may be.
pub(super) const MAX_WAIT_MS: u64 = 600_000;

/// Range checks on the list of mistakes a section's validation fills: each
/// pushes a mistake naming the key and the range when the value is outside.
pub(super) trait Checks {
    fn range<T: PartialOrd + fmt::Display>(
        &mut self,
        key: &str,
        value: T,
        range: RangeInclusive<T>,
    );
    /// `value` must be in `range`, for the reason `note` (said after the range).
    fn range_noting<T: PartialOrd + fmt::Display>(
        &mut self,
        key: &str,
        value: T,
        range: RangeInclusive<T>,
        note: &str,
    );
}

impl Checks for Vec<Mistake> {
    fn range<T: PartialOrd + fmt::Display>(
        &mut self,
        key: &str,
        value: T,
        range: RangeInclusive<T>,
    ) {
        self.extend(in_range(key, value, range, "").err());
    }

    fn range_noting<T: PartialOrd + fmt::Display>(
        &mut self,
        key: &str,
        value: T,
        range: RangeInclusive<T>,
        note: &str,
    ) {
        self.extend(in_range(key, value, range, &format!(" ({note})")).err());
    }
}

/// `Ok` when `value` is in `range`, else an error naming `key` and the range
/// (`why` follows the range as it is). [`Checks`] is the way to call it.
pub(super) fn in_range<T>(
    key: &str,
    value: T,
    range: RangeInclusive<T>,
    why: &str,
) -> Result<(), Mistake>
where
    T: PartialOrd + fmt::Display,
{
    if range.contains(&value) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!(
            "must be in {}..={}{why}, got {value}",
            range.start(),
            range.end()
        ),
    ))
}

/// `url` as an absolute URL of one of `schemes` (else `scheme_rule`), naming a
/// host, with nothing after the path. Parsed by `http::Uri`: plain ASCII, no
/// host mapping.
pub(super) fn parse_url(
    key: &str,
    url: &str,
    schemes: &[&str],
    scheme_rule: &str,
) -> Result<hyper::Uri, Mistake> {
    let parsed: hyper::Uri = url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| invalid(key, format!("not a URL: {e}")))?;
    if !parsed.scheme_str().is_some_and(|s| schemes.contains(&s)) {
        return Err(invalid(key, scheme_rule));
    }
    if parsed.host().is_none_or(str::is_empty) {
        return Err(invalid(key, "must name a host"));
    }
    if parsed.query().is_some() || url.contains('#') {
        return Err(invalid(key, "must not carry a query or fragment"));
    }
    Ok(parsed)
}
