//! docs/status-sync.md / issue 4: the status set survives a SIGKILL of the process, on SQLite
//! and on PostgreSQL; and it is loaded before /readyz says ready.

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::child::Spawned;
use crate::pg;
use crate::support::{Fake, Reply, TOKEN, Upstream, eventually, read};
use crate::{PLAIN_CATEGORY, REAL};

/// The real binary, started as operators start it, logging JSON (as production
/// does) at trace level into the privacy scanner.
pub struct Process {
    pub child: Spawned,
    pub public: String,
    pub admin: String,
    pub http: reqwest::Client,
}

impl Process {
    pub async fn start(database_url: &str) -> Process {
        Self::start_with(database_url, &[]).await
    }

    /// Starts the binary with extra `PHONES_GATEWAY__*` settings; both listeners
    /// on port 0, their addresses read back from the "listening" line.
    pub async fn start_with(database_url: &str, env: &[(&str, &str)]) -> Process {
        let mut command = Command::new(env!("CARGO_BIN_EXE_phones-gateway"));
        command
            .arg("serve")
            .env("PHONES_GATEWAY__SERVER__PUBLIC_ADDR", "127.0.0.1:0")
            .env("PHONES_GATEWAY__SERVER__ADMIN_ADDR", "127.0.0.1:0")
            .env("PHONES_GATEWAY__ADMIN__TOKEN", TOKEN)
            .env("PHONES_GATEWAY__DATABASE__URL", database_url)
            .env("PHONES_GATEWAY__LOG__FILTER", "phones_gateway=trace,info")
            .env("PHONES_GATEWAY__LOG__FORMAT", "json")
            // Cold admission off, as in TestApp's base config: on a loaded
            // 2-core runner a task can wait 50 ms for a worker, and uncached
            // requests would then be shed (503). Admission has tests of its own
            // (abuse.rs); a test here may set it again through `env`.
            .env("PHONES_GATEWAY__SERVER__MAX_QUEUE_DELAY_MS", "0")
            .env_remove("RUST_LOG");
        for (key, value) in env {
            command.env(format!("PHONES_GATEWAY__{key}"), value);
        }
        let child = Spawned::spawn(command, "phones-gateway serve");
        let limit = Duration::from_secs(30);
        let addrs = child.logged("listening", &["public", "admin"], limit).await;
        let (public, admin) = (&addrs[0], &addrs[1]);
        let process = Process {
            child,
            public: format!("http://{public}"),
            admin: format!("http://{admin}"),
            http: reqwest::Client::new(),
        };
        let ready = format!("{}/readyz", process.admin);
        eventually("the process to become ready", limit, || async {
            let got = process.http.get(&ready).send().await;
            got.is_ok_and(|r| r.status() == 200)
        })
        .await;
        process
    }

    async fn send(&self, method: reqwest::Method, body: serde_json::Value) -> u16 {
        self.http
            .request(
                method,
                format!("{}/admin/v1/calltracking/statuses", self.admin),
            )
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    async fn status(&self, user: u64) -> serde_json::Value {
        let response = self
            .http
            .get(format!(
                "{}/admin/v1/calltracking/statuses/{user}",
                self.admin
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        serde_json::from_str(&response.text().await.unwrap()).unwrap()
    }

    /// SIGTERM, then the exit status.
    pub fn sigterm(mut self) -> std::process::ExitStatus {
        self.child.sigterm()
    }

    fn sigkill(mut self) {
        self.child.kill();
    }
}

async fn statuses_survive_sigkill(database_url: &str) {
    let first = Process::start(database_url).await;
    let items = json!({ "items": [
        { "user_id": 1, "enabled": true, "version": 3 },
        { "user_id": 2, "enabled": true, "version": 1 },
    ]});
    assert_eq!(first.send(reqwest::Method::POST, items).await, 200);
    let snapshot = json!({ "version": 2, "enabled_user_ids": [3] });
    assert_eq!(first.send(reqwest::Method::PUT, snapshot).await, 200);
    first.sigkill();

    let second = Process::start(database_url).await;
    assert_eq!(
        second.status(1).await,
        json!({ "user_id": 1, "enabled": true, "version": 3 })
    );
    assert_eq!(
        second.status(2).await,
        json!({ "user_id": 2, "enabled": false, "version": 2 })
    );
    assert_eq!(
        second.status(3).await,
        json!({ "user_id": 3, "enabled": true, "version": 2 })
    );
    // Ordering still holds against what was stored before the kill.
    let stale = json!({ "items": [{ "user_id": 1, "enabled": false, "version": 3 }] });
    assert_eq!(second.send(reqwest::Method::POST, stale).await, 200);
    assert_eq!(second.status(1).await["enabled"], true);
}

#[tokio::test]
async fn sqlite_statuses_survive_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    // A directory that does not exist yet: created on first run.
    let url = format!("sqlite://{}/data/gateway.db", dir.path().display());
    statuses_survive_sigkill(&url).await;
}

#[tokio::test]
async fn postgres_statuses_survive_a_sigkill() {
    let Some(db) = pg::database().await else {
        return;
    };
    statuses_survive_sigkill(&db.url).await;
}

/// SIGTERM while a request is in service: the request is answered, then the
/// process exits 0.
#[tokio::test]
async fn sigterm_drains_an_in_flight_request_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let real = Fake::start(Upstream::RealPhone).await;
    real.reply_after(Reply::Phone(REAL), Duration::from_millis(1500));
    let process = Process::start_with(
        &format!("sqlite://{}/gw.db", dir.path().display()),
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
            ("UPSTREAMS__REAL_PHONE__TIMEOUT_MS", "5000"),
            ("SERVER__REQUEST_DEADLINE_MS", "8000"),
        ],
    )
    .await;
    let in_flight = {
        let url = format!(
            "{}/v1/public-phone?user_id=1&ad_id=1&category_id={PLAIN_CATEGORY}",
            process.public
        );
        let http = process.http.clone();
        tokio::spawn(async move { read(http.get(url).send().await.unwrap()).await })
    };
    eventually(
        "the request to reach the upstream",
        Duration::from_secs(10),
        || {
            let calls = real.calls();
            async move { calls == 1 }
        },
    )
    .await;
    let status = tokio::task::spawn_blocking(move || process.sigterm())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    in_flight.await.unwrap().assert_number(REAL, "real");
    assert!(real.unexpected().is_empty(), "{:?}", real.unexpected());
}
