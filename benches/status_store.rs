//! Status-store timings at scale: a full snapshot of 1,200,000 ids (into an empty
//! table and over a full one), loading 1,200,000 rows at start-up, and one
//! 10,000-item webhook delivery; on SQLite and on a throwaway PostgreSQL cluster.
//! `cargo bench --bench status_store` measures 1.2M; under `cargo test` it runs
//! 20,000 ids as a smoke check. PostgreSQL as the tests have it
//! (`tests/it/support/pg.rs`): where none can be started the PostgreSQL half
//! is skipped and says so (a marker `scripts/test` counts), or fails with
//! `REQUIRE_POSTGRES`/`CI` set.

#![allow(clippy::unwrap_used)]
// A bench exports nothing (`pub` in the shared test modules it includes), and it
// measures wall time.
#![allow(unreachable_pub, clippy::disallowed_types)]

#[allow(dead_code)]
#[path = "../tests/it/support/pg.rs"]
mod pg;

use std::time::Instant;

use phones_gateway::domain::StatusItem;
use phones_gateway::status::StatusService;
use phones_gateway::store::Database;

async fn measure(kind: &str, url: &str, ids: usize) {
    let store = Database::connect(url, 8).await.unwrap();
    store.migrate().await.unwrap();
    let service = StatusService::new(store.status());
    service.load().await.unwrap();
    // Sellers spread over the id space, as real ones are.
    let enabled: Vec<u64> = (1..=ids as u64).map(|i| i * 7 + 3).collect();

    let start = Instant::now();
    service.apply_snapshot(1, &enabled).await.unwrap();
    let snapshot_empty = start.elapsed();

    let start = Instant::now();
    service
        .apply_snapshot(2, &enabled[..ids / 2])
        .await
        .unwrap();
    let snapshot_full = start.elapsed();

    let items: Vec<StatusItem> = (0..10_000u64)
        .map(|i| StatusItem {
            user_id: i * 13 + 1,
            enabled: true,
            version: 3,
        })
        .collect();
    let start = Instant::now();
    let changes: Vec<_> = items.iter().map(|i| i.parse().unwrap()).collect();
    service.apply_changes(&changes, None).await.unwrap();
    let webhook = start.elapsed();

    let fresh = StatusService::new(store.status());
    let start = Instant::now();
    let rows = fresh.load().await.unwrap();
    let startup = start.elapsed();
    assert_eq!(fresh.set().len(), rows);
    println!(
        "{kind:>8} | {ids:>9} ids | snapshot into empty {snapshot_empty:>10.2?} | snapshot over full {snapshot_full:>10.2?} | start-up load {startup:>10.2?} ({rows} rows) | webhook 10k items {webhook:>9.2?}"
    );
    store.close().await;
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let ids = if bench { 1_200_000 } else { 20_000 };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        measure(
            "sqlite",
            &format!("sqlite://{}/bench.db", dir.path().display()),
            ids,
        )
        .await;
        // None: `REQUIRE_POSTGRES`/`CI` unset and no PostgreSQL; `pg::cluster`
        // said SKIPPED and left its marker for `scripts/test` (where one is
        // required it panicked instead).
        if let Some(db) = pg::cluster() {
            measure("postgres", &db.url, ids).await;
        }
    });
}
