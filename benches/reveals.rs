//! The reveal log at scale, on a throwaway PostgreSQL cluster (and SQLite):
//! - write throughput: batches as one flush writes them (log rows by COPY and
//!   the per-ad counts, one transaction), a third of all reveals on one hot ad,
//!   each with its reason (a mix: mostly from the cache, some below a source
//!   that failed);
//!   reveals per second, and how many times the hot ad's counter row was written;
//! - the request path's cost: `Reveals::record` per call, and memory per
//!   buffered reveal;
//! - "a seller's last 100 reveals" with the log at 10,000,000 rows;
//! - retention: deleting the oldest 1,000,000 rows in small batches.
//!
//! `cargo bench --bench reveals` measures at full size (a few minutes); under
//! `cargo test` it runs small as a smoke check. PostgreSQL as the tests have
//! it (`tests/it/support/pg.rs`): where none can be started the PostgreSQL
//! half is skipped and says so (a marker `scripts/test` counts), or fails
//! with `REQUIRE_POSTGRES`/`CI` set.

#![allow(clippy::unwrap_used)]
// A bench exports nothing (`pub` in the shared test modules it includes), and it
// measures wall time.
#![allow(unreachable_pub, clippy::disallowed_types)]

#[allow(dead_code)]
#[path = "../tests/it/support/pg.rs"]
mod pg;

use std::time::{Duration, Instant};

use phones_gateway::config::Config;
use phones_gateway::domain::reason::{Failure, Origin, Reason, Skip};
use phones_gateway::domain::{
    AdId, CategoryId, Reveal, RevealQuery, RevealsOf, Source, UserId, Viewer,
};
use phones_gateway::reveals::Reveals;
use phones_gateway::store::{Database, RevealStore};

struct Sizes {
    flushes: usize,
    per_flush: usize,
    log_rows: usize,
    retention_rows: usize,
}

const HOT_AD: u64 = 1;
/// Reveal numbers of the fill, apart from the throughput run's.
const FILL_START: u64 = 10_000_000_000;
/// Sellers the log is spread over; the one queried has its share.
const SELLERS: u64 = 100_000;

fn reveal(n: u64, at_us: i64) -> Reveal {
    // One in three on the hot ad; the rest spread over ads and sellers.
    let ad = if n % 3 == 0 {
        HOT_AD
    } else {
        2 + n % 1_000_000
    };
    Reveal {
        at_us,
        viewer: (n % 2 == 0)
            .then(|| Viewer::parse(format!("v-{}", n % 50_000).as_bytes()).unwrap()),
        user: UserId::new(1 + n % SELLERS).unwrap(),
        ad: AdId::new(ad).unwrap(),
        category: CategoryId::new(1 + n % 40).unwrap(),
        kind: [Source::RealPhone, Source::Calltracking, Source::Anonymous][(n % 3) as usize],
        reason: Some(reason(n)),
    }
}

/// The reason of reveal `n` (its kind is `n % 3`'s): from the cache but for
/// one in a hundred (the upstream's answer), the sources above its kind at
/// the default order passed over as not applicable, but for one real answer
/// in twenty, below a call-tracking source that timed out.
fn reason(n: u64) -> Reason {
    let origin = if n % 100 == 0 {
        Origin::Upstream
    } else {
        Origin::Cache
    };
    let reason = Reason::new(origin);
    match n % 3 {
        0 => reason
            .skipped(Source::Anonymous, Skip::NotApplicable)
            .skipped(
                Source::Calltracking,
                if n % 20 == 0 {
                    Skip::Failed(Failure::Timeout)
                } else {
                    Skip::NotApplicable
                },
            ),
        1 => reason.skipped(Source::Anonymous, Skip::NotApplicable),
        _ => reason,
    }
}

fn now_us() -> i64 {
    phones_gateway::reveals::now_us()
}

async fn throughput(kind: &str, store: &RevealStore, sizes: &Sizes) {
    let mut n = 0;
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    for _ in 0..sizes.flushes {
        let batch: Vec<Reveal> = (0..sizes.per_flush)
            .map(|_| {
                n += 1;
                reveal(n, now_us())
            })
            .collect();
        let flush = Instant::now();
        store.write_reveals(&batch).await.unwrap();
        slowest = slowest.max(flush.elapsed());
    }
    let elapsed = start.elapsed();
    let total = sizes.flushes * sizes.per_flush;
    let hot = store
        .ad_reveal_counts(AdId::new(HOT_AD).unwrap())
        .await
        .unwrap();
    println!(
        "{kind:>8} | write: {total} reveals in {} flushes of {}: {elapsed:.2?} ({:.0} reveals/s), slowest flush {slowest:.2?}; hot ad counted {} times by {} counter writes (one per flush)",
        sizes.flushes,
        sizes.per_flush,
        total as f64 / elapsed.as_secs_f64(),
        hot.total(),
        sizes.flushes
    );
}

