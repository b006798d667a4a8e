//! Why this number (docs/rules.md, "Reason codes"): every answer's reason, on
//! record with its reveal and counted in `phones_gateway_answers_total`, family
//! by family. The gateway runs as a process so that the counters are its own.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::child::Process;
use crate::support::paths::{BATCH, METRICS, REVEALS};
use crate::support::{Fake, Reply, Upstream};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

struct Gateway {
    process: Process,
    real: Fake,
    anonymous: Fake,
    calltracking: Fake,
    _dir: tempfile::TempDir,
}

async fn gateway() -> Gateway {
    let real = Fake::start(Upstream::RealPhone).await;
    let anonymous = Fake::start(Upstream::Anonymous).await;
    let calltracking = Fake::start(Upstream::Calltracking).await;
    let (dir, url) = crate::support::sqlite_file("gw.db");
    let process = Process::start_with(
        &url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", real.url.as_str()),
            ("UPSTREAMS__ANONYMOUS__BASE_URL", anonymous.url.as_str()),
            (
                "UPSTREAMS__CALLTRACKING__BASE_URL",
                calltracking.url.as_str(),
            ),
            ("REVEALS__FLUSH_INTERVAL_MS", "50"),
            // A real number expires after a second, for the stale family.
            ("CACHE__REAL_PHONE__TTL_S", "1"),
            // Open, the call-tracking breaker stays so for the test.
            ("BREAKER__OPEN_MS", "600000"),
            ("LOG__FILTER", "info"),
        ],
    )
    .await;
    Gateway {
        process,
        real,
        anonymous,
        calltracking,
        _dir: dir,
    }
}

impl Gateway {
    async fn ask(&self, path: &str) -> crate::support::Answer {
        self.process.get_public_with(path, &[]).await
    }

