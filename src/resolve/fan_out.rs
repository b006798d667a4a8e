//! One request's places on the upstreams (`upstreams.<name>.max_in_flight_per_request`;
//! docs/rules.md, "Whose load"). A batch shares one [`Batch`] among its items. A
//! fetch an item starts holds the place until it ends; one it joins gives it back.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::domain::{Source, Sources};
use crate::upstream::Ticket;

/// What a batch's items share: one request.
pub struct Batch {
    pub(super) ticket: Ticket,
    pub(super) deadline: Instant,
    places: Sources<Arc<Semaphore>>,
}

impl Batch {
    pub(super) fn new(ticket: Ticket, deadline: Instant, fan_out: Sources<usize>) -> Self {
        Batch {
            ticket,
            deadline,
            places: fan_out.map(|n| Arc::new(Semaphore::new(n.max(1)))),
        }
    }

    /// A place on `source`'s upstream, once one is free; `None` only if the
    /// semaphore were closed (nothing does): the item then goes on without one.
    pub(super) async fn place(&self, source: Source) -> Option<OwnedSemaphorePermit> {
        self.places[source].clone().acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_batch_has_as_many_places_per_upstream_as_its_fan_out() {
        let batch = Batch::new(Ticket(7), Instant::now(), Sources::new(1, 2, 3));
        let mut held = Vec::new();
        for (source, places) in [
            (Source::Anonymous, 1),
            (Source::Calltracking, 2),
            (Source::RealPhone, 3),
        ] {
            for _ in 0..places {
                held.push(batch.place(source).await);
            }
            let next = tokio::time::timeout(Duration::from_millis(20), batch.place(source));
            assert!(next.await.is_err(), "{source:?}: a place past the fan-out");
        }
        held.pop();
        let freed = tokio::time::timeout(Duration::from_secs(1), batch.place(Source::RealPhone));
        assert!(freed.await.is_ok(), "a place given back is taken");
    }
}
