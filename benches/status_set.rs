//! Which structure should hold the set of sellers with call tracking on?
//!
//! Every request asks "is user X enabled?", so the lookup is the hot path; a
//! webhook delta (one user switched on or off) is the rare write. This bench
//! answers the question at 12,000, 120,000 and 1,200,000 ids for:
//!
//! - `Vec<u64>` with a linear scan (the original Go service's first try),
//! - `Vec<u64>` sorted, with `binary_search`,
//! - `std::collections::HashSet<u64>` (SipHash),
//! - `foldhash::HashSet<u64>`,
//! - `RwLock<foldhash::HashSet<u64>>` (read lock per lookup),
//! - `ArcSwap<foldhash::HashSet<u64>>` (load per lookup, copy-on-write),
//! - `DashMap<u64, u64>` (foldhash, sharded `RwLock`s),
//! - `papaya::HashMap<u64, u64>` (foldhash, `pin()` per lookup),
//! - the crate's own `phones_gateway::status::StatusSet`.
//!
//! Lookups: batches of pre-generated pseudo-random ids (splitmix64), each
//! exactly half present and half absent, shuffled; criterion's time per
//! iteration divided by the batch size (the `Throughput::Elements`) is ns per
//! lookup. Iterations rotate over 64 different batches (64Ki ids) so that the
//! large sets are not measured with only a cache-hot kilobyte of entries.
//! The `write` group measures one delta on a set of 120,000 for the
//! concurrent candidates: the copy-on-write `ArcSwap` pays a full clone.
//!
//! Run: `cargo bench --bench status_set`.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet as StdHashSet;
use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use dashmap::DashMap;
use foldhash::HashSet as FoldHashSet;
use foldhash::fast::RandomState;
use phones_gateway::domain::StatusItem;
use phones_gateway::domain::UserId;
use phones_gateway::status::StatusSet;

/// Set sizes, with their labels in benchmark ids.
const SIZES: [(usize, &str); 3] = [(12_000, "12k"), (120_000, "120k"), (1_200_000, "1.2M")];
/// Lookups per iteration for the sub-linear structures.
const BATCH: usize = 1024;
/// Lookups per iteration for the linear scan (it is O(n) per lookup).
const SCAN_BATCH: usize = 128;
/// Distinct batches the lookup iterations rotate over.
const WINDOWS: usize = 64;
/// Ids toggled on and off by the write benchmarks.
const WRITE_POOL: usize = 1024;

/// splitmix64: a tiny, good-enough generator for reproducible ids.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A valid `UserId` value: 1..=2^63-1.
    fn next_id(&mut self) -> u64 {
        loop {
            let id = self.next() >> 1;
            if id != 0 {
                return id;
            }
        }
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

/// The ids in a set of `n`, ids known to be absent for misses, and fresh
/// absent ids for the write benchmarks.
struct Data {
    present: Vec<u64>,
    absent: Vec<u64>,
    fresh: Vec<u64>,
}

impl Data {
    fn new(n: usize, seed: u64) -> Self {
        let mut rng = SplitMix64(seed);
        let mut seen: FoldHashSet<u64> = FoldHashSet::default();
        seen.reserve(n);
        let mut present = Vec::with_capacity(n);
        while present.len() < n {
            let id = rng.next_id();
            if seen.insert(id) {
                present.push(id);
            }
        }
        let mut absent = Vec::with_capacity(BATCH * WINDOWS / 2 + WRITE_POOL);
        while absent.len() < BATCH * WINDOWS / 2 + WRITE_POOL {
            let id = rng.next_id();
            if seen.insert(id) {
                absent.push(id);
            }
        }
        let fresh = absent.split_off(BATCH * WINDOWS / 2);
        Data {
            present,
            absent,
            fresh,
        }
    }

    /// `windows` batches of `batch` ids, each exactly half present and half
    /// absent, shuffled, laid end to end.
    fn queries(&self, batch: usize, windows: usize, seed: u64) -> Vec<u64> {
        let mut rng = SplitMix64(seed);
        let mut out = Vec::with_capacity(batch * windows);
        for _ in 0..windows {
            let start = out.len();
            for _ in 0..batch / 2 {
                out.push(self.present[rng.below(self.present.len())]);
            }
            for _ in batch / 2..batch {
                out.push(self.absent[rng.below(self.absent.len())]);
            }
            let window = &mut out[start..];
            for i in (1..window.len()).rev() {
                window.swap(i, rng.below(i + 1));
            }
        }
        out
    }

    fn foldhash_set(&self) -> FoldHashSet<u64> {
        self.present.iter().copied().collect()
    }

    fn status_set(&self) -> StatusSet {
        let set = StatusSet::default();
        let items: Vec<_> = self
            .present
            .iter()
            .map(|&user_id| {
                StatusItem {
                    user_id,
                    enabled: true,
                    version: 1,
                }
                .parse()
                .unwrap()
            })
            .collect();
        set.apply_changes(&items);
        set
    }
}

/// Runs `contains` over one batch and returns the hit count.
fn hits<T: Copy>(batch: &[T], contains: impl Fn(T) -> bool) -> usize {
    black_box(batch)
        .iter()
        .filter(|&&q| contains(black_box(q)))
        .count()
}

/// Checks that every batch is half hits, then benches `contains`, each
/// iteration taking the next batch of `batch` queries.
fn run<T: Copy>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    queries: &[T],
    batch: usize,
    contains: impl Fn(T) -> bool,
) {
    for window in queries.chunks_exact(batch) {
        assert_eq!(hits(window, &contains), batch / 2, "{name}");
    }
    let windows = queries.len() / batch;
    let mut w = 0;
    group.bench_function(name, |b| {
        b.iter(|| {
            let window = &queries[w * batch..(w + 1) * batch];
            w = (w + 1) % windows;
            hits(window, &contains)
        });
    });
}

