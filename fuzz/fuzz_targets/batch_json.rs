//! Batch bodies: any JSON, any item shape; item parsing never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use phones_gateway::http::api::extract::batch_item;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Some(items) = body.get("items").and_then(|i| i.as_array()) {
        for item in items {
            let _ = batch_item(item);
        }
    }
});
