//! The timer of a call, judged on the time the upstream had, with the time
//! the gateway lost given back: the rule is docs/rules.md, "Whose time".

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::error::UpstreamError;
use super::pool::Phase;
use crate::runtime::lost::{LostTime, Mark, lateness};

/// The most time given back to a call, in timeouts: a call runs at most
/// (1 + this) x its timeout of wall time.
pub(super) const GIVEN_BACK: u32 = 3;

/// Yields this often when the timer fires before judging it, so the
/// connection's task reads what is in its socket and hands the answer over.
const TURNS: usize = 3;

/// `call`, sent at `sent`, bounded by `timeout` of the upstream's time.
pub(super) async fn timed<T>(
    lost: &LostTime,
    timeout: Duration,
    call: impl Future<Output = Result<T, UpstreamError>>,
    phase: &Phase,
    sent: Instant,
) -> Result<T, UpstreamError> {
    let mark = lost.mark();
    let bound = sent + timeout * (1 + GIVEN_BACK);
    let mut due = sent + timeout;
    tokio::pin!(call);
    loop {
        tokio::select! {
            // The answer first: after a pause it may be ready together with
            // the timer.
            biased;
            result = &mut call => return closed_in_lost_time(lost, mark, result),
            () = tokio::time::sleep_until(due) => {}
        }
        // The connection's turn, before the timer is judged.
        for _ in 0..TURNS {
            tokio::select! {
                biased;
                result = &mut call => return closed_in_lost_time(lost, mark, result),
                () = tokio::task::yield_now() => {}
            }
        }
        if !phase.asked() {
            return Err(UpstreamError::LocalTimeout);
        }
        let now = Instant::now();
        let lost_now = lost.since(mark).max(lateness(due, now)) + phase.waited();
        let had = now.saturating_duration_since(sent).saturating_sub(lost_now);
        if had + lost.tolerance() >= timeout {
            return Err(UpstreamError::Timeout);
        }
        due = now + (timeout - had);
        if due > bound {
            return Err(UpstreamError::LostTime);
        }
    }
}

