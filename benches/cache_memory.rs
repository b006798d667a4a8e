//! Bytes of RSS per cached real number: fills the real-phone cache's type with
//! 5,000,000 (user, ad) -> phone entries and divides the growth of the process's
//! resident set by the count. `cargo bench --bench cache_memory` measures 5M;
//! under `cargo test` it runs 50,000 entries as a smoke check.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use phones_gateway::cache::{Clock, Generations, PhoneCache, Ttls};
use phones_gateway::ids::UserId;
use phones_gateway::phone::Phone;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn main() {
    let entries: u64 = if std::env::args().any(|a| a == "--bench") {
        5_000_000
    } else {
        50_000
    };
    let ttls = Ttls {
        positive: Duration::from_secs(900),
        negative: Duration::from_secs(60),
        max_stale: Duration::from_secs(3600),
        stale_negatives: true,
    };
    let before = rss_bytes();
    let cache: PhoneCache<(u64, u64)> = PhoneCache::new(
        "real_phone",
        entries,
        ttls,
        Arc::new(Generations::default()),
        Clock::new(),
    );
    let base = Phone::parse("+79160000000").unwrap().to_u64();
    for i in 1..=entries {
        let user = UserId::new(i / 3 + 1).unwrap();
        let phone = Phone::from_u64(base + i % 10_000_000);
        cache.insert((user.get(), i), user, phone);
    }
    let after = rss_bytes();
    let held = cache.len() as u64;
    println!(
        "cache_memory: {held} of {entries} entries held; RSS grew {:.1} MiB; {:.1} bytes per entry",
        (after - before) as f64 / 1048576.0,
        (after - before) as f64 / held.max(1) as f64
    );
    assert!(
        held > entries * 9 / 10,
        "the cache should hold most entries"
    );
}
