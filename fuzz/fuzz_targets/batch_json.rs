//! Batch bodies: any JSON, any item shape; reading the body and each item's
//! parsing never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phones_gateway::http::api::batch_items::batch_item;
use phones_gateway::http::api::public::BatchBody;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<BatchBody>(data) else {
        return;
    };
    let (items, count) = body.items();
    assert!(items.len() <= count);
    for item in items {
        let _ = batch_item(item);
    }
});