/// A connection closed or reset while the gateway lost time beyond the
/// tolerance is undecided (docs/rules.md, "Whose time").
fn closed_in_lost_time<T>(
    lost: &LostTime,
    mark: Mark,
    result: Result<T, UpstreamError>,
) -> Result<T, UpstreamError> {
    match result {
        Err(UpstreamError::Connect(_)) if lost.since(mark) > lost.tolerance() => {
            Err(UpstreamError::LostTime)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(300);
    const TOLERANCE: Duration = Duration::from_millis(30);

    fn lost() -> LostTime {
        LostTime::new(TOLERANCE, crate::runtime::lost::PROBE_PERIOD)
    }

    fn asked() -> Phase {
        let phase = Phase::default();
        phase.set_asked(Duration::ZERO);
        phase
    }

    /// A call that never answers, and how long it took to end.
    async fn never_answered(
        lost: &LostTime,
        phase: &Phase,
    ) -> (Result<(), UpstreamError>, Duration) {
        let began = Instant::now();
        let result = timed(lost, TIMEOUT, std::future::pending(), phase, began).await;
        (result, began.elapsed())
    }

    /// A call that never answers, with the probe run as the runtime runs it
    /// on a process stopped for `stop` once every `every` wakes.
    async fn throttled(every: u32, stop: Duration) -> (Result<(), UpstreamError>, Duration) {
        let lost = std::sync::Arc::new(lost());
        let feeder = lost.clone();
        let probe = tokio::spawn(async move {
            for wake in 1.. {
                let due = Instant::now() + crate::runtime::lost::PROBE_PERIOD;
                let until = if wake % every == 0 { due + stop } else { due };
                tokio::time::sleep_until(until).await;
                let now = Instant::now();
                feeder.woke(now, lateness(due, now));
            }
        });
        let ended = never_answered(&lost, &asked()).await;
        probe.abort();
        ended
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_time_is_taken() {
        let lost = lost();
        let call = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(7)
        };
        let answered = timed(&lost, TIMEOUT, call, &asked(), Instant::now()).await;
        assert_eq!(answered, Ok(7));
    }

    /// With no time lost, the timeout is the upstream's at its due time.
    #[tokio::test(start_paused = true)]
    async fn with_no_time_lost_the_timeout_is_the_upstreams() {
        let lost = lost();
        let (result, took) = never_answered(&lost, &asked()).await;
        assert_eq!(result, Err(UpstreamError::Timeout));
        assert_eq!(took, TIMEOUT);
    }

    /// Not asked yet at the timeout: the gateway's own phase.
    #[tokio::test(start_paused = true)]
    async fn a_call_not_yet_asked_times_out_locally() {
        let lost = lost();
        let (result, _) = never_answered(&lost, &Phase::default()).await;
        assert_eq!(result, Err(UpstreamError::LocalTimeout));
    }

    /// An answer that arrived during a stall over the due time is read first.
    #[tokio::test(start_paused = true)]
    async fn an_answer_ready_with_the_timer_is_taken() {
        let lost = lost();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let began = Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep_until(began + TIMEOUT).await;
            let _ = tx.send(());
        });
        let call = async { rx.await.map(|()| 1).map_err(|_| UpstreamError::Cancelled) };
        assert_eq!(timed(&lost, TIMEOUT, call, &asked(), began).await, Ok(1));
    }

    /// A stall over the due time, seen before the probe runs again, is given back.
    #[tokio::test(start_paused = true)]
    async fn a_stall_over_the_due_time_is_given_back_before_the_probe_runs() {
        let lost = lost();
        lost.woke(Instant::now(), Duration::ZERO);
        let began = Instant::now();
        let phase = asked();
        let answered_at = began + Duration::from_millis(420);
        let call = async move {
            tokio::time::sleep_until(answered_at).await;
            Ok(())
        };
        // The probe last woke at the start: 320 ms count as lost at 300 ms.
        let judged = timed(&lost, TIMEOUT, call, &phase, began).await;
        assert_eq!(judged, Ok(()), "the time lost was not given back");
    }

    /// Time lost again and again is given back each time; a call that then
    /// had its whole timeout of running time timed out, however throttled.
    #[tokio::test(start_paused = true)]
    async fn a_throttled_call_that_had_its_whole_timeout_is_judged() {
        // The process stopped 40 ms of every 100 ms.
        let (result, took) = throttled(20, Duration::from_millis(40)).await;
        assert_eq!(result, Err(UpstreamError::Timeout));
        assert!(took > TIMEOUT + Duration::from_millis(60), "{took:?}");
        assert!(took < TIMEOUT * (1 + GIVEN_BACK), "{took:?}");
    }

    /// A call losing more than can be given back within its bound is undecided.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_keeps_losing_beyond_its_bound_is_lost_time() {
        // Stopped 45 ms of every 50 ms.
        let (result, took) = throttled(1, Duration::from_millis(45)).await;
        assert_eq!(result, Err(UpstreamError::LostTime));
        let bound = TIMEOUT * (1 + GIVEN_BACK) + Duration::from_millis(10);
        assert!(took <= bound, "{took:?}");
    }

    /// A connection closed while the gateway lost time is the gateway's
    /// trouble; without lost time it stays the upstream's word.
    #[tokio::test(start_paused = true)]
    async fn a_connection_closed_while_time_was_lost_is_lost_time() {
        let lost = lost();
        lost.woke(Instant::now(), Duration::ZERO);
        let reset = || UpstreamError::Connect("reset".into());
        let closed = async { Err::<(), _>(reset()) };
        let judged = timed(&lost, TIMEOUT, closed, &asked(), Instant::now()).await;
        assert_eq!(judged, Err(reset()));
        let call = async {
            tokio::time::advance(Duration::from_millis(100)).await;
            Err::<(), _>(reset())
        };
        let judged = timed(&lost, TIMEOUT, call, &asked(), Instant::now()).await;
        assert_eq!(judged, Err(UpstreamError::LostTime));
    }

    /// The wait before the upstream was asked (a host lookup) is given back too.
    #[tokio::test(start_paused = true)]
    async fn the_wait_before_asking_is_given_back() {
        let lost = lost();
        let phase = Phase::default();
        phase.set_asked(Duration::from_millis(100));
        let began = Instant::now();
        let call = async move {
            tokio::time::sleep_until(began + Duration::from_millis(350)).await;
            Ok(())
        };
        assert_eq!(timed(&lost, TIMEOUT, call, &phase, began).await, Ok(()));
    }
}
