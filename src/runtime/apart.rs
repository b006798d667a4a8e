//! A task on a thread of its own, with a single-threaded runtime: the probe
//! listener runs there (as linkerd2-proxy's admin server does) so the kubelet's
//! probes are not queued behind busy workers. Its cost is one idle thread.

use std::future::Future;

/// Runs the future `task` builds on a new thread named `name`, with a
/// current-thread runtime, and waits for its output.
pub async fn run_apart<T, F, Fut>(name: &str, task: F) -> std::io::Result<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    let (done, output) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            // A closed receiver: the caller gave up waiting; nothing to tell.
            let _ = done.send(runtime.map(|runtime| runtime.block_on(task())));
        })?;
    output
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other(format!("the thread {name} panicked"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_task_runs_on_its_own_thread_and_its_panic_is_an_error() {
        let caller = std::thread::current().id();
        let ran_on = run_apart("apart-test", || async { std::thread::current().id() })
            .await
            .unwrap();
        assert_ne!(ran_on, caller);
        let panicked = run_apart("apart-panic", || async { panic!("on purpose") }).await;
        assert!(panicked.is_err());
    }
}
