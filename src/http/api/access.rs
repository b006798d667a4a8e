//! Who may call the admin API (docs/admin-access.md): the token set the admin
//! front checks, the [`Caller`] it hands the handlers, the [`record`] of every
//! call, and the token files' poller. The values sit in one [`ArcSwap`], loaded
//! once per request and swapped whole: a new value works, and the old one stops,
//! at the same store.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::http::{HeaderMap, Method, header};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::config::{AdminToken, Scope, Scopes, Secret, read_token_file};

/// How often token files are read again (the contract says within 10 s).
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The `token` label and log field of a call without a known token.
pub const NO_TOKEN: &str = "none";

pub struct AdminTokens {
    entries: Box<[Entry]>,
    /// Swapped whole by [`AdminTokens::reload`].
    values: ArcSwap<Vec<Secret>>,
}

struct Entry {
    name: Arc<str>,
    scopes: Scopes,
    file: Option<PathBuf>,
    /// So a failure is logged when it begins and when it ends, not every poll.
    failing: AtomicBool,
}

/// The caller of an admin route, in the request's extensions, for the record.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's name, never its value.
    pub name: Arc<str>,
}

impl AdminTokens {
    pub fn new(tokens: Vec<AdminToken>) -> Self {
        let values = tokens.iter().map(|t| t.value.clone()).collect();
        let entries = tokens
            .into_iter()
            .map(|t| Entry {
                name: t.name.into(),
                scopes: t.scopes,
                file: t.file,
                failing: AtomicBool::new(false),
            })
            .collect();
        AdminTokens {
            entries,
            values: ArcSwap::from_pointee(values),
        }
    }

    /// Whether no token is configured (every admin route answers 401).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry is compared in constant time and the match selected without
    /// a branch: the time says neither which matched nor how much was right
    /// (only the lengths may show).
    pub fn check(&self, headers: &HeaderMap) -> Option<TokenId> {
        let given = headers
            .get(header::AUTHORIZATION)?
            .as_bytes()
            .strip_prefix(b"Bearer ")?;
        let values = self.values.load();
        let mut found = u32::MAX;
        for (i, value) in values.iter().enumerate() {
            // At most a handful of entries: the index fits.
            #[allow(clippy::cast_possible_truncation)]
            found.conditional_assign(&(i as u32), given.ct_eq(value.expose().as_bytes()));
        }
        (found != u32::MAX).then_some(TokenId(found as usize))
    }

    pub fn name(&self, id: TokenId) -> &Arc<str> {
        &self.entries[id.0].name
    }

    pub fn allows(&self, id: TokenId, scope: Scope) -> bool {
        self.entries[id.0].scopes.contains(scope)
    }

    /// Re-reads the token files every [`RELOAD_INTERVAL`], forever.
    pub async fn watch(self: Arc<Self>) {
        if self.entries.iter().all(|e| e.file.is_none()) {
            return;
        }
        loop {
            tokio::time::sleep(RELOAD_INTERVAL).await;
            let tokens = self.clone();
            // Blocking file reads, off the workers.
            let read = tokio::task::spawn_blocking(move || tokens.reload()).await;
            if let Err(error) = read {
                tracing::error!(%error, "admin token reload task failed");
            }
        }
    }