/// Returns the time of the fill's oldest row.
async fn last_100(kind: &str, store: &RevealStore, sizes: &Sizes) -> i64 {
    // Fill the log to `log_rows` (old rows first), spread over SELLERS sellers.
    let have = sizes.flushes * sizes.per_flush;
    let start = Instant::now();
    let base = now_us() - 20 * 86_400_000_000;
    let mut n = FILL_START;
    let mut left = sizes.log_rows.saturating_sub(have);
    while left > 0 {
        let chunk = left.min(100_000);
        // Timestamps one microsecond apart, oldest first, across every chunk.
        let batch: Vec<Reveal> = (0..chunk)
            .map(|_| {
                n += 1;
                reveal(n, base + (n - FILL_START) as i64)
            })
            .collect();
        store.write_reveals(&batch).await.unwrap();
        left -= chunk;
    }
    let filled = start.elapsed();
    let query = RevealQuery::newest(RevealsOf::Seller(UserId::new(4242).unwrap()), 100);
    let mut times = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let rows = store.read_reveals(&query).await.unwrap();
        times.push(t.elapsed());
        // At 10M rows the seller has about 100 of its own; fewer in a smoke run.
        assert!(rows.len() <= 100);
        assert!(rows.len() == 100 || sizes.log_rows < 10_000_000);
    }
    times.sort();
    println!(
        "{kind:>8} | log of {} rows (filled in {filled:.2?}): a seller's last 100 p50 {:.2?}, max {:.2?}",
        sizes.log_rows,
        times[times.len() / 2],
        times[times.len() - 1]
    );
    base
}

async fn retention(kind: &str, store: &RevealStore, sizes: &Sizes, base: i64) {
    // The fill above wrote its rows 20 days back, a microsecond apart from
    // `base`: the oldest `retention_rows` of them go.
    // Retention cuts by the database's clock, here the machine's.
    let cutoff = base + sizes.retention_rows as i64;
    let keep = Duration::from_micros(u64::try_from(now_us() - cutoff).unwrap_or(0));
    let start = Instant::now();
    let deleted = phones_gateway::reveals::retention::delete_older_than(store, keep)
        .await
        .unwrap();
    let elapsed = start.elapsed();
    println!(
        "{kind:>8} | retention: {deleted} rows in batches of {} in {elapsed:.2?} ({:.0} rows/s)",
        phones_gateway::reveals::retention::BATCH,
        deleted as f64 / elapsed.as_secs_f64()
    );
}

async fn measure(kind: &str, url: &str, sizes: &Sizes) {
    let database = Database::connect(url, 8).await.unwrap();
    database.migrate().await.unwrap();
    let store = database.reveals();
    throughput(kind, &store, sizes).await;
    let base = last_100(kind, &store, sizes).await;
    retention(kind, &store, sizes, base).await;
    database.close().await;
}

/// The request path: one record, and the memory a buffered reveal holds.
fn record_cost(buffered: usize) {
    let config = Config::from_toml(&format!("[reveals]\nmax_buffered = {buffered}")).unwrap();
    let reveals = Reveals::new(&config.reveals);
    let rss = || {
        std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
            .map_or(0, |pages| pages * 4096)
    };
    let before = rss();
    let start = Instant::now();
    for n in 0..buffered as u64 {
        reveals.record(reveal(n, 0)).unwrap();
    }
    let elapsed = start.elapsed();
    let after = rss();
    println!(
        "  record | {buffered} reveals buffered: {:.0} ns per record, {:.0} bytes of RSS per buffered reveal (half with a viewer id)",
        elapsed.as_nanos() as f64 / buffered as f64,
        after.saturating_sub(before) as f64 / buffered as f64
    );
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes = if bench {
        Sizes {
            flushes: 20,
            per_flush: 50_000,
            log_rows: 10_000_000,
            retention_rows: 1_000_000,
        }
    } else {
        Sizes {
            flushes: 2,
            per_flush: 5_000,
            log_rows: 30_000,
            retention_rows: 12_000,
        }
    };
    record_cost(if bench { 1_000_000 } else { 10_000 });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // None: `REQUIRE_POSTGRES`/`CI` unset and no PostgreSQL; `pg::cluster`
        // said SKIPPED and left its marker for `scripts/test` (where one is
        // required it panicked instead).
        if let Some(db) = pg::cluster() {
            measure("postgres", &db.url, &sizes).await;
        }
        let dir = tempfile::tempdir().unwrap();
        let small = Sizes {
            flushes: sizes.flushes.min(4),
            log_rows: sizes.log_rows.min(1_000_000),
            retention_rows: sizes.retention_rows.min(100_000),
            ..sizes
        };
        measure(
            "sqlite",
            &format!("sqlite://{}/reveals.db", dir.path().display()),
            &small,
        )
        .await;
    });
}
