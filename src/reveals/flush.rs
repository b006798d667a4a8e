//! The flush task: every `reveals.flush_interval_ms`, everything recorded since
//! the last write goes to the database in one transaction with its per-ad counts.
//!
//! On SQLite it runs on a thread of its own ([`run_apart`]) at background priority (see
//! [`crate::runtime`]): a flush of a second's reveals at half the hit path's
//! maximum is tens of milliseconds of draining, sorting and binding before
//! SQLite's own work, and on a tokio worker every request waited for it.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Reveals;
use crate::domain::Reveal;
use crate::store::RevealStore;

/// How long the last flush at shutdown keeps trying a failing database.
const FINAL_FLUSH_FOR: Duration = Duration::from_secs(5);

/// [`run`] every `reveals.flush_interval_ms` (of the section the buffer
/// holds) on a thread of its own, at background priority, on a current-thread
/// runtime; returns when it does. If the runtime or the thread cannot be
/// made, [`run`] runs here instead.
///
/// SQLite only: its connections are threads of sqlx's, which any runtime may
/// call. PostgreSQL's are sockets registered with the reactor of the runtime
/// that opened them, and the pool is shared with the request path, so there
/// the flush stays on the workers (the database's work is in its own process).
pub async fn run_apart(reveals: Reveals, store: RevealStore, stop: CancellationToken) {
    let interval = reveals.inner.config.flush_interval;
    if !store.is_embedded() {
        return run(reveals, store, interval, stop).await;
    }
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let (r, s, t) = (reveals.clone(), store.clone(), stop.clone());
    // Built here, so that a runtime or a thread that cannot be made leaves the
    // flush on this one rather than on none.
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

/// Flushes every `interval` until `stop` is cancelled, then flushes what is left
/// (trying for a few seconds if the database fails) and returns.
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
        drain(&mut receiver, &mut batch);
        flush(&reveals, &store, &mut batch, &metrics).await;
    }
    // The listeners have drained: what is in the channel now is all there is.
    let deadline = tokio::time::Instant::now() + FINAL_FLUSH_FOR;
    drain(&mut receiver, &mut batch);
    while !batch.is_empty() && tokio::time::Instant::now() < deadline {
        if !flush(&reveals, &store, &mut batch, &metrics).await {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if batch.is_empty() {
        tracing::info!("reveals: flushed at shutdown");
    } else {
        tracing::error!(
            lost = batch.len(),
            "reveals: the database failed at shutdown; reveals lost"
        );
    }
}

fn drain(receiver: &mut tokio::sync::mpsc::UnboundedReceiver<Reveal>, batch: &mut Vec<Reveal>) {
    while let Ok(reveal) = receiver.try_recv() {
        batch.push(reveal);
    }
}

/// Writes `batch`; on success empties it and returns true. On failure the batch
/// stays for the next attempt.
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
    #[allow(clippy::disallowed_types)]
    let start = std::time::Instant::now();
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