    /// Reads every token file once and swaps in the changed values. An unusable
    /// file (docs/admin-access.md, "Rotation") keeps its last good value,
    /// logged when that begins (never the value) and counted at every poll.
    pub fn reload(&self) {
        let current = self.values.load_full();
        let mut next: Vec<Secret> = current.as_ref().clone();
        let mut changed = Vec::new();
        for (i, entry) in self.entries.iter().enumerate() {
            let Some(file) = &entry.file else { continue };
            let refused = match read_token_file(file) {
                Err(reason) => Some(reason),
                Ok(value) if value.expose() == next[i].expose() => None,
                Ok(value) => {
                    let shared = next
                        .iter()
                        .enumerate()
                        .any(|(j, other)| j != i && other.expose() == value.expose());
                    if shared {
                        Some(format!(
                            "{} now holds the token of another entry",
                            file.display()
                        ))
                    } else {
                        next[i] = value;
                        changed.push(i);
                        None
                    }
                }
            };
            match refused {
                Some(reason) => {
                    metrics::counter!(
                        "phones_gateway_admin_token_reload_errors_total",
                        "name" => entry.name.to_string()
                    )
                    .increment(1);
                    if !entry.failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            token = &*entry.name,
                            reason,
                            "admin token file unusable; keeping its last good value"
                        );
                    }
                }
                None => {
                    if entry.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!(token = &*entry.name, "admin token file readable again");
                    }
                }
            }
        }
        if changed.is_empty() {
            return;
        }
        self.values.store(Arc::new(next));
        for i in changed {
            let name = &*self.entries[i].name;
            metrics::counter!("phones_gateway_admin_token_rotations_total", "name" => name.to_owned())
                .increment(1);
            tracing::info!(
                token = name,
                "admin token rotated: the new value works, the previous one no longer"
            );
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenId(usize);

/// Puts an admin call on record (a log line and a counter) under the token's
/// name, never its value.
pub fn record(token: &str, method: &Method, route: &'static str, status: u16) {
    tracing::info!(token, %method, route, status, "admin call");
    metrics::counter!(
        "phones_gateway_admin_requests_total",
        "token" => token.to_owned(),
        "route" => route,
        "status" => status.to_string()
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn token(name: &str, value: &str, scopes: Scopes) -> AdminToken {
        AdminToken {
            name: name.into(),
            value: Secret::new(value),
            scopes,
            file: None,
        }
    }

    fn bearer(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn the_check_finds_the_entry_and_nothing_else() {
        let tokens = AdminTokens::new(vec![
            token("admin.token", "every-scope", Scopes::ALL),
            token("sync", "sync-token", Scopes::of([Scope::StatusesWrite])),
        ]);
        let sync = tokens.check(&bearer("Bearer sync-token")).unwrap();
        assert_eq!(&**tokens.name(sync), "sync");
        assert!(tokens.allows(sync, Scope::StatusesWrite));
        assert!(!tokens.allows(sync, Scope::RevealsRead));
        let all = tokens.check(&bearer("Bearer every-scope")).unwrap();
        assert_eq!(&**tokens.name(all), "admin.token");
        for refused in [
            "Bearer sync-toke",
            "Bearer sync-tokenn",
            "Bearer ",
            "bearer sync-token",
            "sync-token",
            "Basic sync-token",
        ] {
            assert_eq!(tokens.check(&bearer(refused)), None, "{refused}");
        }
        assert_eq!(tokens.check(&HeaderMap::new()), None);
        assert!(AdminTokens::new(vec![]).check(&bearer("Bearer ")).is_none());
    }

    #[test]
    fn a_reload_swaps_the_value_and_keeps_it_when_the_file_fails() {
        let (dir, tokens, file) = with_a_file("pg-access");
        std::fs::write(&file, "two").unwrap();
        tokens.reload();
        assert!(tokens.check(&bearer("Bearer two")).is_some());
        assert!(tokens.check(&bearer("Bearer one")).is_none());
        // Whitespace around the value is not part of it: not a change.
        std::fs::write(&file, "\n  two\r\n\n\n").unwrap();
        tokens.reload();
        assert!(tokens.check(&bearer("Bearer two")).is_some());
        for bad in ["", "\n", " \n\n", "tw o", "two\u{0}", "twö"] {
            std::fs::write(&file, bad).unwrap();
            tokens.reload();
            assert!(tokens.check(&bearer("Bearer two")).is_some());
        }
        std::fs::write(&file, "other").unwrap();
        tokens.reload();
        let other = tokens.check(&bearer("Bearer other")).unwrap();
        assert_eq!(&**tokens.name(other), "other", "a shared value is refused");
        assert!(tokens.check(&bearer("Bearer two")).is_some());
        std::fs::remove_file(&file).unwrap();
        tokens.reload();
        assert!(tokens.check(&bearer("Bearer two")).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The metrics `run` recorded, under a recorder of this thread's alone.
    fn on_record(run: impl FnOnce()) -> String {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, run);
        handle.render()
    }

    /// Tokens "other" and "sync", the second read from a file holding "one"
    /// in a fresh directory `name` (with this process's id): the directory,
    /// the tokens and the file.
    fn with_a_file(name: &str) -> (PathBuf, AdminTokens, PathBuf) {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sync");
        std::fs::write(&file, "one\n").unwrap();
        let mut entry = token("sync", "one", Scopes::of([Scope::StatusesWrite]));
        entry.file = Some(file.clone());
        let tokens = AdminTokens::new(vec![token("other", "other", Scopes::ALL), entry]);
        (dir, tokens, file)
    }

    /// A rotation is counted once; a file that fails at every read.
    #[test]
    fn a_reload_counts_each_rotation_once_and_each_failed_read() {
        let (dir, tokens, file) = with_a_file("pg-access-once");
        let metrics = on_record(|| {
            std::fs::write(&file, "two").unwrap();
            tokens.reload();
            tokens.reload();
            std::fs::write(&file, "").unwrap();
            tokens.reload();
            tokens.reload();
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(tokens.check(&bearer("Bearer two")).is_some());
        for line in [
            "phones_gateway_admin_token_rotations_total{name=\"sync\"} 1\n",
            "phones_gateway_admin_token_reload_errors_total{name=\"sync\"} 2\n",
        ] {
            assert!(metrics.contains(line), "{metrics}");
        }
    }

    /// The warning lines `run` logged, under a subscriber of this thread's.
    /// While one dispatcher is alive, a callsite first reached on another
    /// thread takes that thread's interest (none) for good; one more kept
    /// alive makes every callsite's interest that of all of them.
    fn warnings(run: impl FnOnce()) -> String {
        static ANOTHER: std::sync::LazyLock<tracing::Dispatch> = std::sync::LazyLock::new(|| {
            tracing::Dispatch::new(tracing::subscriber::NoSubscriber::new())
        });
        #[derive(Clone, Default)]
        struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        std::sync::LazyLock::force(&ANOTHER);
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, run);
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    /// A failure is logged once, when it begins; after recovery, again.
    #[test]
    fn a_failing_file_is_logged_when_it_begins() {
        let (dir, tokens, file) = with_a_file("pg-access-log");
        let unusable = "admin token file unusable";
        let logs = warnings(|| {
            std::fs::write(&file, "").unwrap();
            tokens.reload();
        });
        assert_eq!(logs.matches(unusable).count(), 1, "first failure: {logs}");
        let logs = warnings(|| {
            tokens.reload();
            tokens.reload();
        });
        assert_eq!(logs.matches(unusable).count(), 0, "same again: {logs}");
        std::fs::write(&file, "two").unwrap();
        tokens.reload();
        let logs = warnings(|| {
            std::fs::write(&file, "tw o").unwrap();
            tokens.reload();
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(logs.matches(unusable).count(), 1, "failing again: {logs}");
        assert!(tokens.check(&bearer("Bearer two")).is_some());
    }

    #[test]
    fn an_admin_call_is_put_on_record() {
        let metrics = on_record(|| record("sync", &Method::POST, "/admin/v1/x", 202));
        let line = "phones_gateway_admin_requests_total{token=\"sync\",route=\"/admin/v1/x\",status=\"202\"} 1\n";
        assert!(metrics.contains(line), "{metrics}");
    }

    #[test]
    fn a_set_without_tokens_is_empty() {
        assert!(AdminTokens::new(vec![]).is_empty());
        assert!(!AdminTokens::new(vec![token("a", "b", Scopes::ALL)]).is_empty());
    }

    #[tokio::test]
    async fn the_watcher_rotates_a_token_without_a_call() {
        let (dir, tokens, file) = with_a_file("pg-access-watch");
        let tokens = Arc::new(tokens);
        let watcher = tokio::spawn(tokens.clone().watch());
        std::fs::write(&file, "two").unwrap();
        let deadline = tokio::time::Instant::now() + RELOAD_INTERVAL * 5;
        while tokens.check(&bearer("Bearer two")).is_none() {
            let late = "not rotated within five intervals";
            assert!(tokio::time::Instant::now() < deadline, "{late}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        watcher.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
