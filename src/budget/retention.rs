//! Retention of the budgets' rows: ended windows and refusals are deleted in the
//! background (docs/budgets.md, "Memory and the database").

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::window::Moment;
use crate::store::{BudgetStore, BudgetStoreError};

/// Rows a statement deletes at most (each kind, each table).
pub const BATCH: i64 = 5_000;
pub const PASS_ROWS: u64 = 250_000;
/// How long a pass goes on at most: well under `database.lock_timeout_ms`'s
/// default (5 s), which a webhook waiting for SQLite's write lock is given.
pub const PASS_TIME: Duration = Duration::from_secs(2);
/// Between two batches: the other writers' turn.
const PAUSE: Duration = Duration::from_millis(10);
pub const EVERY: Duration = Duration::from_secs(10);
/// The wait before the next pass when one stopped at its bounds.
pub const BACKLOG_PAUSE: Duration = Duration::from_secs(1);
/// How long after midnight the day before's rows are kept.
pub const DAY_GRACE: Duration = Duration::from_secs(600);

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    pub rows: u64,
    pub batches: u32,
    /// Every expired row is gone (the last batch found none full).
    pub done: bool,
}

/// The windows a pass at `now` deletes: (minute rows before, day rows before,
/// refusals ended before the second). Two minutes are kept: a report returns
/// the previous minute's total.
pub fn horizon(now: Moment) -> (u32, u32, u64) {
    let grace = u64::try_from(DAY_GRACE.as_millis()).unwrap_or(u64::MAX);
    (
        now.minute().saturating_sub(2),
        Moment(now.0.saturating_sub(grace)).day(),
        now.seconds(),
    )
}

/// One pass of retention at `now` (on an error, earlier batches' deletes stay).
pub async fn pass(store: &BudgetStore, now: Moment) -> Result<Pass, BudgetStoreError> {
    pass_within(store, now, PASS_ROWS, PASS_TIME).await
}

async fn pass_within(
    store: &BudgetStore,
    now: Moment,
    max_rows: u64,
    max_time: Duration,
) -> Result<Pass, BudgetStoreError> {
    let (minute, day, now_s) = horizon(now);
    let started = tokio::time::Instant::now();
    let mut pass = Pass::default();
    loop {
        let pruned = store.prune(minute, day, now_s, BATCH).await?;
        pass.rows += pruned.rows;
        pass.batches += 1;
        if !pruned.more {
            pass.done = true;
            return Ok(pass);
        }
        if pass.rows >= max_rows || started.elapsed() >= max_time {
            return Ok(pass);
        }
        tokio::time::sleep(PAUSE).await;
    }
}

/// Runs passes until `stop`: every [`EVERY`], sooner while behind.
pub async fn run(store: BudgetStore, stop: CancellationToken) {
    let mut wait = EVERY;
    let mut failing = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return,
        }
        match pass(&store, Moment::now()).await {
            Ok(pass) => {
                if failing {
                    tracing::info!("viewer budgets: retention works again");
                    failing = false;
                }
                if !pass.done {
                    tracing::debug!(
                        rows = pass.rows,
                        "viewer budgets: retention is behind; next pass soon"
                    );
                }
                wait = wait_after(Some(&pass));
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "viewer budgets: retention failed; retrying");
                    failing = true;
                }
                wait = wait_after(None);
            }
        }
    }
}

