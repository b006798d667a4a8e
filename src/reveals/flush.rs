//! The flush task: every `reveals.flush_interval_ms` it writes what was recorded
//! with its per-ad counts, at most [`MAX_WRITE`] reveals a transaction, so memory
//! stays bounded (docs/reveal-log.md, "Memory"). On SQLite it runs apart ([`run_apart`]).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Reveals;
use crate::domain::Reveal;
use crate::domain::wall_clock::Stopwatch;
use crate::store::RevealStore;

/// How long the last flush at shutdown keeps trying a failing database.
const FINAL_FLUSH_FOR: Duration = Duration::from_secs(5);
/// The pause after a failed write within [`FINAL_FLUSH_FOR`]: no tight loop.
const FINAL_FLUSH_PAUSE: Duration = Duration::from_millis(200);

/// The most reveals one transaction takes: about a second's at the hit path's maximum.
pub const MAX_WRITE: usize = 32_768;

/// [`run`] on a thread of its own at background priority, on a current-thread
/// runtime (or here, if those cannot be made). SQLite only: PostgreSQL's
/// connections are sockets of the runtime that opened them.
pub async fn run_apart(reveals: Reveals, store: RevealStore, stop: CancellationToken) {
    let interval = reveals.inner.config.flush_interval;
    if !store.is_embedded() {
        return run(reveals, store, interval, stop).await;
    }
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let (r, s, t) = (reveals.clone(), store.clone(), stop.clone());
    // Built here, so a runtime or thread that cannot be made leaves the flush here.
    let spawned = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .and_then(|runtime| {
            std::thread::Builder::new()
                .name("reveal-flush".to_owned())
                .spawn(move || {
                    crate::runtime::lower_this_thread();
                    runtime.block_on(run(r, s, interval, t));
                    // Dropped unsent if `run` panicked: the receiver hears that too.
                    let _ = done.send(());
                })
        });
    match spawned {
        Ok(_) => {
            if finished.await.is_err() {
                tracing::error!("reveals: the flush thread panicked; unwritten reveals are lost");
            }
        }
        Err(error) => {
            tracing::error!(%error, "reveals: cannot start the flush thread; flushing on a worker");
            run(reveals, store, interval, stop).await;
        }
    }
}

/// Flushes every `interval` until `stop`, then what is left (for `FINAL_FLUSH_FOR`).
pub async fn run(
    reveals: Reveals,
    store: RevealStore,
    interval: Duration,
    stop: CancellationToken,
) {
    let Some(mut receiver) = reveals.take_receiver() else {
        tracing::error!("reveals: a second flush task; the first one owns the buffer");
        return;
    };
    let metrics = FlushMetrics::new();
    let mut batch: Vec<Reveal> = Vec::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = stop.cancelled() => break,
        }
        // Everything recorded by now, [`MAX_WRITE`] at a time; after a failed
        // write the rest waits for the next interval.
        loop {
            let more = drain(&mut receiver, &mut batch);
            if !flush(&reveals, &store, &mut batch, &metrics).await || !more {
                break;
            }
        }
    }
    // The listeners have drained: what is in the channel now is all there is.
    let deadline = tokio::time::Instant::now() + FINAL_FLUSH_FOR;
    loop {
        drain(&mut receiver, &mut batch);
        if batch.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        if !flush(&reveals, &store, &mut batch, &metrics).await {
            tokio::time::sleep(FINAL_FLUSH_PAUSE).await;
        }
    }
    // Unwritten: the batch and whatever the deadline left in the channel.
    let lost = reveals.buffered();
    if lost == 0 {
        tracing::info!("reveals: flushed at shutdown");
    } else {
        tracing::error!(
            lost,
            "reveals: the database failed at shutdown; reveals lost"
        );
    }
}

/// Moves recorded reveals into `batch` up to [`MAX_WRITE`]; true when it stopped there.
fn drain(
    receiver: &mut tokio::sync::mpsc::UnboundedReceiver<Reveal>,
    batch: &mut Vec<Reveal>,
) -> bool {
    while batch.len() < MAX_WRITE {
        match receiver.try_recv() {
            Ok(reveal) => batch.push(reveal),
            Err(_) => return false,
        }
    }
    true
}

