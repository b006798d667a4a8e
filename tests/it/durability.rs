//! SPEC 7 / issue 4: the status set survives a SIGKILL of the process, on SQLite
//! and on PostgreSQL; and it is loaded before /readyz says ready.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::pg;
use crate::pg::free_port;
use crate::support::TOKEN;

/// The real binary, started as operators start it.
pub struct Process {
    child: Child,
    pub admin: String,
    pub http: reqwest::Client,
}

impl Process {
    pub async fn start(database_url: &str) -> Process {
        let admin_port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_phones-gateway"))
            .arg("serve")
            .env(
                "PHONES_GATEWAY__SERVER__PUBLIC_ADDR",
                format!("127.0.0.1:{}", free_port()),
            )
            .env(
                "PHONES_GATEWAY__SERVER__ADMIN_ADDR",
                format!("127.0.0.1:{admin_port}"),
            )
            .env("PHONES_GATEWAY__ADMIN__TOKEN", TOKEN)
            .env("PHONES_GATEWAY__DATABASE__URL", database_url)
            .env("PHONES_GATEWAY__LOG__FILTER", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts");
        let process = Process {
            child,
            admin: format!("http://127.0.0.1:{admin_port}"),
            http: reqwest::Client::new(),
        };
        for _ in 0..200 {
            let ready = process
                .http
                .get(format!("{}/readyz", process.admin))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status() == 200) {
                return process;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the process never became ready");
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
    fn sigterm(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.child.wait().unwrap()
    }

    fn sigkill(mut self) {
        self.child.kill().unwrap(); // SIGKILL on Unix: no clean shutdown
        self.child.wait().unwrap();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

#[tokio::test]
async fn sigterm_drains_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let process = Process::start(&format!("sqlite://{}/gw.db", dir.path().display())).await;
    let status = tokio::task::spawn_blocking(move || process.sigterm())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
}
