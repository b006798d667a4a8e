//! The streaming snapshot parser never panics, and what it accepts it delivers
//! in full: every id valid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phones_gateway::http::api::snapshot::parse;

fuzz_target!(|data: &[u8]| {
    let mut ids = Vec::new();
    if let Ok(version) = parse(data, |chunk| {
        ids.extend(chunk);
        true
    }) {
        assert!(version >= 1);
        assert!(ids.iter().all(|id| *id >= 1 && *id <= i64::MAX as u64));
    }
});