/// Writes `batch`; on success empties it and returns true (on failure it stays).
async fn flush(
    reveals: &Reveals,
    store: &RevealStore,
    batch: &mut Vec<Reveal>,
    metrics: &FlushMetrics,
) -> bool {
    if batch.is_empty() {
        return true;
    }
    // Its oldest reveal (min: a wall clock may step back between two).
    reveals.writing(batch.iter().map(|r| r.at_us).min().unwrap_or_default());
    // Wall time: the write's real duration, for its histogram.
    let start = Stopwatch::start();
    match store.write_reveals(batch).await {
        Ok(()) => {
            metrics.duration.record(start.elapsed().as_secs_f64());
            metrics.rows.record(batch.len() as f64);
            metrics.written.increment(batch.len() as u64);
            reveals.written(batch.len());
            batch.clear();
            true
        }
        Err(error) => {
            tracing::warn!(%error, waiting = batch.len(), "reveals: write failed; keeping them for the next flush");
            false
        }
    }
}

struct FlushMetrics {
    written: metrics::Counter,
    duration: metrics::Histogram,
    rows: metrics::Histogram,
}

impl FlushMetrics {
    fn new() -> Self {
        FlushMetrics {
            written: metrics::counter!("phones_gateway_reveals_written_total"),
            duration: metrics::histogram!("phones_gateway_reveals_flush_duration_seconds"),
            rows: metrics::histogram!("phones_gateway_reveals_flush_rows"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::domain::{AdId, CategoryId, RevealQuery, RevealsOf, Source, UserId, Viewer};
    use crate::store::Database;

    /// A backlog of more than two writes' worth is written in writes of
    /// [`MAX_WRITE`], one after the other within one interval, in the order
    /// recorded: each write's ids come after the one before's. (One write
    /// of everything would give the highest id to the highest seller.)
    #[tokio::test]
    async fn a_backlog_is_written_in_writes_of_at_most_max_write() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/log.db", dir.path().display());
        let database = Database::connect(&url, 2).await.unwrap();
        database.migrate().await.unwrap();
        let config = Config::from_toml("[reveals]\nflush_interval_ms = 10").unwrap();
        let reveals = Reveals::new(&config.reveals);
        let n = 2 * MAX_WRITE + 5;
        let top = u64::try_from(n).unwrap() + 1;
        for i in 0..top - 1 {
            // Sellers in falling order, all at one instant, one viewer.
            let reveal = Reveal {
                at_us: 1_000_000,
                viewer: Some(Viewer::parse(b"v").unwrap()),
                user: UserId::new(top - i).unwrap(),
                ad: AdId::new(1).unwrap(),
                category: CategoryId::new(1).unwrap(),
                kind: Source::RealPhone,
                reason: None,
            };
            reveals.record(reveal).unwrap();
        }
        let stop = CancellationToken::new();
        let flushing = tokio::spawn(run(
            reveals.clone(),
            database.reveals(),
            config.reveals.flush_interval,
            stop.clone(),
        ));
        for _ in 0..600 {
            if reveals.buffered() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.cancel();
        flushing.await.unwrap();
        assert_eq!(reveals.buffered(), 0);
        let viewer = RevealsOf::Viewer(Viewer::parse(b"v").unwrap());
        let query = RevealQuery::newest(viewer, 1);
        let newest = database.reveals().read_reveals(&query).await.unwrap();
        // The last write's highest seller: the first of the last MAX_WRITE.
        let first_of_last = top - u64::try_from(2 * MAX_WRITE).unwrap();
        assert_eq!(newest[0].reveal.user.get(), first_of_last);
        assert_eq!(newest[0].id, i64::try_from(n).unwrap());
        let ad = AdId::new(1).unwrap();
        let counts = database.reveals().ad_reveal_counts(ad).await.unwrap();
        assert_eq!(counts.total(), u64::try_from(n).unwrap());
        database.close().await;
    }
}
