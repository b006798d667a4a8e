//! Memory of the viewer budgets under a flood of distinct viewers: 1,000,000
//! viewer ids (as a scraper rotating ids would send), one reveal each, with
//! both the minute and the day budget on, then the RSS growth per viewer.
//! `cargo bench --bench budget_memory`; under `cargo test` 20,000 viewers as a
//! smoke check. The exchange forgets a viewer idle for two minutes, so a
//! replica holds the viewers of the last two minutes, whatever the day budget.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use phones_gateway::budget::Budgets;
use phones_gateway::config::BudgetsConfig;
use phones_gateway::domain::Viewer;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<u64>().ok())
        .unwrap_or(0)
        * 4096
}

fn main() {
    let viewers: u64 = if std::env::args().any(|a| a == "--bench") {
        1_000_000
    } else {
        20_000
    };
    let budgets = Budgets::new(&BudgetsConfig {
        per_viewer_per_minute: 60,
        per_viewer_per_day: 1_000,
        exchange_interval: Duration::from_millis(250),
    })
    .unwrap();
    let before = rss_bytes();
    for viewer in 0..viewers {
        let viewer = Viewer::parse(format!("scraper-{viewer:016x}").as_bytes()).unwrap();
        assert!(budgets.check(&viewer, 1).is_ok());
    }
    let after = rss_bytes();
    println!(
        "budget_memory: {} viewers remembered after {viewers} distinct; RSS grew {:.1} MiB, {:.1} bytes per viewer",
        budgets.len(),
        (after - before) as f64 / 1048576.0,
        (after - before) as f64 / viewers as f64
    );
}
