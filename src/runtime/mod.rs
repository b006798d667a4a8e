//! The runtime's parts: lost time ([`lost`]), a task on a thread of its own
//! ([`apart`]), and the process's sizing:
//! - tokio workers from the container's CPU quota, not the host's cores;
//! - background threads at nice [`BACKGROUND_NICE`] (docs/reveal-log.md, "How it
//!   is written"; Linux only);
//! - the soft open-files limit raised to the hard one ([`raise_open_files`]);
//! - transparent huge pages off ([`no_huge_pages`], Linux only; docs/reveal-log.md,
//!   "Memory").

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

/// The nice value of background threads.
pub const BACKGROUND_NICE: i32 = 8;

/// Lowers the calling thread to [`BACKGROUND_NICE`].
pub fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    lower_thread(rustix::thread::gettid());
}

/// Lowers thread `tid` of this process to [`BACKGROUND_NICE`]; a failure is logged.
#[cfg(target_os = "linux")]
pub fn lower_thread(tid: rustix::process::Pid) {
    // PRIO_PROCESS with a thread's id sets that thread's nice value on Linux.
    if let Err(error) = rustix::process::setpriority_process(Some(tid), BACKGROUND_NICE) {
        tracing::warn!(%error, "cannot lower a background thread's priority");
    }
}

/// Turns transparent huge pages off for this process; true when they are off.
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
    pub hard: Option<u64>,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (an unlimited hard one,
/// which Linux does not allow as a soft one: to `fs.nr_open`) and logs both.
/// Best effort: a failure is logged and the soft limit stays.
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