fn lookups(c: &mut Criterion) {
    for (i, &(n, label)) in SIZES.iter().enumerate() {
        let seed = i as u64;
        let data = Data::new(n, 0x5EED_0000 + seed);
        let queries = data.queries(BATCH, WINDOWS, 0xC0FF_EE00 + seed);
        let scan_queries = data.queries(SCAN_BATCH, 4, 0xBEEF_0000 + seed);

        let mut group = c.benchmark_group(format!("lookup/{label}"));
        group.warm_up_time(Duration::from_millis(500));

        // 1. Linear scan: few samples, few lookups, flat sampling.
        {
            let vec = data.present.clone();
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(1))
                .sampling_mode(SamplingMode::Flat)
                .throughput(Throughput::Elements(SCAN_BATCH as u64));
            run(&mut group, "vec_scan", &scan_queries, SCAN_BATCH, |q| {
                vec.contains(&q)
            });
        }

        group
            .sample_size(50)
            .measurement_time(Duration::from_secs(2))
            .sampling_mode(SamplingMode::Auto)
            .throughput(Throughput::Elements(BATCH as u64));

        // 2. Sorted Vec + binary search.
        {
            let mut vec = data.present.clone();
            vec.sort_unstable();
            run(
                &mut group,
                "sorted_vec_binary_search",
                &queries,
                BATCH,
                |q| vec.binary_search(&q).is_ok(),
            );
        }

        // 3. std HashSet, SipHash.
        {
            let set: StdHashSet<u64> = data.present.iter().copied().collect();
            run(&mut group, "std_hashset_siphash", &queries, BATCH, |q| {
                set.contains(&q)
            });
        }

        // 4. foldhash HashSet.
        {
            let set = data.foldhash_set();
            run(&mut group, "foldhash_hashset", &queries, BATCH, |q| {
                set.contains(&q)
            });
        }

        // 5. RwLock<foldhash HashSet>, read lock per lookup.
        {
            let set = RwLock::new(data.foldhash_set());
            run(
                &mut group,
                "rwlock_foldhash_hashset",
                &queries,
                BATCH,
                |q| set.read().unwrap().contains(&q),
            );
        }

        // 6. ArcSwap<foldhash HashSet>, load per lookup.
        {
            let set = ArcSwap::from_pointee(data.foldhash_set());
            run(
                &mut group,
                "arcswap_foldhash_hashset",
                &queries,
                BATCH,
                |q| set.load().contains(&q),
            );
        }

        // 7. DashMap (foldhash hasher, like the others).
        {
            let map: DashMap<u64, u64, RandomState> =
                DashMap::with_capacity_and_hasher(n, RandomState::default());
            for &id in &data.present {
                map.insert(id, 1);
            }
            run(&mut group, "dashmap_foldhash", &queries, BATCH, |q| {
                map.contains_key(&q)
            });
        }

        // 8. papaya HashMap, pin per lookup.
        {
            let map: papaya::HashMap<u64, u64, RandomState> = papaya::HashMap::builder()
                .capacity(n)
                .hasher(RandomState::default())
                .build();
            {
                let pinned = map.pin();
                for &id in &data.present {
                    pinned.insert(id, 1);
                }
            }
            run(&mut group, "papaya_foldhash", &queries, BATCH, |q| {
                map.pin().contains_key(&q)
            });
        }

        // 9. The crate's StatusSet (papaya underneath, packed version + flag).
        {
            let set = data.status_set();
            let users: Vec<UserId> = queries.iter().map(|&q| UserId::new(q).unwrap()).collect();
            run(&mut group, "status_set", &users, BATCH, |u| {
                set.is_enabled(u)
            });
        }

        group.finish();
    }
}

