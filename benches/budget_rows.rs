//! The budgets' rows at a million new viewers an hour (docs/budgets.md, "Memory
//! and the database"): an hour of a replica's reports compressed in time,
//! with retention run as the app runs it (a pass every 10 s of the simulated
//! clock), on SQLite and on a throwaway PostgreSQL cluster.
//!
//! Each simulated minute 16,667 viewers new to the fleet reveal one number:
//! a minute row and a day row each, written as the exchange writes them
//! (statements of `REPORT_CHUNK` spends); then six retention passes at that
//! minute's 0, 10, ..., 50 s. Printed per backend: the rows at each minute's
//! end (minute rows, day rows), the largest, the table's size, the wall time
//! the writes and the passes took; then midnight: the clock moves past
//! midnight and its grace, and the passes delete the hour's day rows (how
//! many passes, how long, rows a second).
//!
//! `cargo bench --bench budget_rows`, or the debug binary with `--bench`;
//! under `cargo test`, 3 minutes as a smoke check.

#![allow(clippy::unwrap_used)]
// A bench exports nothing (`pub` in the shared test modules it includes), and it
// measures wall time.
#![allow(unreachable_pub, clippy::disallowed_types)]

#[allow(dead_code)]
#[path = "../tests/it/support/pg.rs"]
mod pg;

use std::time::{Duration, Instant};

use phones_gateway::budget::exchange::REPORT_CHUNK;
use phones_gateway::budget::retention;
use phones_gateway::budget::window::Moment;
use phones_gateway::store::{BudgetStore, Database, Spend};

/// A million an hour.
const PER_MINUTE: u64 = 1_000_000 / 60 + 1;
/// 08:00 UTC on some day: the hour does not cross midnight.
const START: Moment = Moment(1_800_000_000_000 / 86_400_000 * 86_400_000 + 8 * 3_600_000);

async fn size(url: &str, database: &Database) -> String {
    if url.starts_with("postgres") {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
            .await
            .unwrap();
        let (table, total): (i64, i64) = sqlx::query_as(
            "SELECT pg_relation_size('viewer_budgets'), pg_total_relation_size('viewer_budgets')",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        format!(
            "heap {:.1} MB, with indexes {:.1} MB",
            table as f64 / 1e6,
            total as f64 / 1e6
        )
    } else {
        let _ = database;
        let path = url
            .trim_start_matches("sqlite://")
            .split('?')
            .next()
            .unwrap()
            .to_owned();
        let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(url)
            .await
            .unwrap();
        let (pages, free, page): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT page_count FROM pragma_page_count()), \
             (SELECT freelist_count FROM pragma_freelist_count()), \
             (SELECT page_size FROM pragma_page_size())",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let file = std::fs::metadata(&path).map_or(0, |m| m.len());
        format!(
            "file {:.1} MB, pages in use {:.1} MB (the whole file: budgets only)",
            file as f64 / 1e6,
            ((pages - free) * page) as f64 / 1e6
        )
    }
}

async fn scenario(name: &str, url: &str, minutes: u32) {
    let database = Database::connect(url, 4).await.unwrap();
    database.migrate().await.unwrap();
    let store: BudgetStore = database.budgets();
    let (mut writing, mut pruning) = (Duration::ZERO, Duration::ZERO);
    let mut most = (0, 0, 0);
    let mut deleted = 0;
    let mut next_viewer = 1u64;
    for m in 0..minutes {
        let now = Moment(START.0 + u64::from(m) * 60_000);
        let spends: Vec<Spend> = (next_viewer..next_viewer + PER_MINUTE)
            .flat_map(|viewer| {
                let viewer = viewer.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                [
                    Spend {
                        viewer,
                        kind: 0,
                        window: now.minute(),
                        n: 1,
                    },
                    Spend {
                        viewer,
                        kind: 1,
                        window: now.day(),
                        n: 1,
                    },
                ]
            })
            .collect();
        next_viewer += PER_MINUTE;
        let at = Instant::now();
        for chunk in spends.chunks(REPORT_CHUNK) {
            store.report(chunk).await.unwrap();
        }
        writing += at.elapsed();
        let at = Instant::now();
        for k in 0..6 {
            let pass = retention::pass(&store, Moment(now.0 + k * 10_000))
                .await
                .unwrap();
            assert!(pass.done, "a pass could not keep up: {pass:?}");
            deleted += pass.rows;
        }
        pruning += at.elapsed();
        let rows = store.rows().await.unwrap();
        if rows.0 > most.0 {
            most = rows;
        }
        if m % 10 == 9 || m + 1 == minutes {
            println!(
                "{name}: minute {:>2}: {} minute rows, {} day rows",
                m + 1,
                rows.0,
                rows.1
            );
        }
    }
    let written = u64::from(minutes) * PER_MINUTE * 2;
    println!(
        "{name}: {minutes} min at {PER_MINUTE} new viewers a minute: {written} rows written in {:.1} s, \
         {deleted} deleted by {} passes in {:.1} s; at most {} minute rows; {}",
        writing.as_secs_f64(),
        minutes * 6,
        pruning.as_secs_f64(),
        most.0,
        size(url, &database).await
    );
    // Past midnight and its grace: the hour's day rows expire at once.
    let midnight = Moment(START.0 / 86_400_000 * 86_400_000 + 86_400_000 + 11 * 60_000);
    let (at, mut passes, mut rows) = (Instant::now(), 0, 0);
    loop {
        let pass = retention::pass(&store, midnight).await.unwrap();
        passes += 1;
        rows += pass.rows;
        if pass.done {
            break;
        }
        // As the app does while behind.
        tokio::time::sleep(retention::BACKLOG_PAUSE).await;
    }
    let took = at.elapsed().as_secs_f64();
    println!(
        "{name}: past midnight: {rows} rows deleted by {passes} passes in {took:.1} s \
         (with {:.0} s of pauses between passes): {:.0} rows a second of passes; left {:?}; {}",
        (passes - 1) as f64 * retention::BACKLOG_PAUSE.as_secs_f64(),
        rows as f64 / (took - (passes - 1) as f64 * retention::BACKLOG_PAUSE.as_secs_f64()),
        store.rows().await.unwrap(),
        size(url, &database).await
    );
    database.close().await;
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let minutes = if full { 60 } else { 3 };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = format!("sqlite://{}/budgets.db?mode=rwc", dir.path().display());
        scenario("sqlite", &sqlite, minutes).await;
        let Some(db) = pg::cluster() else { return };
        scenario("postgres", &db.url, minutes).await;
    });
}
