//! docs/status-sync.md / issue 4: the status set survives a SIGKILL of the process, on SQLite
//! and on PostgreSQL; and it is loaded before /readyz says ready.

use std::time::Duration;

use serde_json::json;

use crate::support::child::Process;
use crate::support::pg;
use crate::support::{Fake, Reply, Upstream, eventually, read};
use crate::{PLAIN_CATEGORY, REAL};

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
