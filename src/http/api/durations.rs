//! `phones_gateway_http_request_duration_seconds{route, status}`: every request
//! on both listeners, in fixed buckets of atomics.
//!
//! Kept here rather than by the `metrics` recorder: a recorder histogram queues
//! every sample until a scrape or an upkeep drains it (a lock-free push and an
//! epoch pin per request, about a twentieth of a cached answer's CPU). Here a
//! request costs a scan of a few slots and two relaxed adds, with no lock and no
//! pin, and there is nothing to drain. Process-wide, like the recorder, and
//! rendered after it on `/metrics`.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

// The bucket bounds every `_seconds` histogram shares.
use super::routes;
use crate::telemetry::DURATION_BOUNDS_NS as BOUNDS_NS;

const NAME: &str = "phones_gateway_http_request_duration_seconds";

/// Every route label: the public listener's paths, then the admin listener's
/// (those with a parameter matched by prefix), then everything else.
const ROUTES: [&str; 14] = {
    let mut all = ["unmatched"; 14];
    let mut i = 0;
    while i < routes::PUBLIC.len() {
        all[i] = routes::PUBLIC[i];
        i += 1;
    }
    let mut j = 0;
    while j < routes::ADMIN.len() {
        all[i + j] = routes::ADMIN[j];
        j += 1;
    }
    all
};
const PUBLIC: std::ops::Range<usize> = 0..routes::PUBLIC.len();
const ADMIN: std::ops::Range<usize> = PUBLIC.end..PUBLIC.end + routes::ADMIN.len();
const UNMATCHED: Route = Route(ROUTES.len() - 1);
const ADS: &str = "/admin/v1/ads/";

/// A request's route label, as an index into `ROUTES` (the label of a path is
/// found once per request, and the series by index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route(usize);

impl Route {
    /// The label of a path on the public listener.
    pub fn public(path: &str) -> Route {
        Route::exact(PUBLIC, path).unwrap_or(UNMATCHED)
    }

    /// The label of a path on the admin listener.
    pub fn admin(path: &str) -> Route {
        let one_segment = |s: &str| !s.is_empty() && !s.contains('/');
        Route::exact(ADMIN, path).unwrap_or_else(|| {
            let templated = |template| Route::exact(ADMIN, template).unwrap_or(UNMATCHED);
            if let Some(user) = path
                .strip_prefix(routes::STATUSES)
                .and_then(|p| p.strip_prefix('/'))
            {
                return if one_segment(user) {
                    templated(routes::STATUS_OF_USER)
                } else {
                    UNMATCHED
                };
            }
            match path
                .strip_prefix(ADS)
                .and_then(|p| p.strip_suffix("/reveals"))
            {
                Some(ad) if one_segment(ad) => templated(routes::REVEALS_OF_AD),
                _ => UNMATCHED,
            }
        })
    }

    fn exact(range: std::ops::Range<usize>, path: &str) -> Option<Route> {
        ROUTES[range.clone()]
            .iter()
            .position(|r| *r == path)
            .map(|i| Route(range.start + i))
    }

    pub fn label(self) -> &'static str {
        ROUTES[self.0]
    }
}

/// Distinct statuses a route keeps in its own slots; more (none today) go to a
/// map.
const SLOTS: usize = 16;

