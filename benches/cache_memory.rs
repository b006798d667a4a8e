//! The cache at 5,000,000 entries: bytes of RSS per cached real number (fills the
//! real-phone cache's type with (user, ad) -> phone entries and divides the growth
//! of the process's resident set by the count), then, on that full cache, the
//! time of a hit, a miss, and an insert that evicts (criterion).
//! `cargo bench --bench cache_memory` measures 5M; under `cargo test` it runs
//! 50,000 entries and each timing once, as a smoke check.

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use phones_gateway::cache::{CacheKey, Clock, Generations, PhoneCache, Ttls};
use phones_gateway::domain::UserId;
use phones_gateway::domain::{AdId, Phone};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Ad `ad` of seller `user`.
fn key(user: u64, ad: u64) -> CacheKey {
    CacheKey::ad(UserId::new(user).unwrap(), AdId::new(ad).unwrap())
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
        refresh_ahead: Duration::from_secs(90),
        stale_negatives: true,
    };
    let before = rss_bytes();
    let cache = PhoneCache::new(
        "real_phone",
        entries,
        ttls,
        Arc::new(Generations::default()),
        Clock::new(),
    );
    let base = Phone::parse("+79160000000").unwrap().to_u64();
    for i in 1..=entries {
        let phone = Phone::from_u64(base + i % 10_000_000);
        cache.insert(key(i / 3 + 1, i), phone);
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
    assert!(
        held <= entries,
        "{held} entries held, over the capacity of {entries}"
    );

    // Timings on the full cache. Keys are visited in a scattered order (a
    // multiplicative step), as requests would, not in insertion order.
    let present: Vec<CacheKey> = (0..100_000u64)
        .map(|n| n.wrapping_mul(0x9E37_79B9) % entries + 1)
        .map(|i| key(i / 3 + 1, i))
        .filter(|key| cache.get_fresh(key) != phones_gateway::domain::Known::NotKnown)
        .collect();
    assert!(!present.is_empty());
    let mut criterion = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    let mut n = 0usize;
    criterion.bench_function("cache/hit", |b| {
        b.iter(|| {
            n = (n + 1) % present.len();
            black_box(cache.get_fresh(&present[n]))
        })
    });
    let mut m = 0u64;
    criterion.bench_function("cache/miss", |b| {
        b.iter(|| {
            m = m.wrapping_add(0x9E37_79B9);
            let user = m % entries + 1;
            // Ads past every inserted one: never present.
            black_box(cache.get_fresh(&key(user, entries + 1 + m % entries)))
        })
    });
    let mut k = entries;
    criterion.bench_function("cache/insert_evicting", |b| {
        b.iter(|| {
            k += 1;
            cache.insert(key(k / 3 + 1, k), Phone::from_u64(base + k % 10_000_000));
        })
    });
    criterion.final_summary();
    let held = cache.len() as u64;
    println!("cache_memory: after the timings {held} entries held");
    // Inserting past capacity evicted: the cache stays bounded.
    assert!(
        held <= entries,
        "{held} entries held, over the capacity of {entries}"
    );
}
