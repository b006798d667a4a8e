//! docs/status-sync.md: the status-feed pull, its stored cursor, and leadership.

use std::time::{Duration, Instant};

use phones_gateway::domain::UserId;
use phones_gateway::sim::{self, SimConfig};

use crate::support::TestApp;
use crate::support::pg;

/// The simulator as the call-tracking upstream, its feed listing `statuses` sellers.
pub async fn feed(statuses: u64) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let config = SimConfig {
        statuses,
        ..SimConfig::default()
    };
    tokio::spawn(sim::serve(listener, config, std::future::pending()));
    url
}

fn overlay(feed_url: &str) -> String {
    format!(
        r#"
        [upstreams.calltracking]
        base_url = "{feed_url}"
        [upstreams.calltracking.status_feed]
        enabled = true
        interval_ms = 100
        limit = 7
        "#
    )
}

pub async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn enabled(app: &TestApp, user: u64) -> bool {
    app.status.set().is_enabled(UserId::new(user).unwrap())
}

#[tokio::test]
async fn the_feed_is_pulled_into_the_set_with_its_cursor_stored() {
    let feed_url = feed(30).await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let app = TestApp::spawn_on(Some(&url), &overlay(&feed_url)).await;
    wait_for("the whole feed", Duration::from_secs(5), || {
        enabled(&app, 120)
    })
    .await;
    assert!(enabled(&app, 4) && !enabled(&app, 5) && !enabled(&app, 124));
    assert!(app.status.is_feed_leader());
    let cursor = app.status.store().feed_cursor().await.unwrap();
    assert_eq!(cursor.as_deref(), Some("30"));
}

#[tokio::test]
async fn feed_leadership_moves_when_the_leader_dies() {
    let Some(db) = pg::database().await else {
        return;
    };
    let feed_url = feed(20).await;
    let a = TestApp::spawn_on(Some(&db.url), &overlay(&feed_url)).await;
    let b = TestApp::spawn_on(Some(&db.url), &overlay(&feed_url)).await;
    wait_for("a leader", Duration::from_secs(5), || {
        a.status.is_feed_leader() || b.status.is_feed_leader()
    })
    .await;
    leads_alone_then_fails_over(a, b).await;
}

/// Two replicas polling `feed(20)`: once both have the whole feed, exactly one
/// leads for a while; when it is dropped the other leads, with the stored
/// cursor. Returns how long the takeover took.
pub async fn leads_alone_then_fails_over(a: TestApp, b: TestApp) -> Duration {
    wait_for("the whole feed on both", Duration::from_secs(5), || {
        enabled(&a, 80) && enabled(&b, 80)
    })
    .await;
    for _ in 0..10 {
        assert!(
            a.status.is_feed_leader() ^ b.status.is_feed_leader(),
            "one leader at a time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (leader, follower) = if a.status.is_feed_leader() {
        (a, b)
    } else {
        (b, a)
    };
    let start = Instant::now();
    drop(leader);
    wait_for("the follower to lead", Duration::from_secs(5), || {
        follower.status.is_feed_leader()
    })
    .await;
    let took = start.elapsed();
    assert_eq!(
        follower
            .status
            .store()
            .feed_cursor()
            .await
            .unwrap()
            .as_deref(),
        Some("20"),
        "the cursor survived the leader"
    );
    took
}
