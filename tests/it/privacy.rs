//! docs/README.md#privacy: no full phone number in the logs. Besides these tests, every log line
//! of the test binary (both formats, trace level) and of every child process is
//! scanned as it is written (`support::leaks_in`), and every `TestApp` fails its
//! test on any leak when dropped, so the traffic of the entire suite is covered.

use std::sync::atomic::Ordering;

use crate::support::{
    JSON_LINES, Reply, TEXT_LINES, TestApp, assert_no_leaks, captured_logs, leaks_in,
};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

#[tokio::test]
async fn no_full_phone_number_in_the_logs() {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.anonymous.reply(Reply::Phone(ANON));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.enable_calltracking(61, 1).await;
    app.enable_calltracking(64, 1).await;
    app.phone(60, 1, ANON_CATEGORY)
        .await
        .assert_number(ANON, "anonymous");
    app.phone(61, 1, PLAIN_CATEGORY)
        .await
        .assert_number(VIRTUAL, "calltracking");
    app.phone(62, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");
    app.get_public("/v1/public-phone?user_id=63&ad_id=1&category_id=1&phone=%2B7916123456x")
        .await
        .assert_problem(400);
    app.get_public("/v1/public-phone?user_id=63&ad_id=1&category_id=1&phone=79161234567")
        .await
        .assert_problem(400);
    app.calltracking.reply(Reply::Status(500));
    app.phone(64, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");

    // The logs were captured, in both formats, and they speak of numbers, masked.
    let logs = captured_logs();
    assert!(
        logs.contains("+*********67"),
        "no masked number logged:\n{logs}"
    );
    assert!(TEXT_LINES.load(Ordering::Relaxed) > 0);
    assert!(JSON_LINES.load(Ordering::Relaxed) > 0);
    assert_no_leaks();
}

/// Issue 10 item 4: a parser's message quotes the body; a bare-number phone (or
/// any body quoting a number) must not reach the log of the failed call.
#[tokio::test]
async fn upstream_bodies_quoting_a_number_are_never_logged() {
    let app = TestApp::spawn().await;
    app.enable_calltracking(2, 1).await;
    let bodies: [(&str, &str); 6] = [
        (
            r#"{"phone": 79161234567}"#,
            r#"{"virtual_phone": 74951234567}"#,
        ),
        (
            r#"{"phone": "79161234567"}"#,
            r#"{"virtual_phone": "74951234567"}"#,
        ),
        (
            r#"{"phone": "+7916123456789012"}"#,
            r#"{"virtual_phone": "+7 495 123.45.67"}"#,
        ),
        (
            r#"{"phone": ["+79161234567"]}"#,
            r#"{"virtual_phone": {"n": "+74951234567"}}"#,
        ),
        (
            r#"{"phone": "+79161234567""#,
            r#"{"virtual_phone": +74951234567}"#,
        ),
        ("79161234567", "+74951234567"),
    ];
    for (i, (phone_body, virtual_body)) in bodies.into_iter().enumerate() {
        let ad = i as u64 + 1;
        // Anonymous fails closed: 503.
        app.anonymous.reply(Reply::Body(phone_body));
        app.real.reply(Reply::Phone(REAL));
        app.phone(1, ad, ANON_CATEGORY).await.assert_problem(503);
        // Call tracking falls through to the real number.
        app.calltracking.reply(Reply::Body(virtual_body));
        app.phone(2, ad, PLAIN_CATEGORY)
            .await
            .assert_number(REAL, "real");
        // Real fails: 503.
        app.real.reply(Reply::Body(phone_body));
        app.phone(3, ad, PLAIN_CATEGORY).await.assert_problem(503);
    }
    assert_eq!(app.anonymous.calls(), 6);
    assert_eq!(app.calltracking.calls(), 6);
    assert_no_leaks();
}

#[test]
fn the_scanner_finds_numbers_in_every_disguise() {
    let finds = |line: &str| !leaks_in(line).is_empty();
    // With `+` and the separators input may use, and more.
    assert_eq!(leaks_in("a +7 916 123-45-67 b"), ["+79161234567"]);
    assert!(finds("+7(916)1234567"));
    assert!(finds("phone=+7.916.123.45.67"));
    assert!(finds("phone=+7/916/123/45/67"));
    assert!(finds("+12345678")); // any number, not only fixtures
    // A fixture's digits without `+`, alone or in a longer run.
    assert!(finds(
        "invalid type: integer `79161234567`, expected a string"
    ));
    assert!(finds("user=1 phone=74951234567 x"));
    assert!(finds("7-916-123-45-67"));
    // Percent-encoded, as the call-tracking URL carries it.
    assert!(finds(
        "GET /v1/virtual-numbers?user_id=1&phone=%2B79161234567"
    ));
    assert!(finds("%2B12345678901"));
    // A mask that shows more than the last two digits.
    assert!(finds("phone=+*******4567"));
    assert!(finds("phone=7916*****67"));
    assert!(finds("+7916*****67"));
    // In JSON.
    assert!(finds(r#"{"fields":{"phone":"+79161234567"}}"#));
}

#[test]
fn the_scanner_lets_masks_ids_and_times_pass() {
    for line in [
        "phone=+*********67 user_id=42 ad_id=1001",
        r#"{"timestamp":"2026-11-23T10:00:00.123456Z","level":"DEBUG","fields":{"phone":"+*********67"}}"#,
        "2026-11-23T10:00:00.123456789Z DEBUG request{id=0123456789abcdef}: took 12.5ms",
        "+123 +1234567 and user 9223372036854775807",
        "listening on 127.0.0.1:41234",
    ] {
        assert_eq!(leaks_in(line), Vec::<String>::new(), "{line}");
    }
}