    /// `user`'s reveals, newest first, once there are `n` (up to 10 s).
    async fn reveals(&self, user: u64, n: usize) -> Vec<Value> {
        let path = format!("{REVEALS}?user_id={user}");
        let start = std::time::Instant::now();
        loop {
            let page = self.process.get_admin(&path).await;
            let items = page.body["items"].as_array().cloned().unwrap_or_default();
            if items.len() >= n {
                assert_eq!(items.len(), n, "{items:?}");
                return items;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "seller {user}'s {n} reveal(s) not written within 10 s: {items:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The reason of `user`'s only reveal, read back from the reveal log.
    async fn reason_of(&self, user: u64) -> Value {
        self.reveals(user, 1).await[0]["reason"].clone()
    }

    /// `phones_gateway_answers_total{kind, reason}` on this process's /metrics.
    async fn answers(&self, kind: &str, reason: &str) -> f64 {
        let series = format!("phones_gateway_answers_total{{kind=\"{kind}\",reason=\"{reason}\"}}");
        let metrics = self.process.get_admin(METRICS).await.text;
        crate::support::series_value(&metrics, &series).unwrap_or(0.0)
    }
}

fn plain(user: u64, ad: u64) -> String {
    format!("/v1/public-phone?user_id={user}&ad_id={ad}&category_id={PLAIN_CATEGORY}")
}

/// One family: `user` asked at `path` shows `kind` (and `phone`), its reveal
/// reads back `reason`, and the count of (kind, its code) went up by one.
async fn family(gw: &Gateway, user: u64, path: &str, phone: &str, kind: &str, reason: Value) {
    let code = reason["code"].as_str().unwrap().to_owned();
    let before = gw.answers(kind, &code).await;
    let answer = gw.ask(path).await;
    assert_eq!(answer.status, 200, "seller {user}: {answer:?}");
    answer.assert_number(phone, kind);
    assert_eq!(gw.reason_of(user).await, reason, "seller {user}");
    assert_eq!(
        gw.answers(kind, &code).await,
        before + 1.0,
        "phones_gateway_answers_total{{kind={kind}, reason={code}}}"
    );
}

#[tokio::test]
async fn every_answer_carries_the_reason_the_rules_gave() {
    let gw = gateway().await;
    gw.real.reply(Reply::Phone(REAL));
    gw.calltracking.reply(Reply::Phone(VIRTUAL));
    gw.anonymous.reply(Reply::NotFound);

    // Not tracked: nothing above the real number applied.
    let reason = json!({"code": "upstream", "origin": "upstream",
        "sources": {"anonymous": "not_applicable", "calltracking": "not_applicable"}});
    family(&gw, 1, &plain(1, 1), REAL, "real", reason).await;

    // Anonymous answered (its category): nothing above it.
    gw.anonymous.reply(Reply::Phone(ANON));
    let path = format!("/v1/public-phone?user_id=2&ad_id=1&category_id={ANON_CATEGORY}");
    let reason = json!({"code": "upstream", "origin": "upstream", "sources": {}});
    family(&gw, 2, &path, ANON, "anonymous", reason).await;
    gw.anonymous.reply(Reply::NotFound);

    // Tracked, and call tracking answered.
    let tracked = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 18, 19];
    gw.process.track(tracked).await;
    let reason = json!({"code": "upstream", "origin": "upstream",
        "sources": {"anonymous": "not_applicable"}});
    family(&gw, 3, &plain(3, 1), VIRTUAL, "calltracking", reason).await;

    // No number from call tracking for this phone, nor from the anonymous
    // source in its category.
    gw.calltracking.reply_for(4, Reply::NotFound);
    let path = format!("/v1/public-phone?user_id=4&ad_id=1&category_id={ANON_CATEGORY}");
    let reason = json!({"code": "calltracking_no_number", "origin": "upstream",
        "sources": {"anonymous": "no_number", "calltracking": "no_number"}});
    family(&gw, 4, &path, REAL, "real", reason).await;

    // The caller's own phone, call tracking off for this seller: `phone`.
    let path = format!("{}&phone=%2B{}", plain(20, 1), &REAL[1..]);
    let reason = json!({"code": "phone", "origin": "phone",
        "sources": {"anonymous": "not_applicable", "calltracking": "not_applicable"}});
    family(&gw, 20, &path, REAL, "real", reason).await;

    // Tracked, call tracking timed out: fall_through, and the reason says so.
    // A call the gateway itself lost time in is undecided (503, no reveal):
    // the next seller is tried.
    let timed_out = json!({"code": "calltracking_timeout", "origin": "upstream",
                           "sources": {"anonymous": "not_applicable", "calltracking": "timeout"}});
    let mut undecided = 0;
    for user in [5, 16, 17, 18, 19] {
        gw.calltracking.reply_for(user, Reply::Hang);
        let before = gw.answers("real", "calltracking_timeout").await;
        let answer = gw.ask(&plain(user, 1)).await;
        if answer.status == 503 {
            assert_eq!(
                answer.body["detail"],
                "the number cannot be decided right now; retry later"
            );
            undecided += 1;
            continue;
        }
        answer.assert_number(REAL, "real");
        assert_eq!(gw.reason_of(user).await, timed_out, "seller {user}");
        assert_eq!(
            gw.answers("real", "calltracking_timeout").await,
            before + 1.0
        );
        break;
    }
    assert!(
        undecided < 5,
        "five timeouts in a row were the gateway's lost time"
    );

    // A stale value standing in: a real number, expired, its upstream at 500.
    gw.ask(&plain(30, 1)).await.assert_number(REAL, "real");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    gw.real.reply_for(30, Reply::Status(500));
    gw.ask(&plain(30, 1)).await.assert_number(REAL, "real");
    let newest = gw.reveals(30, 2).await[0].clone();
    assert_eq!(
        newest["reason"],
        json!({"code": "stale", "origin": "stale", "stood_in_for": "error_status",
               "sources": {"anonymous": "not_applicable", "calltracking": "not_applicable"}})
    );
    assert_eq!(gw.answers("real", "stale").await, 1.0);

    // The breaker opened on call tracking's 500s for five sellers: those fell
    // through on `error_status`, the next on `circuit_open`. An answer first, so
    // that the run of failures is these five's alone.
    gw.ask(&plain(15, 1))
        .await
        .assert_number(VIRTUAL, "calltracking");
    gw.calltracking.reply(Reply::Status(500));
    for user in 6..=10 {
        let reason = json!({"code": "calltracking_error_status", "origin": "upstream",
            "sources": {"anonymous": "not_applicable", "calltracking": "error_status"}});
        family(&gw, user, &plain(user, 1), REAL, "real", reason).await;
    }
    gw.calltracking.reply(Reply::Phone(VIRTUAL));
    let reason = json!({"code": "calltracking_circuit_open", "origin": "upstream",
        "sources": {"anonymous": "not_applicable", "calltracking": "circuit_open"}});
    family(&gw, 11, &plain(11, 1), REAL, "real", reason).await;

    // A tracked seller, the breaker still open, the caller sending the
    // seller's own number: real shown because call tracking failed, with a
    // code that says so.
    gw.process.track([21]).await;
    let path = format!("{}&phone=%2B{}", plain(21, 1), &REAL[1..]);
    let reason = json!({"code": "phone_calltracking_failed", "origin": "phone",
        "sources": {"anonymous": "not_applicable", "calltracking": "circuit_open"}});
    family(&gw, 21, &path, REAL, "real", reason).await;
    assert_eq!(gw.answers("real", "phone").await, 1.0, "seller 20's alone");

    // A batch item carries the same reason as the single route: seller 12
    // alone, then seller 13 in a batch, the breaker still open.
    let single = plain(12, 1);
    gw.ask(&single).await.assert_number(REAL, "real");
    let items = json!({"items": [{"user_id": 13, "ad_id": 1, "category_id": PLAIN_CATEGORY}]});
    let request = gw
        .process
        .http
        .post(format!("{}{BATCH}", gw.process.public));
    let request = request.header("content-type", "application/json");
    let body = crate::support::send_with(request.body(items.to_string()), &[])
        .await
        .body;
    assert_eq!(body["results"][0]["kind"], "real", "{body}");
    assert_eq!(gw.reason_of(13).await, gw.reason_of(12).await);
    // HEAD is not a reveal, and is not counted.
    let before = gw.answers("real", "upstream").await;
    let head = gw
        .process
        .http
        .head(format!("{}{}", gw.process.public, plain(14, 1)))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(gw.answers("real", "upstream").await, before);
}
