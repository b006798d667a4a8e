//! The public query parser never panics and accepts only valid values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phones_gateway::http::api::extract::public_phone_query;

fuzz_target!(|query: &str| {
    if let Ok(request) = public_phone_query(Some(query)) {
        assert!(request.user.get() >= 1 && request.ad.get() >= 1 && request.category.get() >= 1);
    }
});
