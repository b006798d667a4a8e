//! The number caches: one [`PhoneCache`] per upstream, here, and a replica's
//! three, [`Caches`](caches::Caches), in [`caches`]; fetches shared in `flight`,
//! entries stamped from `generations`. What a cache does: docs/caching.md.

use foldhash::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::{AdId, Failure, Known, Phone, UserId};
use crate::upstream::UpstreamError;

pub mod caches;
mod flight;
mod generations;

use flight::Flight;
pub use generations::Generations;

/// What an upstream said about a key: a number, or "none" (404).
pub type FetchResult = Result<Option<Phone>, UpstreamError>;

/// What a cache is asked: an item of one seller, whose generation guards the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    user: UserId,
    /// The ad's id or the real number's digits: a cache holds one kind only.
    item: u64,
}

impl CacheKey {
    /// The key of `ad` of seller `user` (the real-phone and anonymous caches).
    pub fn ad(user: UserId, ad: AdId) -> Self {
        CacheKey {
            user,
            item: ad.get(),
        }
    }

    /// The key of seller `user`'s real number `real` (the call-tracking cache).
    pub fn real_phone(user: UserId, real: Phone) -> Self {
        CacheKey {
            user,
            item: real.to_u64(),
        }
    }

    /// The seller whose generation guards this key's entry.
    pub fn user(&self) -> UserId {
        self.user
    }
}

/// Where the answer came from (for metrics and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Hit,
    /// This caller started the fetch.
    Miss,
    /// This caller joined a fetch already under way.
    Coalesced,
    /// The fetch failed or was undecided; an expired entry within `max_stale` stood in.
    Stale(Failure),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub answer: FetchResult,
    pub via: Via,
}

#[derive(Debug, Clone, Copy)]
pub struct Ttls {
    pub positive: Duration,
    pub negative: Duration,
    pub max_stale: Duration,
    /// How long before expiry a hit starts a background refresh (zero: never).
    pub refresh_ahead: Duration,
    /// Whether an expired "no number" may be served while the upstream fails.
    pub stale_negatives: bool,
}

/// One cached answer: 16 bytes (checked below).
#[derive(Clone, Copy)]
struct Entry {
    /// `None`: "no number" (a cached 404).
    phone: Option<Phone>,
    /// End of freshness, in deciseconds since the cache's epoch (13 years of range).
    fresh_until: u32,
    generation: u32,
}

// `Option<Phone>` takes no more room than a `u64` (`Phone` wraps a `NonZeroU64`).
const _: () = assert!(std::mem::size_of::<Entry>() == 16);

