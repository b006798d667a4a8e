//! Runtime sizing: how many tokio worker threads. In a container the CPU quota
//! (cgroup), not the host's core count, is what the process may use; running more
//! workers than the quota allows gets the process throttled (the original
//! service lost a night to that). `runtime.worker_threads` overrides.

use std::path::Path;

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
