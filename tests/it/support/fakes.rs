//! The fake upstreams: real HTTP servers on 127.0.0.1:0 whose answers, delays
//! and call counts the test controls. They answer only the request shapes
//! docs/rules.md defines; anything else is recorded, see `support` (mod.rs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// What a fake upstream answers.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with the phone in the upstream's field (`phone` or `virtual_phone`).
    Phone(&'static str),
    NotFound,
    /// Any status with an empty body.
    Status(u16),
    /// 200 with a body that is not JSON.
    Garbage,
    /// 200 with exactly this body (JSON or not).
    Body(&'static str),
    /// Accept the request and never answer (held for 60 s, far past any timeout).
    Hang,
    /// This status with `Retry-After: 1` (a 503 with it is a load refusal).
    RetryAfter(u16),
}

/// Which upstream a fake stands for: it decides the request shapes it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// `GET /v1/users/{user_id}/phone?ad_id={ad_id}`.
    RealPhone,
    /// `GET /v1/anonymous-numbers?user_id={u}&ad_id={a}`.
    Anonymous,
    /// `GET /v1/virtual-numbers?user_id={u}&phone=%2B{digits}` and the status feed
    /// `GET /v1/statuses?limit={n}[&after={cursor}]`.
    Calltracking,
}

impl Upstream {
    fn field(self) -> &'static str {
        match self {
            Upstream::Calltracking => "virtual_phone",
            _ => "phone",
        }
    }
}

#[derive(Clone)]
struct Behaviour {
    reply: Reply,
    delay: Duration,
}

/// The `traceparent` (empty when missing) and `tracestate` of a call.
pub type Traced = (String, Option<String>);

/// A lookup rate's cap and the times of the lookups of the last second.
type RateCap = (usize, std::collections::VecDeque<tokio::time::Instant>);

#[derive(Clone)]
pub struct Fake {
    pub url: String,
    pub(super) upstream: Upstream,
    behaviour: Arc<Mutex<Behaviour>>,
    calls: Arc<AtomicUsize>,
    uris: Arc<Mutex<Vec<String>>>,
    unexpected: Arc<Mutex<Vec<String>>>,
    request_ids: Arc<Mutex<Vec<String>>>,
    traces: Arc<Mutex<Vec<Traced>>>,
    /// The status feed's items (call tracking only); the cursor is an index.
    feed: Arc<Mutex<Vec<Value>>>,
    feed_uris: Arc<Mutex<Vec<String>>>,
    feed_failure: Arc<Mutex<Option<u16>>>,
    feed_delay: Arc<Mutex<Duration>>,
    /// Status-feed polls in flight now, and the most at once so far.
    feed_in_flight: Arc<Mutex<(usize, usize)>>,
    /// Replies for one seller's lookups, over the behaviour's reply.
    for_seller: Arc<Mutex<HashMap<u64, Reply>>>,
    capacity: Arc<Mutex<Option<usize>>>,
    in_flight: Arc<AtomicUsize>,
    /// Lookups answered 429 past the capacity.
    refused: Arc<AtomicUsize>,
    /// Per seller: number lookups in flight now, and the most at once.
    per_seller: Arc<Mutex<HashMap<u64, (usize, usize)>>>,
    queue: Arc<Mutex<Option<Arc<tokio::sync::Semaphore>>>>,
    queued: Arc<AtomicUsize>,
    per_second: Arc<Mutex<Option<RateCap>>>,
    over_rate: Arc<AtomicUsize>,
    for_phones: Arc<Mutex<Vec<(String, Reply)>>>,
}

/// A status-feed poll under way; counted out on drop.
struct FeedPoll(Arc<Mutex<(usize, usize)>>);

impl FeedPoll {
    fn new(fake: &Fake) -> FeedPoll {
        let mut counts = fake.feed_in_flight.lock().unwrap();
        counts.0 += 1;
        counts.1 = counts.1.max(counts.0);
        FeedPoll(fake.feed_in_flight.clone())
    }
}

impl Drop for FeedPoll {
    fn drop(&mut self) {
        self.0.lock().unwrap().0 -= 1;
    }
}

