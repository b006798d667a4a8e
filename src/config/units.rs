//! Durations are written as integers in the unit their key names (`_ms`, `_s`,
//! as the documented keys are) and held as `Duration` from the moment they are read.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

pub(super) fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}

pub(super) fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_secs)
}

pub(super) fn optional_millis<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    Option::<u64>::deserialize(d).map(|ms| ms.map(Duration::from_millis))
}

pub(super) fn optional_seconds<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    Option::<u64>::deserialize(d).map(|s| s.map(Duration::from_secs))
}