/// One (route, status) series: a count per bucket (the last is `+Inf`), and the
/// sum.
struct Series {
    buckets: [AtomicU64; BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

impl Series {
    const fn new() -> Self {
        Series {
            buckets: [const { AtomicU64::new(0) }; BOUNDS_NS.len() + 1],
            sum_ns: AtomicU64::new(0),
        }
    }

    fn record(&self, ns: u64) {
        let bucket = BOUNDS_NS.partition_point(|&bound| bound < ns);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Default for Series {
    fn default() -> Self {
        Series::new()
    }
}

/// A status slot: status 0 until a status claims it.
struct Slot {
    status: AtomicU16,
    series: Series,
}

static TABLE: [[Slot; SLOTS]; ROUTES.len()] = [const {
    [const {
        Slot {
            status: AtomicU16::new(0),
            series: Series::new(),
        }
    }; SLOTS]
}; ROUTES.len()];

fn overflow() -> &'static papaya::HashMap<(&'static str, u16), Series> {
    static OVERFLOW: OnceLock<papaya::HashMap<(&'static str, u16), Series>> = OnceLock::new();
    OVERFLOW.get_or_init(papaya::HashMap::new)
}

/// Records one answered request.
pub fn record(route: Route, status: u16, elapsed: Duration) {
    let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
    for slot in &TABLE[route.0] {
        let holder = match slot.status.load(Ordering::Acquire) {
            0 => match slot
                .status
                .compare_exchange(0, status, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => status,
                Err(other) => other,
            },
            other => other,
        };
        if holder == status {
            slot.series.record(ns);
            return;
        }
    }
    overflow()
        .pin()
        .get_or_insert_with((route.label(), status), Series::default)
        .record(ns);
}

/// Appends the family in the Prometheus text format.
pub fn render(out: &mut String) {
    let overflow = overflow().pin();
    let mut series: Vec<(&str, u16, &Series)> = TABLE
        .iter()
        .zip(ROUTES)
        .flat_map(|(slots, route)| {
            slots.iter().filter_map(move |slot| {
                let status = slot.status.load(Ordering::Acquire);
                (status != 0).then_some((route, status, &slot.series))
            })
        })
        .chain(
            overflow
                .iter()
                .map(|(&(route, status), s)| (route, status, s)),
        )
        .collect();
    if series.is_empty() {
        return;
    }
    series.sort_unstable_by_key(|&(route, status, _)| (route, status));
    let _ = writeln!(out, "# TYPE {NAME} histogram");
    for (route, status, series) in series {
        let labels = format!("route=\"{route}\",status=\"{status}\"");
        let mut cumulative = 0;
        for (i, count) in series.buckets.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            match BOUNDS_NS.get(i) {
                Some(&bound) => {
                    let le = bound as f64 / 1e9;
                    let _ = writeln!(out, "{NAME}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{NAME}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = series.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{NAME}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{NAME}_count{{{labels}}} {cumulative}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered() -> String {
        let mut out = String::new();
        render(&mut out);
        out
    }

    #[test]
    fn buckets_are_cumulative_and_bounds_inclusive() {
        let route = Route::admin("/openapi/admin.json");
        record(route, 299, Duration::from_micros(100)); // le 0.0001, inclusive
        record(route, 299, Duration::from_micros(101)); // le 0.00025
        record(route, 299, Duration::from_secs(3)); // +Inf only
        let out = rendered();
        let series = format!("route=\"{}\",status=\"299\"", route.label());
        for line in [
            format!("{NAME}_bucket{{{series},le=\"0.0001\"}} 1\n"),
            format!("{NAME}_bucket{{{series},le=\"0.00025\"}} 2\n"),
            format!("{NAME}_bucket{{{series},le=\"2.5\"}} 2\n"),
            format!("{NAME}_bucket{{{series},le=\"+Inf\"}} 3\n"),
            format!("{NAME}_sum{{{series}}} 3.000201\n"),
            format!("{NAME}_count{{{series}}} 3\n"),
        ] {
            assert!(out.contains(&line), "{line}{out}");
        }
    }

    #[test]
    fn statuses_beyond_the_slots_are_kept_too() {
        let statuses = 600..600 + SLOTS as u16 + 2;
        for status in statuses.clone() {
            record(Route::admin("/healthz"), status, Duration::from_millis(1));
        }
        let out = rendered();
        for status in statuses {
            let line = format!("{NAME}_count{{route=\"/healthz\",status=\"{status}\"}} 1\n");
            assert!(out.contains(&line), "{line}{out}");
        }
    }

    #[test]
    fn labels_routes_by_listener_and_path() {
        let label = |route: Route| route.label();
        assert_eq!(label(Route::public("/v1/public-phone")), "/v1/public-phone");
        assert_eq!(label(Route::public("/v1/public-phone/")), "unmatched");
        assert_eq!(label(Route::public("/healthz")), "unmatched");
        assert_eq!(label(Route::admin("/v1/public-phone")), "unmatched");
        assert_eq!(label(Route::admin("/healthz")), "/healthz");
        assert_eq!(label(Route::admin(routes::STATUSES)), routes::STATUSES);
        assert_eq!(
            label(Route::admin("/admin/v1/calltracking/statuses/42")),
            "/admin/v1/calltracking/statuses/{user_id}"
        );
        assert_eq!(
            label(Route::admin("/admin/v1/calltracking/statuses/")),
            "unmatched"
        );
        assert_eq!(
            label(Route::admin("/admin/v1/calltracking/statuses/4/2")),
            "unmatched"
        );
    }
}