/// One delta (a user switched on, or off) on a set of 120,000. Each iteration
/// takes the next id from a pool of absent ids: the first pass over the pool
/// inserts, the next removes, and so on, so the set stays at 120,000..=121,024.
/// (`StatusSet` keeps a switched-off user as an entry with `enabled: false`,
/// so after the first pass its deltas overwrite existing entries.)
fn writes(c: &mut Criterion) {
    let data = Data::new(120_000, 0x5EED_0001);
    let pool = &data.fresh;
    let step = |i: &mut usize| {
        let id = pool[*i % WRITE_POOL];
        let on = (*i / WRITE_POOL) % 2 == 0;
        *i += 1;
        (id, on)
    };

    let mut group = c.benchmark_group("write/120k");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
        .throughput(Throughput::Elements(1));

    {
        let map: papaya::HashMap<u64, u64, RandomState> = papaya::HashMap::builder()
            .hasher(RandomState::default())
            .build();
        {
            let pinned = map.pin();
            for &id in &data.present {
                pinned.insert(id, 1);
            }
        }
        let mut i = 0;
        group.bench_function("papaya_insert_or_remove", |b| {
            b.iter(|| {
                let (id, on) = step(&mut i);
                let pinned = map.pin();
                if on {
                    black_box(pinned.insert(id, 1));
                } else {
                    black_box(pinned.remove(&id));
                }
            });
        });
    }

    {
        let map: DashMap<u64, u64, RandomState> = DashMap::with_hasher(RandomState::default());
        for &id in &data.present {
            map.insert(id, 1);
        }
        let mut i = 0;
        group.bench_function("dashmap_insert_or_remove", |b| {
            b.iter(|| {
                let (id, on) = step(&mut i);
                if on {
                    black_box(map.insert(id, 1));
                } else {
                    black_box(map.remove(&id));
                }
            });
        });
    }

    {
        let set = RwLock::new(data.foldhash_set());
        let mut i = 0;
        group.bench_function("rwlock_write_insert_or_remove", |b| {
            b.iter(|| {
                let (id, on) = step(&mut i);
                let mut guard = set.write().unwrap();
                if on {
                    black_box(guard.insert(id));
                } else {
                    black_box(guard.remove(&id));
                }
            });
        });
    }

    {
        let set = ArcSwap::from_pointee(data.foldhash_set());
        let mut i = 0;
        group.bench_function("arcswap_clone_and_swap", |b| {
            b.iter(|| {
                let (id, on) = step(&mut i);
                let mut next = FoldHashSet::clone(&set.load());
                if on {
                    next.insert(id);
                } else {
                    next.remove(&id);
                }
                // The old set is freed here, as it would be once readers let go.
                set.store(Arc::new(next));
            });
        });
    }

    {
        let set = data.status_set();
        let mut i = 0;
        let mut version = 1;
        group.bench_function("status_set_apply_changes", |b| {
            b.iter(|| {
                let (id, on) = step(&mut i);
                version += 1;
                black_box(
                    set.apply_changes(&[StatusItem {
                        user_id: id,
                        enabled: on,
                        version,
                    }
                    .parse()
                    .unwrap()]),
                )
            });
        });
    }

    group.finish();
}

criterion_group!(benches, lookups, writes);
criterion_main!(benches);
