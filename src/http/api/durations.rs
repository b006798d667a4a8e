//! `phones_gateway_http_request_duration_seconds{route, status}`: every request
//! on both listeners of one app, in fixed buckets of atomics rather than the
//! `metrics` recorder's queue of samples (docs/design.md, "Hand-made parts").
//! One [`Durations`] per app, so an app counts its own requests alone.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

// The bucket bounds every `_seconds` histogram shares.
use crate::telemetry::DURATION_BOUNDS_NS as BOUNDS_NS;

const NAME: &str = "phones_gateway_http_request_duration_seconds";

/// Distinct statuses a route keeps in its own slots; more go to a map.
const SLOTS: usize = 16;

/// One (route, status) series: a count per bucket (the last is `+Inf`), the sum.
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

/// Status 0 until a status claims it.
struct Slot {
    status: AtomicU16,
    series: Series,
}

pub struct Durations {
    /// By the route's index (`routes::LABELS`).
    labels: &'static [&'static str],
    table: Box<[[Slot; SLOTS]]>,
    /// The (route, status) series past a row's slots.
    overflow: papaya::HashMap<(&'static str, u16), Series>,
}

impl Durations {
    pub fn new(labels: &'static [&'static str]) -> Self {
        let table = labels
            .iter()
            .map(|_| {
                std::array::from_fn(|_| Slot {
                    status: AtomicU16::new(0),
                    series: Series::new(),
                })
            })
            .collect();
        Durations {
            labels,
            table,
            overflow: papaya::HashMap::new(),
        }
    }

    /// `route` is the route's index in the labels.
    pub fn record(&self, route: usize, status: u16, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        for slot in &self.table[route] {
            let holder = match slot.status.load(Ordering::Acquire) {
                0 => match slot.status.compare_exchange(
                    0,
                    status,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
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
        self.overflow
            .pin()
            .get_or_insert_with((self.labels[route], status), Series::default)
            .record(ns);
    }

    /// Appends the family in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let overflow = self.overflow.pin();
        let mut series: Vec<(&str, u16, &Series)> = self
            .table
            .iter()
            .zip(self.labels)
            .flat_map(|(slots, route)| {
                slots.iter().filter_map(move |slot| {
                    let status = slot.status.load(Ordering::Acquire);
                    (status != 0).then_some((*route, status, &slot.series))
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::api::paths;
    use crate::http::api::routes::{LABELS, RouteId};

    fn rendered(durations: &Durations) -> String {
        let mut out = String::new();
        durations.render(&mut out);
        out
    }

    #[test]
    fn buckets_are_cumulative_and_bounds_inclusive() {
        let durations = Durations::new(&LABELS);
        let route = RouteId::admin(paths::OPENAPI_ADMIN);
        let record = |elapsed| durations.record(route.index(), 299, elapsed);
        record(Duration::from_micros(100)); // le 0.0001, inclusive
        record(Duration::from_micros(101)); // le 0.00025
        record(Duration::from_secs(3)); // +Inf only
        let out = rendered(&durations);
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
        let durations = Durations::new(&LABELS);
        let healthz = RouteId::admin(paths::HEALTHZ).index();
        let statuses = 600..600 + SLOTS as u16 + 2;
        for status in statuses.clone() {
            durations.record(healthz, status, Duration::from_millis(1));
        }
        let out = rendered(&durations);
        for status in statuses {
            let healthz = paths::HEALTHZ;
            let line = format!("{NAME}_count{{route=\"{healthz}\",status=\"{status}\"}} 1\n");
            assert!(out.contains(&line), "{line}{out}");
        }
    }

    /// Two apps in one process count their own requests alone.
    #[test]
    fn each_histogram_holds_its_own_requests() {
        let (one, other) = (Durations::new(&LABELS), Durations::new(&LABELS));
        let metrics = RouteId::admin(paths::METRICS).index();
        one.record(metrics, 200, Duration::from_millis(1));
        assert!(rendered(&one).contains(NAME));
        assert_eq!(rendered(&other), "");
    }
}
