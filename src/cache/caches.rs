//! [`Caches`]: a replica's three number caches and their generation tables,
//! built from `[cache]`; invalidated by seller from `status`.

use std::sync::Arc;

use super::{Clock, Generations, PhoneCache, Ttls};
use crate::config::CachesConfig;
use crate::domain::{Source, Sources, UserId};
use crate::telemetry::write_gauge;

#[derive(Clone)]
pub struct Caches {
    /// Real and anonymous keyed by ad, call tracking by real number.
    pub phones: Sources<PhoneCache>,
    /// The real and anonymous caches' table.
    pub generations: Arc<Generations>,
    /// The call-tracking cache's own, larger table (docs/caching.md).
    pub calltracking_generations: Arc<Generations>,
    pub clock: Clock,
    longest_use: std::time::Duration,
}

/// Bits of the call-tracking generation table (docs/caching.md).
const CALLTRACKING_GENERATION_BITS: u32 = 20;

impl Caches {
    pub fn new(config: &CachesConfig) -> Self {
        let generations = Arc::new(Generations::default());
        let calltracking_generations =
            Arc::new(Generations::with_slots(CALLTRACKING_GENERATION_BITS));
        let clock = Clock::new();
        let phones = Sources::from_fn(|source| {
            let c = config.of(source);
            let ttls = Ttls {
                positive: c.ttl,
                negative: c.negative_ttl,
                max_stale: c.max_stale,
                refresh_ahead: c.refresh_ahead(),
                // Privacy: never an expired "no anonymous number" (docs/caching.md).
                stale_negatives: source != Source::Anonymous,
            };
            let generations = match source {
                Source::Calltracking => &calltracking_generations,
                Source::Anonymous | Source::RealPhone => &generations,
            };
            PhoneCache::new(
                // Named as in `[cache.*]` and the `cache` label: the upstream's name.
                source.upstream_name(),
                c.capacity,
                ttls,
                generations.clone(),
                clock,
            )
        });
        let longest_use = Source::ALL
            .iter()
            .map(|&source| config.of(source))
            .map(|c| c.ttl.max(c.negative_ttl) + c.max_stale)
            .max()
            .unwrap_or_default();
        Caches {
            phones,
            generations,
            calltracking_generations,
            clock,
            longest_use,
        }
    }

    /// Appends the caches' entry counts to their app's `/metrics` text.
    pub fn render_gauges(&self, out: &mut String) {
        let entries: Vec<([(&str, &str); 1], f64)> = self
            .phones
            .values()
            .map(|cache| ([("cache", cache.name())], cache.len() as f64))
            .collect();
        let series = entries.iter().map(|(labels, n)| (&labels[..], *n));
        write_gauge(out, "phones_gateway_cache_entries", series);
    }

    /// Drops every cached number of `user` on this replica alone; the admin
    /// route goes through the status service, which tells the fleet.
    pub fn invalidate(&self, user: UserId) {
        self.generations.invalidate(user);
        self.calltracking_generations.invalidate(user);
    }

    /// Drops `user`'s call-tracking numbers alone (call tracking flipped).
    pub fn invalidate_calltracking(&self, user: UserId) {
        self.calltracking_generations.invalidate(user);
    }

    /// The longest an entry may be served after its fetch (TTL plus max stale).
    pub fn longest_use(&self) -> std::time::Duration {
        self.longest_use
    }
}
