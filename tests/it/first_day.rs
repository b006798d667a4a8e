//! An operator's first day (docs/status-sync.md "Behind a transaction-mode
//! pooler" and "Bounded calls"): a first start is quiet, a replica that would
//! harm the fleet through a pooler is refused, and a database error names its
//! cause and address.

use std::process::Command;
use std::time::Duration;

use crate::support::child::Process;
use crate::support::child::Spawned;
use crate::support::pg;
use crate::support::{TestApp, captured_logs, eventually};

/// The WARN and ERROR lines of a first start, once it is ready and its
/// background work (the first retention round, the first flush) has run.
async fn first_start_complaints(database_url: &str) -> Vec<String> {
    let process = Process::start_with(database_url, &[("REVEALS__FLUSH_INTERVAL_MS", "50")]).await;
    // The first retention round runs right after the load; give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    process
        .child
        .lines_so_far()
        .into_iter()
        .filter(|line| line.contains("\"WARN\"") || line.contains("\"ERROR\""))
        .collect()
}

#[tokio::test]
async fn a_first_start_on_a_fresh_sqlite_file_logs_no_warning() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/fresh.db?mode=rwc", dir.path().display());
    let complaints = first_start_complaints(&url).await;
    assert!(complaints.is_empty(), "{complaints:#?}");
}

#[tokio::test]
async fn a_first_start_on_a_fresh_postgres_logs_no_warning() {
    let Some(db) = pg::database().await else {
        return;
    };
    let complaints = first_start_complaints(&db.url).await;
    assert!(complaints.is_empty(), "{complaints:#?}");
}

#[tokio::test]
async fn a_database_that_refuses_is_named_with_its_address_and_cause() {
    let port = pg::free_port();
    let url = format!("postgres://gateway:s3cret-pw@127.0.0.1:{port}/gateway");
    let mut command = Command::new(env!("CARGO_BIN_EXE_phones-gateway"));
    command
        .arg("serve")
        .env("PHONES_GATEWAY__SERVER__PUBLIC_ADDR", "127.0.0.1:0")
        .env("PHONES_GATEWAY__SERVER__ADMIN_ADDR", "127.0.0.1:0")
        .env("PHONES_GATEWAY__DATABASE__URL", &url)
        .env("PHONES_GATEWAY__LOG__FORMAT", "json")
        .env_remove("RUST_LOG");
    let child = Spawned::spawn(command, "phones-gateway serve");
    let mut seen = Vec::new();
    eventually("a line naming the cause", Duration::from_secs(10), || {
        seen.extend(child.lines_so_far());
        let found = seen
            .iter()
            .any(|line| line.contains(&format!("127.0.0.1:{port}")) && line.contains("refused"));
        async move { found }
    })
    .await;
    assert!(
        !seen.iter().any(|line| line.contains("s3cret-pw")),
        "the password was logged"
    );
}

/// `database.url` is PgBouncer in transaction mode. A replica without
/// `direct_url` (listen left at its default) stops with one line naming the
/// key; one with `direct_url` listens on PostgreSQL itself. Meanwhile a
/// correctly configured replica's 40 webhooks all pass (before, a listener
/// through the pooler made 30 of 40 fail with a stray NotificationResponse).
#[tokio::test]
async fn a_would_be_listener_through_a_pooler_harms_no_other_replica() {
    let Some((db, bouncer)) = crate::pgbouncer::pooled() else {
        return;
    };
    let good = TestApp::spawn_on(
        Some(&bouncer.url()),
        &crate::pgbouncer::through(&bouncer, &db, ""),
    )
    .await;
    let mut refused = TestApp::start_on(Some(&bouncer.url()), "").await;
    // direct_url set, but to the pooler as well.
    let mut misdirected = TestApp::start_on(
        Some(&bouncer.url()),
        &format!("[database]\ndirect_url = \"{}\"\n", bouncer.url()),
    )
    .await;
    let listener = TestApp::spawn_on(
        Some(&bouncer.url()),
        &format!("[database]\ndirect_url = \"{}\"\n", db.url),
    )
    .await;
    for i in 1..=40u64 {
        let body =
            serde_json::json!({ "items": [{ "user_id": i, "enabled": true, "version": 1 }] });
        for app in [&good, &listener] {
            let answer = app
                .send_admin(
                    reqwest::Method::POST,
                    "/admin/v1/calltracking/statuses",
                    &body,
                )
                .await;
            assert_eq!(answer.status, 200, "webhook {i}: {:?}", answer.body);
        }
    }
    for app in [&mut refused, &mut misdirected] {
        let error = app
            .stopped_by_itself(Duration::from_secs(15))
            .await
            .expect_err("a pooler without a session connection stops the replica");
        let message = error.to_string();
        assert!(
            message.contains("database.direct_url") && message.contains("database.listen"),
            "{message}"
        );
    }
    assert!(
        captured_logs()
            .lines()
            .all(|l| !l.contains("NotificationResponse"))
    );
}

#[tokio::test]
async fn the_session_check_tells_a_transaction_pooler_from_postgres() {
    let Some((db, bouncer)) = crate::pgbouncer::pooled() else {
        return;
    };
    let options = |url: &str| url.parse::<sqlx::postgres::PgConnectOptions>().unwrap();
    let keeps = phones_gateway::store::keeps_sessions;
    assert!(
        keeps(&options(&db.url)).await.unwrap(),
        "PostgreSQL keeps sessions"
    );
    assert!(
        !keeps(&options(&bouncer.url())).await.unwrap(),
        "a transaction-mode pooler does not"
    );
}
