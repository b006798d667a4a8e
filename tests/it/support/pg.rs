//! Throwaway PostgreSQL clusters: `initdb` in a temp dir on a free port, run
//! as `postgres` when we are root, one per test (which may stop or restart it),
//! at most `MAX_CLUSTERS` at once; with `TEST_POSTGRES_URL`, tests that do not
//! stop the server get a fresh database there instead.
//!
//! With `REQUIRE_POSTGRES` or `CI` set (not empty, `0` or `false`), a missing
//! PostgreSQL fails the test; elsewhere it says `SKIPPED`, leaves a marker in
//! `SKIPPED_DIR` when set, and returns: `pg::or_skip!(pg::database().await)`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Condvar, Mutex};

const MAX_CLUSTERS: usize = 2;
static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// A place among the `MAX_CLUSTERS`, given back when dropped.
struct Slot;

impl Slot {
    fn take() -> Slot {
        let (count, freed) = &RUNNING;
        let mut count = count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *count >= MAX_CLUSTERS {
            count = freed
                .wait(count)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        *count += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING;
        *count
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) -= 1;
        freed.notify_one();
    }
}

/// Whether a PostgreSQL test must fail rather than skip when it has none.
pub fn required() -> bool {
    ["REQUIRE_POSTGRES", "CI"].iter().any(|name| {
        std::env::var(name).is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "no"))
    })
}

/// A port free on 127.0.0.1 at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct PgCluster {
    dir: tempfile::TempDir,
    port: u16,
    _slot: Slot,
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Runs a PostgreSQL binary, as `postgres` when we are root.
fn pg_command(program: &str, args: &[&str]) -> Result<(), String> {
    let output = if is_root() {
        Command::new("runuser")
            .args(["-u", "postgres", "--", program])
            .args(args)
            .output()
    } else {
        Command::new(program).args(args).output()
    }
    .map_err(|e| format!("{program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

impl PgCluster {
    /// Starts a new cluster; fails when the PostgreSQL binaries are missing
    /// or fail.
    pub fn start() -> Result<PgCluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("pg-test-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres", &dir.path().display().to_string()])
                .status()
                .map_err(|e| e.to_string())?;
            if !status.success() {
                return Err("chown to postgres failed".into());
            }
        }
        let mut cluster = PgCluster {
            dir,
            port: free_port(),
            _slot: Slot::take(),
        };
        pg_command(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        // Another process may have taken the port since: try a few.
        let mut result = cluster.start_server();
        for _ in 0..4 {
            if result.is_ok() {
                break;
            }
            cluster.port = free_port();
            result = cluster.start_server();
        }
        result?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts (again) a stopped server on the same port and data.
    pub fn start_server(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        pg_command(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &self.log().display().to_string(),
                "-w",
                "start",
            ],
        )
    }

    /// Stops the server, dropping every connection (`-m fast`).
    pub fn stop_server(&self) -> Result<(), String> {
        pg_command("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"])
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = pg_command(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }
}

/// A PostgreSQL database for one test: its own cluster, or (with
/// `TEST_POSTGRES_URL`) a fresh database on the given server.
pub struct TestDb {
    pub url: String,
    pub cluster: Option<PgCluster>,
}

fn unavailable(why: &str) -> Option<TestDb> {
    if required() {
        panic!("PostgreSQL is required (REQUIRE_POSTGRES / CI) and could not be had: {why}");
    }
    skipped(&format!(
        "no PostgreSQL ({why}); set TEST_POSTGRES_URL or install PostgreSQL"
    ));
    None
}

/// Says the calling test is skipped, and why: `SKIPPED` on stderr, and a
/// marker file (test name, then reason) in `SKIPPED_DIR` when set.
pub fn skipped(why: &str) {
    let thread = std::thread::current();
    // A bench runs on `main`: named by its binary instead.
    let test = match thread.name() {
        Some("main") | None => std::env::args().next().map_or_else(
            || "a PostgreSQL test".to_owned(),
            |exe| format!("{exe} (main)"),
        ),
        Some(name) => name.to_owned(),
    };
    eprintln!("SKIPPED: {test}: {why}");
    if let Some(dir) = std::env::var_os("SKIPPED_DIR").filter(|d| !d.is_empty()) {
        let file = PathBuf::from(dir).join(format!("{:016x}", rand_u64()));
        if let Err(error) = std::fs::write(&file, format!("{test}\n{why}\n")) {
            eprintln!(
                "the skip could not be recorded in {}: {error}",
                file.display()
            );
        }
    }
}

/// The `Some` value of `$wanted`, or a return from the caller (with its
/// return type's default) when PostgreSQL cannot be had and is not required
/// (where it is, the call has panicked).
// The benches include this file too (`#[path]`): unused there.
#[allow(unused_macros)]
macro_rules! or_skip {
    ($wanted:expr) => {
        match $wanted {
            Some(wanted) => wanted,
            None => return Default::default(),
        }
    };
}
#[allow(unused_imports)]
pub(crate) use or_skip;

/// A database for a test that does not stop the server.
pub async fn database() -> Option<TestDb> {
    if let Ok(url) = std::env::var("TEST_POSTGRES_URL") {
        let name = format!("t_{:016x}", rand_u64());
        let mut admin = match <sqlx::PgConnection as sqlx::Connection>::connect(&url).await {
            Ok(c) => c,
            Err(e) => return unavailable(&e.to_string()),
        };
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .unwrap();
        let base = url.rsplit_once('/').map_or(url.as_str(), |(b, _)| b);
        return Some(TestDb {
            url: format!("{base}/{name}"),
            cluster: None,
        });
    }
    cluster()
}

/// A database on a cluster of the test's own, which it may stop and start.
pub fn cluster() -> Option<TestDb> {
    match PgCluster::start() {
        Ok(cluster) => Some(TestDb {
            url: cluster.url(),
            cluster: Some(cluster),
        }),
        Err(e) => unavailable(&e),
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}
