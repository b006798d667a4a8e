//! A PgBouncer in transaction mode in front of one PostgreSQL cluster
//! (docs/status-sync.md#behind-a-transaction-mode-pooler), with fewer server
//! connections than the replicas' pools, so replicas really share them. Run
//! as `postgres` when we are root; skipped or failed as `pg` says.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::pg;

/// A PgBouncer in transaction mode in front of one PostgreSQL, stopped when dropped.
pub struct PgBouncer {
    dir: tempfile::TempDir,
    port: u16,
}

pub fn binary() -> Option<PathBuf> {
    ["pgbouncer", "/usr/sbin/pgbouncer"]
        .iter()
        .map(PathBuf::from)
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

impl PgBouncer {
    fn start(postgres_port: u16) -> Result<PgBouncer, String> {
        let binary = binary().ok_or("pgbouncer is not installed (apt-get install -y pgbouncer)")?;
        let dir = tempfile::Builder::new()
            .prefix("pgbouncer-test-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(path("userlist.txt"), "\"postgres\" \"\"\n").map_err(|e| e.to_string())?;
        {
            let port = pg::free_port();
            let ini = format!(
                "[databases]\n\
                 postgres = host=127.0.0.1 port={postgres_port} dbname=postgres user=postgres\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = transaction\n\
                 default_pool_size = 3\n\
                 max_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\n\
                 pidfile = {pid}\n",
                users = path("userlist.txt"),
                log = path("pgbouncer.log"),
                pid = path("pgbouncer.pid"),
            );
            std::fs::write(path("pgbouncer.ini"), ini).map_err(|e| e.to_string())?;
            if pg::is_root() {
                let chown = Command::new("chown")
                    .args(["-R", "postgres", &dir.path().display().to_string()])
                    .status()
                    .map_err(|e| e.to_string())?;
                if !chown.success() {
                    return Err("chown to postgres failed".into());
                }
            }
            let mut command = if pg::is_root() {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&binary);
                c
            } else {
                Command::new(&binary)
            };
            let output = command
                .args(["-d", &path("pgbouncer.ini")])
                .output()
                .map_err(|e| e.to_string())?;
            let bouncer = PgBouncer { dir, port };
            if output.status.success() && bouncer.accepts() {
                return Ok(bouncer);
            }
            let why = format!(
                "pgbouncer failed: {}{} {}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                std::fs::read_to_string(bouncer.dir.path().join("pgbouncer.log"))
                    .unwrap_or_default()
            );
            drop(bouncer);
            Err(why)
        }
    }

    /// Waits (up to 5 s) until the pooler accepts connections.
    fn accepts(&self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn stop(&self) {
        let pid_file = self.dir.path().join("pgbouncer.pid");
        if let Ok(pid) = std::fs::read_to_string(pid_file) {
            let _ = Command::new("kill").args(["-TERM", pid.trim()]).status();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// PostgreSQL and a PgBouncer in front of it, or `None` (skipped).
pub fn pooled() -> Option<(pg::TestDb, PgBouncer)> {
    let db = pg::cluster()?;
    let port: u16 = db
        .url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("the cluster's URL names its port");
    match PgBouncer::start(port) {
        Ok(bouncer) => Some((db, bouncer)),
        Err(why) if pg::required() => {
            panic!("PgBouncer is required (REQUIRE_POSTGRES / CI) and could not be had: {why}")
        }
        Err(why) => {
            pg::skipped(&format!("no PgBouncer ({why})"));
            None
        }
    }
}

/// The overlay of a replica behind the pooler, with `extra` sections.
pub fn through(bouncer: &PgBouncer, db: &pg::TestDb, extra: &str) -> String {
    format!(
        "[database]\nurl = \"{}\"\ndirect_url = \"{}\"\nlisten = false\n\
         sync_interval_ms = 100\nmax_connections = 4\n{extra}\n",
        bouncer.url(),
        db.url
    )
}

/// What PostgreSQL itself sees: its client connections other than this one.
pub async fn server_connections(direct: &str) -> i64 {
    let pool = sqlx::PgPool::connect(direct).await.unwrap();
    let n = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' \
         AND pid <> pg_backend_pid()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    n
}