/// The caches' time: deciseconds since an epoch, read once for several caches
/// ([`PhoneCache::get_fresh_refreshing`]): a clock read is much of a hit's cost.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            epoch: Instant::now(),
        }
    }

    /// Deciseconds since the epoch, saturating (13 years of uptime).
    pub fn now(&self) -> u32 {
        // Seconds and millis, not `as_millis()`: no 128-bit division per lookup.
        let elapsed = self.epoch.elapsed();
        let tenths = elapsed.as_secs() * 10 + u64::from(elapsed.subsec_millis() / 100);
        u32::try_from(tenths).unwrap_or(u32::MAX)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// A bounded, TTL'd, coalescing cache of phone answers by [`CacheKey`].
#[derive(Clone)]
pub struct PhoneCache {
    inner: Arc<Inner>,
}

struct Inner {
    name: &'static str,
    entries: quick_cache::sync::Cache<CacheKey, Entry>,
    /// Fetches under way; a plain mutex, held for one map operation on a miss.
    inflight: Mutex<HashMap<(CacheKey, u32), Arc<Flight>>>,
    generations: Arc<Generations>,
    ttls: Ttls,
    /// The refresh-ahead windows in deciseconds: a number's, a "no number"'s.
    refresh_window: [u32; 2],
    clock: Clock,
    /// Registered once: the hit path increments an atomic, no metric lookup.
    lookups: LookupCounters,
}

struct LookupCounters {
    hit: metrics::Counter,
    miss: metrics::Counter,
    coalesced: metrics::Counter,
    stale_served: metrics::Counter,
    /// Hits that started a refresh ahead of expiry (also counted as hits).
    refresh: metrics::Counter,
}

impl LookupCounters {
    fn new(cache: &'static str) -> Self {
        let counter = |result: &'static str| metrics::counter!("phones_gateway_cache_lookups_total", "cache" => cache, "result" => result);
        LookupCounters {
            hit: counter("hit"),
            miss: counter("miss"),
            coalesced: counter("coalesced"),
            stale_served: counter("stale_served"),
            refresh: counter("refresh"),
        }
    }

    fn record(&self, via: Via) {
        match via {
            Via::Hit => self.hit.increment(1),
            Via::Miss => self.miss.increment(1),
            Via::Coalesced => self.coalesced.increment(1),
            Via::Stale(_) => self.stale_served.increment(1),
        }
    }
}

impl PhoneCache {
    pub fn new(
        name: &'static str,
        capacity: u64,
        ttls: Ttls,
        generations: Arc<Generations>,
        clock: Clock,
    ) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
        PhoneCache {
            inner: Arc::new(Inner {
                name,
                entries: quick_cache::sync::Cache::new(capacity),
                inflight: Mutex::new(HashMap::default()),
                generations,
                ttls,
                refresh_window: [
                    tenths(ttls.refresh_ahead),
                    tenths(ttls.refresh_ahead.min(ttls.negative / 10)),
                ],
                clock,
                lookups: LookupCounters::new(name),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        self.inner.name
    }

    /// Entries held, fresh or expired.
    pub fn len(&self) -> usize {
        self.inner.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.entries.is_empty()
    }

    /// A fresh answer if there is one, without fetching: the allocation-free fast path.
    pub fn get_fresh(&self, key: &CacheKey) -> Known<Phone> {
        self.fresh_entry(key, self.inner.now())
            .map_or(Known::NotKnown, |entry| Known::of(entry.phone))
    }

    /// A fresh answer at `now` (a reading of this cache's [`Clock`]); a hit in
    /// the refresh-ahead window also starts `refresh` in the background.
    pub fn get_fresh_refreshing<F, Fut>(&self, key: &CacheKey, now: u32, refresh: F) -> Known<Phone>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = FetchResult> + Send + 'static,
    {
        let Some(entry) = self.fresh_entry(key, now) else {
            return Known::NotKnown;
        };
        if now.saturating_add(self.inner.refresh_window(&entry)) >= entry.fresh_until {
            self.inner.lookups.refresh.increment(1);
            // Detached and registered: the shared result is not awaited here.
            drop(self.join_or_start(*key, entry.generation, refresh));
        }
        Known::of(entry.phone)
    }

    /// The entry of `key` if it is fresh at `now` for the seller's generation.
    fn fresh_entry(&self, key: &CacheKey, now: u32) -> Option<Entry> {
        let inner = &*self.inner;
        // The generation first, as `lookup` does: slot and entry are unrelated
        // places in memory, and in this order both loads are in flight together
        // (the entry's read takes the shard's lock, which later loads may not pass).
        let generation = inner.generations.current(key.user);
        let entry = inner
            .entries
            .get(key)
            .filter(|e| e.generation == generation && now < e.fresh_until)?;
        inner.lookups.record(Via::Hit);
        Some(entry)
    }

    /// An answer usable when the upstream has failed (stale-if-error).
    pub fn get_stale(&self, key: &CacheKey) -> Known<Phone> {
        let inner = &*self.inner;
        let usable = inner
            .entries
            .get(key)
            .filter(|e| e.generation == inner.generations.current(key.user))
            .filter(|e| inner.stale_usable(e));
        match usable {
            Some(entry) => {
                inner.lookups.stale_served.increment(1);
                Known::of(entry.phone)
            }
            None => Known::NotKnown,
        }
    }

    /// The cached answer if fresh; else `fetch`'s, shared with concurrent callers
    /// of the key, or a stale entry if it fails. `fetch` must bound its own
    /// duration (the upstream timeout does).
    pub async fn get_or_fetch<F, Fut>(&self, key: CacheKey, fetch: F) -> Lookup
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = FetchResult> + Send + 'static,
    {
        let lookup = self.lookup(key, fetch).await;
        self.inner.lookups.record(lookup.via);
        lookup
    }

    async fn lookup<F, Fut>(&self, key: CacheKey, fetch: F) -> Lookup
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = FetchResult> + Send + 'static,
    {
        let inner = &*self.inner;
        let generation = inner.generations.current(key.user);
        let cached = inner
            .entries
            .get(&key)
            .filter(|e| e.generation == generation);
        if let Some(entry) = cached {
            if inner.now() < entry.fresh_until {
                return Lookup {
                    answer: Ok(entry.phone),
                    via: Via::Hit,
                };
            }
        }

        let (flight, via) = self.join_or_start(key, generation, fetch);
        match flight.result().await {
            Ok(phone) => Lookup {
                answer: Ok(phone),
                via,
            },
            Err(error) => match cached.filter(|e| inner.stale_usable(e)) {
                Some(entry) => Lookup {
                    answer: Ok(entry.phone),
                    via: Via::Stale(error.failure()),
                },
                None => Lookup {
                    answer: Err(error),
                    via,
                },
            },
        }
    }

    /// Stores an answer as if just fetched (warming, benches, tests).
    pub fn insert(&self, key: CacheKey, phone: Option<Phone>) {
        let generation = self.inner.generations.current(key.user);
        self.inner.store(key, generation, phone);
    }
}

impl Inner {
    fn now(&self) -> u32 {
        self.clock.now()
    }

    fn store(&self, key: CacheKey, generation: u32, phone: Option<Phone>) {
        // An invalidation since the fetch started: the answer may be older than it.
        if self.generations.current(key.user) != generation {
            return;
        }
        let ttl = if phone.is_some() {
            self.ttls.positive
        } else {
            self.ttls.negative
        };
        let ttl_tenths = u32::try_from(ttl.as_millis().div_ceil(100)).unwrap_or(u32::MAX);
        self.entries.insert(
            key,
            Entry {
                phone,
                fresh_until: self.now().saturating_add(ttl_tenths),
                generation,
            },
        );
    }

    /// Deciseconds before expiry within which a hit refreshes `entry`.
    fn refresh_window(&self, entry: &Entry) -> u32 {
        self.refresh_window[usize::from(entry.phone.is_none())]
    }

    fn stale_usable(&self, entry: &Entry) -> bool {
        if entry.phone.is_none() && !self.ttls.stale_negatives {
            return false;
        }
        let stale_tenths = u32::try_from(self.ttls.max_stale.as_millis() / 100).unwrap_or(u32::MAX);
        self.now() < entry.fresh_until.saturating_add(stale_tenths)
    }
}

/// A duration in deciseconds, saturating.
fn tenths(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis() / 100).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use futures_util::future::BoxFuture;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn user(id: u64) -> UserId {
        UserId::new(id).unwrap()
    }

    fn phone(text: &str) -> Phone {
        Phone::parse(text).unwrap()
    }

    fn key(seller: u64, ad: u64) -> CacheKey {
        CacheKey::ad(user(seller), AdId::new(ad).unwrap())
    }

    fn cache(stale_negatives: bool) -> PhoneCache {
        PhoneCache::new(
            "test",
            1000,
            Ttls {
                positive: Duration::from_secs(10),
                negative: Duration::from_secs(2),
                max_stale: Duration::from_secs(60),
                refresh_ahead: Duration::from_secs(2),
                stale_negatives,
            },
            Arc::new(Generations::default()),
            Clock::new(),
        )
    }

    /// A lookup of `key` whose fetch, if one is made, answers `answer`.
    async fn fetch(c: &PhoneCache, key: CacheKey, answer: FetchResult) -> (FetchResult, Via) {
        let got = c.get_or_fetch(key, move || async move { answer }).await;
        (got.answer, got.via)
    }

    /// A hit on key (1, 1) now, refreshing it with a [`counted`] fetch.
    fn refreshing(c: &PhoneCache, calls: &Arc<AtomicUsize>, answer: FetchResult) -> Known<Phone> {
        let now = c.inner.now();
        c.get_fresh_refreshing(&key(1, 1), now, counted(calls, answer))
    }

    #[tokio::test(start_paused = true)]
    async fn fresh_entries_are_hits_until_their_ttl() {
        let (c, k) = (cache(true), key(1, 1));
        let p = phone("+79161234567");
        assert_eq!(fetch(&c, k, Ok(Some(p))).await, (Ok(Some(p)), Via::Miss));
        assert_eq!(fetch(&c, k, Ok(None)).await, (Ok(Some(p)), Via::Hit));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(fetch(&c, k, Ok(None)).await, (Ok(None), Via::Miss));
    }

    #[tokio::test(start_paused = true)]
    async fn negative_entries_use_the_negative_ttl() {
        let c = cache(true);
        assert_eq!(fetch(&c, key(1, 1), Ok(None)).await, (Ok(None), Via::Miss));
        assert_eq!(c.get_fresh(&key(1, 1)), Known::No);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(c.get_fresh(&key(1, 1)), Known::NotKnown);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_is_served_only_when_the_upstream_fails_and_within_max_stale() {
        let c = cache(true);
        let p = phone("+79161234567");
        c.insert(key(1, 1), Some(p));
        tokio::time::advance(Duration::from_secs(30)).await;
        let got = fetch(&c, key(1, 1), Err(UpstreamError::Timeout)).await;
        assert_eq!(got, (Ok(Some(p)), Via::Stale(Failure::Timeout)));
        tokio::time::advance(Duration::from_secs(41)).await;
        let got = fetch(&c, key(1, 1), Err(UpstreamError::Timeout)).await;
        assert_eq!(got.0, Err(UpstreamError::Timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_negatives_are_not_served_stale_when_forbidden() {
        let stale_negative = |stale_negatives| async move {
            let c = cache(stale_negatives);
            c.insert(key(1, 1), None);
            tokio::time::advance(Duration::from_secs(3)).await;
            fetch(&c, key(1, 1), Err(UpstreamError::Status(500))).await
        };
        let refused = Err(UpstreamError::Status(500));
        assert_eq!(stale_negative(false).await.0, refused);
        let served = (Ok(None), Via::Stale(Failure::ErrorStatus));
        assert_eq!(stale_negative(true).await, served);
    }

    #[tokio::test]
    async fn a_panicking_fetch_fails_its_callers_and_does_not_wedge_the_key() {
        let c = cache(true);
        let got = c
            .get_or_fetch(key(1, 1), || async {
                panic!("a bug inside the fetch");
            })
            .await;
        assert_eq!(got.answer, Err(UpstreamError::Panicked));
        // The next request starts a fetch of its own instead of joining the dead one.
        let p = phone("+79161234567");
        let fetched = fetch(&c, key(1, 1), Ok(Some(p))).await;
        assert_eq!(fetched, (Ok(Some(p)), Via::Miss));
    }

    #[tokio::test(start_paused = true)]
    async fn get_stale_serves_within_max_stale_only() {
        let c = cache(false);
        let p = phone("+79161234567");
        c.insert(key(1, 1), Some(p));
        c.insert(key(2, 2), None);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(c.get_stale(&key(1, 1)), Known::Yes(p));
        // The anonymous rule: an expired "no number" is never served.
        assert_eq!(c.get_stale(&key(2, 2)), Known::NotKnown);
        tokio::time::advance(Duration::from_secs(41)).await;
        assert_eq!(c.get_stale(&key(1, 1)), Known::NotKnown);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_misses_share_one_fetch_even_if_the_first_caller_leaves() {
        let c = cache(true);
        let calls = Arc::new(AtomicUsize::new(0));
        let p = phone("+79161234567");
        let fetch = |calls: Arc<AtomicUsize>| {
            move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(Some(p))
            }
        };
        let first = tokio::time::timeout(
            Duration::from_millis(10),
            c.get_or_fetch(key(7, 7), fetch(calls.clone())),
        )
        .await;
        assert!(first.is_err());
        let second = c.get_or_fetch(key(7, 7), fetch(calls.clone())).await;
        assert_eq!((second.answer, second.via), (Ok(Some(p)), Via::Coalesced));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn invalidation_hides_entries_and_in_flight_answers() {
        let c = cache(true);
        let old = phone("+79161234567");
        let new = phone("+79160000000");
        c.insert(key(1, 1), Some(old));
        c.inner.generations.invalidate(user(1));
        assert_eq!(c.get_fresh(&key(1, 1)), Known::NotKnown);

        // A fetch under way when the seller is invalidated...
        let slow = {
            let c = c.clone();
            tokio::spawn(async move {
                c.get_or_fetch(key(1, 2), || async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok(Some(old))
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        c.inner.generations.invalidate(user(1));
        // ...is not joined by a request after the invalidation...
        let fresh = fetch(&c, key(1, 2), Ok(Some(new))).await;
        assert_eq!(fresh, (Ok(Some(new)), Via::Miss));
        // ...and does not write its older answer back.
        assert_eq!(slow.await.unwrap().answer, Ok(Some(old)));
        assert_eq!(c.get_fresh(&key(1, 2)), Known::Yes(new));
    }

    /// A fetch for refresh tests: counts its calls, answers `answer` after 50 ms.
    fn counted(
        calls: &Arc<AtomicUsize>,
        answer: FetchResult,
    ) -> impl FnOnce() -> BoxFuture<'static, FetchResult> {
        let calls = calls.clone();
        move || {
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                answer
            }
            .boxed()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hit_near_expiry_is_answered_at_once_and_refreshed_in_the_background() {
        let c = cache(true);
        let (old, new) = (phone("+79161234567"), phone("+79160000000"));
        let calls = Arc::new(AtomicUsize::new(0));
        c.insert(key(1, 1), Some(old));
        // Outside the window (TTL 10 s, refresh 2 s ahead): a plain hit.
        tokio::time::advance(Duration::from_secs(7)).await;
        assert_eq!(refreshing(&c, &calls, Ok(Some(new))), Known::Yes(old));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // Inside it: the old number at once, one refresh for any number of hits.
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..3 {
            assert_eq!(refreshing(&c, &calls, Ok(Some(new))), Known::Yes(old));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Refreshed for a whole TTL: past the old expiry it is a hit, the new number.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(c.get_fresh(&key(1, 1)), Known::Yes(new));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_refresh_leaves_the_entry_as_it_was() {
        let c = cache(true);
        let old = phone("+79161234567");
        let calls = Arc::new(AtomicUsize::new(0));
        c.insert(key(1, 1), Some(old));
        tokio::time::advance(Duration::from_secs(9)).await;
        let failing = Err(UpstreamError::Status(500));
        assert_eq!(refreshing(&c, &calls, failing), Known::Yes(old));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(c.get_fresh(&key(1, 1)), Known::Yes(old));
        // It expires when it would have: then it is a miss (and stale-if-error).
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(c.get_fresh(&key(1, 1)), Known::NotKnown);
        assert_eq!(c.get_stale(&key(1, 1)), Known::Yes(old));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresh_under_way_at_an_invalidation_does_not_write_back() {
        let c = cache(true);
        let (old, new) = (phone("+79161234567"), phone("+79160000000"));
        let calls = Arc::new(AtomicUsize::new(0));
        c.insert(key(1, 1), Some(old));
        tokio::time::advance(Duration::from_secs(9)).await;
        refreshing(&c, &calls, Ok(Some(new)));
        c.inner.generations.invalidate(user(1));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(c.get_fresh(&key(1, 1)), Known::NotKnown);
    }

    #[tokio::test(start_paused = true)]
    async fn negative_entries_refresh_within_a_tenth_of_their_ttl() {
        let c = cache(true);
        let calls = Arc::new(AtomicUsize::new(0));
        c.insert(key(1, 1), None);
        // Negative TTL 2 s: the window is 0.2 s, not the configured 2 s.
        tokio::time::advance(Duration::from_millis(1500)).await;
        refreshing(&c, &calls, Ok(None));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        tokio::time::advance(Duration::from_millis(300)).await;
        refreshing(&c, &calls, Ok(None));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn invalidated_entries_are_not_served_stale() {
        let c = cache(true);
        c.insert(key(1, 1), Some(phone("+79161234567")));
        c.inner.generations.invalidate(user(1));
        let got = fetch(&c, key(1, 1), Err(UpstreamError::Timeout)).await;
        assert_eq!(got.0, Err(UpstreamError::Timeout));
    }
}