/// The wait after `pass` (`None`: it failed): [`BACKLOG_PAUSE`] after one that
/// stopped at its bounds, else the full [`EVERY`].
fn wait_after(pass: Option<&Pass>) -> Duration {
    match pass {
        Some(pass) if !pass.done => BACKLOG_PAUSE,
        _ => EVERY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BudgetStore, Spend};

    const NOW: Moment = Moment(1_800_000_000_000 + 3_600_000);

    async fn scratch() -> (tempfile::TempDir, BudgetStore) {
        let (dir, database) = crate::store::Database::scratch().await;
        (dir, database.budgets())
    }

    fn spend(viewer: u64, kind: u8, window: u32) -> Spend {
        Spend {
            viewer,
            kind,
            window,
            n: 1,
        }
    }

    fn pass_of(rows: u64, batches: u32, done: bool) -> Pass {
        Pass {
            rows,
            batches,
            done,
        }
    }

    /// Rows of many distinct viewers over many expired windows, more than a
    /// pass deletes, are all gone within a bounded number of passes; what is
    /// still in force stays.
    #[tokio::test]
    async fn every_expired_row_goes_within_a_few_passes_and_the_current_ones_stay() {
        let (_dir, store) = scratch().await;
        let now = NOW;
        let (minute, day) = (now.minute(), now.day());
        // 10 expired minutes of 5,000 viewers each, the current and the two
        // minutes before, 3 expired days: 68,001 expired rows, over 3 passes'
        // worth.
        const MAX_ROWS: u64 = 20_000;
        let mut expired = 0u64;
        let write = |spends: Vec<Spend>| {
            let store = store.clone();
            async move {
                for chunk in spends.chunks(5_000) {
                    store.report(chunk).await.unwrap();
                }
            }
        };
        // (kind, the current window, windows written, viewers each, windows kept)
        for (kind, current, windows, viewers, kept) in
            [(0, minute, 13u32, 5_000u64, 3), (1, day, 4, 6_000, 1)]
        {
            for back in 0..windows {
                let spends: Vec<Spend> = (0..viewers)
                    .map(|v| spend(u64::from(back) << 32 | v, kind, current - back))
                    .collect();
                if back >= kept {
                    expired += spends.len() as u64;
                }
                write(spends).await;
            }
        }
        let refusals = [(1, now.seconds() - 1), (2, now.seconds() + 60)];
        store.refuse(&refusals).await.unwrap();
        expired += 1;
        assert!(expired > 3 * MAX_ROWS, "{expired}");

        let mut deleted = 0;
        let mut passes = 0;
        loop {
            let pass = pass_within(&store, now, MAX_ROWS, Duration::from_secs(600))
                .await
                .unwrap();
            deleted += pass.rows;
            passes += 1;
            if pass.done {
                break;
            }
            assert!(passes < 10, "still not done after {passes} passes");
        }
        assert!(
            passes >= 4,
            "{passes} passes took {deleted} rows, over their bound"
        );
        assert_eq!(deleted, expired);
        assert_eq!(store.rows().await.unwrap(), (3 * 5_000, 6_000, 1));
    }

    /// A pass at its own bounds deletes what expired and keeps the rest.
    #[tokio::test]
    async fn a_pass_deletes_what_expired() {
        let (_dir, store) = scratch().await;
        for window in [NOW.minute() - 10, NOW.minute()] {
            store.report(&[spend(1, 0, window)]).await.unwrap();
        }
        assert_eq!(pass(&store, NOW).await.unwrap(), pass_of(1, 1, true));
        assert_eq!(store.rows().await.unwrap(), (1, 0, 0));
    }

    /// A pass out of time stops after the batch in hand, with the rest left
    /// for the next pass: one batch, not done.
    #[tokio::test]
    async fn a_pass_out_of_time_stops_after_one_batch_not_done() {
        let (_dir, store) = scratch().await;
        let batch = u64::try_from(BATCH).unwrap();
        // Two batches' worth of expired minute rows (ten minutes back).
        let spends: Vec<Spend> = (0..2 * batch)
            .map(|viewer| spend(viewer, 0, NOW.minute() - 10))
            .collect();
        for chunk in spends.chunks(5_000) {
            store.report(chunk).await.unwrap();
        }
        let pass = pass_within(&store, NOW, PASS_ROWS, Duration::ZERO);
        let pass = pass.await.unwrap();
        assert_eq!(pass, pass_of(batch, 1, false));
        assert_eq!(wait_after(Some(&pass)), BACKLOG_PAUSE);
        // With time to spare, the next pass takes the rest and is done.
        let pass = pass_within(&store, NOW, PASS_ROWS, PASS_TIME);
        let pass = pass.await.unwrap();
        assert_eq!(pass.rows, batch);
        assert!(pass.done, "{pass:?}");
        assert_eq!(wait_after(Some(&pass)), EVERY);
    }

    /// Behind, the next pass comes after a short pause; caught up or failing,
    /// after the full interval.
    #[test]
    fn the_next_pass_comes_soon_only_while_behind() {
        let behind = pass_of(PASS_ROWS, 50, false);
        assert_eq!(wait_after(Some(&behind)), BACKLOG_PAUSE);
        assert_eq!(wait_after(Some(&pass_of(3, 1, true))), EVERY);
        assert_eq!(wait_after(None), EVERY);
    }

    #[test]
    fn the_day_before_is_kept_a_while_after_midnight() {
        let midnight = Moment(1_800_000_000_000 / 86_400_000 * 86_400_000);
        let day = midnight.day();
        assert_eq!(horizon(Moment(midnight.0 + 60_000)).1, day - 1);
        let later = horizon(Moment(midnight.0 + 11 * 60_000));
        assert_eq!(later.1, day);
        assert_eq!(later.0, midnight.minute() + 9);
    }
}
