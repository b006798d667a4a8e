//! The reveal log's SQLite writer is background work (see [`crate::runtime`]'s
//! module doc): its thread runs at [`crate::runtime::BACKGROUND_NICE`]. That
//! thread is sqlx's, made when the connection opens, so it is named
//! ([`writer_thread_name`]) and found by its name in `/proc/self/task` once its
//! connection is open.

/// The name of the reveal log's SQLite connection thread: at most 15 bytes
/// with its number, Linux's limit for a thread name.
pub(super) fn writer_thread_name(id: u64) -> String {
    format!("{WRITER}{id}")
}

const WRITER: &str = "reveal-writer";

/// Lowers every live thread named by [`writer_thread_name`].
#[cfg(target_os = "linux")]
pub(super) fn lower_writer_threads() {
    let tasks = match std::fs::read_dir("/proc/self/task") {
        Ok(tasks) => tasks,
        Err(error) => {
            tracing::warn!(%error, "reveals: cannot list threads; the writer keeps its priority");
            return;
        }
    };
    for task in tasks.flatten() {
        let is_writer = std::fs::read_to_string(task.path().join("comm"))
            .is_ok_and(|name| name.starts_with(WRITER));
        let tid = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok());
        if let (true, Some(tid)) = (is_writer, tid.and_then(rustix::process::Pid::from_raw)) {
            crate::runtime::lower_thread(tid);
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn lower_writer_threads() {}
