//! The runtime's parts: how late it runs ([`lost`], the lost-time probe every
//! upstream call's timer and cold admission read), and its sizing.
//!
//! Sizing: how many tokio worker threads. In a container the CPU quota
//! (cgroup), not the host's core count, is what the process may use; running more
//! workers than the quota allows gets the process throttled (the original
//! service lost a night to that). `runtime.worker_threads` overrides.
//!
//! And the priority of background threads: work that may trail the requests
//! (the reveal log's flush and its SQLite writer) runs at nice
//! [`BACKGROUND_NICE`], so that a burst of it does not take the core from the
//! workers (at the default priority a flush got half of the core for its
//! length, and requests queued behind it). Nice 8 weighs 172 against nice 0's
//! 1024: when both want the core the background thread still gets a seventh of
//! it, and all of it when the workers are idle. That is more than the log needs
//! at the hit path's maximum, so a saturated core slows the background work but
//! does not starve it (nice 10 would come close); nice 5 (a quarter) left the
//! workers too little while a flush ran in the soak's shape. The figures, with
//! their commands: docs/performance.md, "The background priority". Linux keeps
//! a nice value per thread; elsewhere this does nothing.
//!
//! And the open-files limit (`RLIMIT_NOFILE`): at start the soft limit is
//! raised to the hard one ([`raise_open_files`]), since every inbound
//! connection, upstream call and database connection is a descriptor and a
//! soft limit of 1024 (a common default) runs out long before the CPU does.
//! The limit then sizes the inbound connection cap (`server.max_connections`,
//! `http::server::conns`), which keeps a reserve for the process's own calls.
//!
//! And transparent huge pages, turned off for the process at start
//! ([`no_huge_pages`], `PR_SET_THP_DISABLE`; Linux only). mimalloc asks for
//! them on its arena (`MADV_HUGEPAGE` on the 1 GiB it reserves), so on a host
//! whose THP setting is `madvise` (a common default) or `always` the kernel
//! backs any 2 MiB of the arena that is touched with a whole huge page, and
//! khugepaged later fills in the ranges that mimalloc had partly given back:
//! the process's memory then rose in 2 MiB steps while its live data did not.
//! Measured when this was made (a debug build under the recorded stream, the
//! same binary with and without `MIMALLOC_ALLOW_THP=0`): the arena held
//! 18 MiB at start, all of it huge pages, against 5.5 MiB without them, and
//! 41.6 against 13.8 MiB after 80 s of requests. With them off, the soak
//! over 20 million reveals (BENCHMARKS.md, "The reveal log's memory as it
//! ages", runs 4 to 6) keeps 2 to 4 MiB in huge pages, constant: what
//! mimalloc touched before the process turned them off. The hit path makes
//! small allocations only, which gain nothing from huge pages.

use std::path::Path;

pub mod apart;
pub mod lost;

/// The worker count and where it came from (logged at start).
pub fn worker_threads(configured: usize) -> (usize, &'static str) {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if configured > 0 {
        return (configured, "runtime.worker_threads");
    }
    match cgroup_cpus(Path::new("/sys/fs/cgroup")) {
        Some(quota) => (quota.min(cores).max(1), "cgroup CPU quota"),
        None => (cores, "available cores"),
    }
}

/// Whole CPUs allowed by the cgroup quota (rounded up), if a quota is set.
fn cgroup_cpus(root: &Path) -> Option<usize> {
    // cgroup v2: "max 100000" or "<quota> <period>".
    if let Ok(text) = std::fs::read_to_string(root.join("cpu.max")) {
        return quota_cpus(&text);
    }
    // cgroup v1.
    let quota = std::fs::read_to_string(root.join("cpu/cpu.cfs_quota_us")).ok()?;
    let period = std::fs::read_to_string(root.join("cpu/cpu.cfs_period_us")).ok()?;
    quota_cpus(&format!("{} {}", quota.trim(), period.trim()))
}

/// The nice value of background threads (see the module doc).
pub const BACKGROUND_NICE: i32 = 8;

/// Lowers the calling thread to [`BACKGROUND_NICE`].
pub fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    lower_thread(rustix::thread::gettid());
}

/// Lowers the thread `tid` of this process to [`BACKGROUND_NICE`]. Best effort:
/// a failure is logged and the thread keeps its priority.
#[cfg(target_os = "linux")]
pub fn lower_thread(tid: rustix::process::Pid) {
    // PRIO_PROCESS with a thread's id sets that thread's nice value on Linux.
    if let Err(error) = rustix::process::setpriority_process(Some(tid), BACKGROUND_NICE) {
        tracing::warn!(%error, "cannot lower a background thread's priority");
    }
}

/// Turns transparent huge pages off for this process (see the module doc);
/// true when they are off. Best effort: a failure is logged, and the process
/// runs with the host's setting.
pub fn no_huge_pages() -> bool {
    #[cfg(target_os = "linux")]
    {
        match rustix::thread::disable_transparent_huge_pages(true) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "cannot turn transparent huge pages off");
                false
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// The open-files limit before and after [`raise_open_files`] (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit found at start.
    pub before: Option<u64>,
    /// The soft limit now (the hard one, unless raising it failed).
    pub soft: Option<u64>,
    /// The hard limit.
    pub hard: Option<u64>,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and logs both. Best effort:
/// a failure is logged and the soft limit stays where it was. An unlimited hard
/// limit (which Linux does not allow as a soft `RLIMIT_NOFILE`) raises the soft
/// one to `fs.nr_open`, the most a process may have.
pub fn raise_open_files() -> OpenFiles {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let found = getrlimit(Resource::Nofile);
    let target = found.maximum.or_else(|| {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|text| text.trim().parse().ok())
    });
    let mut soft = found.current;
    let below = |target: u64| found.current.is_some_and(|current| current < target);
    if let Some(target) = target.filter(|&t| below(t)) {
        let raised = Rlimit {
            current: Some(target),
            maximum: found.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => soft = Some(target),
            Err(error) => tracing::warn!(%error, "cannot raise the open-files soft limit"),
        }
    }
    let limits = OpenFiles {
        before: found.current,
        soft,
        hard: found.maximum,
    };
    tracing::info!(
        soft_before = limits.before,
        soft = limits.soft,
        hard = limits.hard,
        "open-files limit (RLIMIT_NOFILE; none: unlimited)"
    );
    limits
}

/// The soft open-files limit now (`None`: unlimited).
pub fn open_files_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Parses "<quota> <period>" ("max" or a negative quota: no limit).
fn quota_cpus(text: &str) -> Option<usize> {
    let mut parts = text.split_whitespace();
    let quota: i64 = parts.next()?.parse().ok()?;
    let period: i64 = parts.next()?.parse().ok()?;
    if quota <= 0 || period <= 0 {
        return None;
    }
    usize::try_from((quota + period - 1) / period).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_round_up_to_whole_cpus() {
        assert_eq!(quota_cpus("max 100000"), None);
        assert_eq!(quota_cpus("-1 100000"), None);
        assert_eq!(quota_cpus("100000 100000"), Some(1));
        assert_eq!(quota_cpus("150000 100000"), Some(2));
        assert_eq!(quota_cpus("50000 100000\n"), Some(1));
        assert_eq!(quota_cpus("400000 100000"), Some(4));
        assert_eq!(quota_cpus(""), None);
    }

    #[test]
    fn configured_wins() {
        assert_eq!(worker_threads(3), (3, "runtime.worker_threads"));
        let (auto, _) = worker_threads(0);
        assert!(auto >= 1);
    }
}