/// A lookup under way at a fake with a capacity; gives its place back on drop.
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Fake {
    pub async fn start(upstream: Upstream) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Fake {
            url: format!("http://{}", listener.local_addr().unwrap()),
            upstream,
            behaviour: Arc::new(Mutex::new(Behaviour {
                reply: Reply::NotFound,
                delay: Duration::ZERO,
            })),
            calls: Arc::new(AtomicUsize::new(0)),
            uris: Arc::new(Mutex::new(Vec::new())),
            unexpected: Arc::new(Mutex::new(Vec::new())),
            request_ids: Arc::new(Mutex::new(Vec::new())),
            traces: Arc::new(Mutex::new(Vec::new())),
            feed: Arc::new(Mutex::new(Vec::new())),
            feed_uris: Arc::new(Mutex::new(Vec::new())),
            feed_failure: Arc::new(Mutex::new(None)),
            feed_delay: Arc::new(Mutex::new(Duration::ZERO)),
            feed_in_flight: Arc::new(Mutex::new((0, 0))),
            for_seller: Arc::new(Mutex::new(HashMap::new())),
            capacity: Arc::new(Mutex::new(None)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            refused: Arc::new(AtomicUsize::new(0)),
            per_seller: Arc::new(Mutex::new(HashMap::new())),
            queue: Arc::new(Mutex::new(None)),
            queued: Arc::new(AtomicUsize::new(0)),
            per_second: Arc::new(Mutex::new(None)),
            over_rate: Arc::new(AtomicUsize::new(0)),
            for_phones: Arc::new(Mutex::new(Vec::new())),
        };
        let router = Router::new().fallback(answer).with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        fake
    }

    /// Serve at most `max` lookups at once from now on; the others queue.
    pub fn queue(&self, max: usize) {
        *self.queue.lock().unwrap() = Some(Arc::new(tokio::sync::Semaphore::new(max)));
    }

    /// Answer call-tracking lookups of phones whose digits start with
    /// `prefix` with `reply`, whoever the seller.
    pub fn reply_for_phones(&self, prefix: &str, reply: Reply) {
        self.for_phones
            .lock()
            .unwrap()
            .push((prefix.to_owned(), reply));
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Answer at most `max` lookups in any second (`None`: no bound), 500
    /// past it.
    pub fn per_second(&self, max: Option<usize>) {
        *self.per_second.lock().unwrap() = max.map(|max| (max, Default::default()));
    }

    pub fn over_rate(&self) -> usize {
        self.over_rate.load(Ordering::SeqCst)
    }

    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    /// Answer `reply` from now on, at once.
    pub fn reply(&self, reply: Reply) {
        self.reply_after(reply, Duration::ZERO);
    }

    /// Answer `reply` from now on, after `delay`.
    pub fn reply_after(&self, reply: Reply, delay: Duration) {
        *self.behaviour.lock().unwrap() = Behaviour { reply, delay };
    }

    /// Answer `reply` (after the behaviour's delay) to lookups about `seller`.
    pub fn reply_for(&self, seller: u64, reply: Reply) {
        self.for_seller.lock().unwrap().insert(seller, reply);
    }

    /// Answer at most `max` lookups at once, and 429 to any past it.
    pub fn capacity(&self, max: usize) {
        *self.capacity.lock().unwrap() = Some(max);
    }

    /// Number lookups received (the status feed's polls are not counted).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Waits until exactly `n` number lookups were received; panics naming
    /// `what` after `limit`.
    pub async fn until_calls(&self, what: &str, n: usize, limit: Duration) {
        super::eventually(what, limit, || {
            let calls = self.calls();
            async move { calls == n }
        })
        .await;
    }

    /// The path and query of every number lookup received.
    pub fn uris(&self) -> Vec<String> {
        self.uris.lock().unwrap().clone()
    }

    /// Requests that are not a shape docs/rules.md defines for this upstream.
    pub fn unexpected(&self) -> Vec<String> {
        self.unexpected.lock().unwrap().clone()
    }

    /// The `x-request-id` of every call received.
    pub fn request_ids(&self) -> Vec<String> {
        self.request_ids.lock().unwrap().clone()
    }

    /// The `traceparent` and `tracestate` of every number lookup received.
    pub fn traces(&self) -> Vec<Traced> {
        self.traces.lock().unwrap().clone()
    }

    /// Serves `(user_id, enabled, version)` items on the status feed, in
    /// order; cursors are positions in the list.
    pub fn feed(&self, items: &[(u64, bool, u64)]) {
        *self.feed.lock().unwrap() = items
            .iter()
            .map(|&(user_id, enabled, version)| {
                serde_json::json!({ "user_id": user_id, "enabled": enabled, "version": version })
            })
            .collect();
    }

    /// Appends `(user_id, enabled, version)` items to the status feed;
    /// returns its new length.
    pub fn extend_feed(&self, items: &[(u64, bool, u64)]) -> usize {
        let mut feed = self.feed.lock().unwrap();
        feed.extend(items.iter().map(|&(user_id, enabled, version)| {
            serde_json::json!({ "user_id": user_id, "enabled": enabled, "version": version })
        }));
        feed.len()
    }

    /// The most number lookups for seller `user` in flight at once (until
    /// answered or given up).
    pub fn max_in_flight_of(&self, user: u64) -> usize {
        self.per_seller
            .lock()
            .unwrap()
            .get(&user)
            .map_or(0, |&(_, max)| max)
    }

    /// Answers every status-feed poll with `status` (empty body) from now on;
    /// `None`: serves the items again.
    pub fn fail_feed(&self, status: Option<u16>) {
        *self.feed_failure.lock().unwrap() = status;
    }

    /// Every status-feed poll is answered after `delay` from now on.
    pub fn delay_feed(&self, delay: Duration) {
        *self.feed_delay.lock().unwrap() = delay;
    }

    pub fn max_feed_in_flight(&self) -> usize {
        self.feed_in_flight.lock().unwrap().1
    }

    /// The path and query of every status-feed poll received.
    pub fn feed_uris(&self) -> Vec<String> {
        self.feed_uris.lock().unwrap().clone()
    }
}

/// A positive decimal id that fits an i64, as the app sends ids.
fn is_id(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && !text.starts_with('0')
        && text.parse::<i64>().is_ok()
}

/// The query's `key=value` pairs, in order, undecoded.
fn pairs(query: &str) -> Vec<(&str, &str)> {
    query
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .collect()
}

/// The seller a lookup is about (its `user_id`).
fn seller_of(path: &str, query: &str) -> Option<u64> {
    if let Some(user) = path
        .strip_prefix("/v1/users/")
        .and_then(|rest| rest.strip_suffix("/phone"))
    {
        return user.parse().ok();
    }
    pairs(query)
        .into_iter()
        .find(|(key, _)| *key == "user_id")
        .and_then(|(_, user)| user.parse().ok())
}

/// One lookup in flight for a seller, counted until dropped.
struct InFlight {
    counts: Arc<Mutex<HashMap<u64, (usize, usize)>>>,
    user: u64,
}

impl InFlight {
    fn new(fake: &Fake, user: u64) -> InFlight {
        let counts = fake.per_seller.clone();
        {
            let mut counts = counts.lock().unwrap();
            let (now, max) = counts.entry(user).or_default();
            *now += 1;
            *max = (*max).max(*now);
        }
        InFlight { counts, user }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some((now, _)) = self.counts.lock().unwrap().get_mut(&self.user) {
            *now -= 1;
        }
    }
}

/// What a request to `upstream` is, if it is one docs/rules.md defines.
enum Shape {
    Lookup,
    /// A status-feed poll: the position after which to answer, and the limit.
    Feed(usize, usize),
}

fn shape(upstream: Upstream, method: &Method, path: &str, query: &str) -> Option<Shape> {
    if method != Method::GET {
        return None;
    }
    let query = pairs(query);
    match upstream {
        Upstream::RealPhone => {
            let user = path.strip_prefix("/v1/users/")?.strip_suffix("/phone")?;
            (is_id(user) && matches!(query[..], [("ad_id", ad)] if is_id(ad))).then_some(Shape::Lookup)
        }
        Upstream::Anonymous => (path == "/v1/anonymous-numbers"
            && matches!(query[..], [("user_id", u), ("ad_id", a)] if is_id(u) && is_id(a)))
        .then_some(Shape::Lookup),
        Upstream::Calltracking if path == "/v1/virtual-numbers" => {
            matches!(query[..], [("user_id", u), ("phone", p)]
                if is_id(u) && p.strip_prefix("%2B").is_some_and(|d| (8..=15).contains(&d.len()) && is_id(d)))
            .then_some(Shape::Lookup)
        }
        Upstream::Calltracking if path == "/v1/statuses" => {
            let (mut after, mut limit) = (None, None);
            for (key, value) in query {
                match key {
                    "after" if after.is_none() => after = Some(value.parse().ok()?),
                    "limit" if limit.is_none() => limit = Some(value.parse().ok()?),
                    _ => return None,
                }
            }
            Some(Shape::Feed(after.unwrap_or(0), limit.filter(|&l| l > 0)?))
        }
        Upstream::Calltracking => None,
    }
}

async fn answer(State(fake): State<Fake>, request: Request) -> Response {
    let uri = request.uri().to_string();
    let shape = shape(
        fake.upstream,
        request.method(),
        request.uri().path(),
        request.uri().query().unwrap_or(""),
    );
    let (after, limit) = match shape {
        None => {
            fake.unexpected
                .lock()
                .unwrap()
                .push(format!("{} {uri}", request.method()));
            return (
                StatusCode::BAD_REQUEST,
                "not a request docs/rules.md defines",
            )
                .into_response();
        }
        Some(Shape::Feed(after, limit)) => (after, limit),
        Some(Shape::Lookup) => (usize::MAX, 0),
    };
    if after != usize::MAX {
        fake.feed_uris.lock().unwrap().push(uri);
        let _in_flight = FeedPoll::new(&fake);
        let delay = *fake.feed_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if let Some(status) = *fake.feed_failure.lock().unwrap() {
            return StatusCode::from_u16(status).unwrap().into_response();
        }
        let items = fake.feed.lock().unwrap().clone();
        let start = after.min(items.len());
        let end = (start + limit).min(items.len());
        return axum::Json(serde_json::json!({
            "items": &items[start..end],
            "next_cursor": end.to_string(),
        }))
        .into_response();
    }
    fake.calls.fetch_add(1, Ordering::SeqCst);
    let (path, query) = uri.split_once('?').unwrap_or((&uri, ""));
    let _in_flight = seller_of(path, query).map(|user| InFlight::new(&fake, user));
    fake.uris.lock().unwrap().push(uri);
    if let Some(id) = request.headers().get("x-request-id") {
        fake.request_ids
            .lock()
            .unwrap()
            .push(id.to_str().unwrap().to_owned());
    }
    let trace = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        (
            header("traceparent").unwrap_or_default(),
            header("tracestate"),
        )
    };
    fake.traces.lock().unwrap().push(trace);
    let capacity = *fake.capacity.lock().unwrap();
    let _place = match capacity {
        Some(max) => {
            let place = Place(fake.in_flight.clone());
            if fake.in_flight.fetch_add(1, Ordering::SeqCst) >= max {
                fake.refused.fetch_add(1, Ordering::SeqCst);
                return StatusCode::TOO_MANY_REQUESTS.into_response();
            }
            Some(place)
        }
        None => None,
    };
    if let Some((max, answered)) = fake.per_second.lock().unwrap().as_mut() {
        let now = tokio::time::Instant::now();
        while answered
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            answered.pop_front();
        }
        if answered.len() >= *max {
            fake.over_rate.fetch_add(1, Ordering::SeqCst);
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        answered.push_back(now);
    }
    let queue = fake.queue.lock().unwrap().clone();
    let _served = match queue {
        Some(queue) => match queue.clone().try_acquire_owned() {
            Ok(place) => Some(place),
            Err(_) => {
                fake.queued.fetch_add(1, Ordering::SeqCst);
                queue.acquire_owned().await.ok()
            }
        },
        None => None,
    };
    let Behaviour { mut reply, delay } = fake.behaviour.lock().unwrap().clone();
    let seller = seller_of(request.uri().path(), request.uri().query().unwrap_or(""));
    if let Some(special) = seller.and_then(|s| fake.for_seller.lock().unwrap().get(&s).cloned()) {
        reply = special;
    }
    let phone = pairs(request.uri().query().unwrap_or(""))
        .into_iter()
        .find(|(key, _)| *key == "phone")
        .and_then(|(_, phone)| phone.strip_prefix("%2B"))
        .map(str::to_owned);
    if let Some(phone) = phone {
        let for_phones = fake.for_phones.lock().unwrap();
        if let Some((_, special)) = for_phones
            .iter()
            .find(|(prefix, _)| phone.starts_with(prefix.as_str()))
        {
            reply = special.clone();
        }
    }
    tokio::time::sleep(delay).await;
    match reply {
        Reply::Phone(phone) => {
            axum::Json(serde_json::json!({ fake.upstream.field(): phone })).into_response()
        }
        Reply::NotFound => StatusCode::NOT_FOUND.into_response(),
        Reply::Status(code) => StatusCode::from_u16(code).unwrap().into_response(),
        Reply::Garbage => (StatusCode::OK, "<html>oops</html>").into_response(),
        Reply::Body(body) => {
            (StatusCode::OK, [("content-type", "application/json")], body).into_response()
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Reply::RetryAfter(code) => {
            (StatusCode::from_u16(code).unwrap(), [("retry-after", "1")]).into_response()
        }
    }
}
