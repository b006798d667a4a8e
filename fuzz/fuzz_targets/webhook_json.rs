//! Webhook bodies: parsing and planning a delivery never panic, and every item is
//! counted once, as applied or ignored.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use phones_gateway::domain::plan_changes;
use phones_gateway::domain::StatusItem;

#[derive(serde::Deserialize)]
struct Body {
    items: Vec<StatusItem>,
}

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<Body>(data) else {
        return;
    };
    let stored: HashMap<u64, u64> = body
        .items
        .iter()
        .take(3)
        .map(|i| (i.user_id, i.version / 2))
        .collect();
    let (counts, rows) = plan_changes(&body.items, &stored, 0);
    assert_eq!(counts.applied + counts.ignored, body.items.len() as u64);
    assert!(rows.len() as u64 <= counts.applied);
});
