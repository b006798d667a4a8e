//! SPEC 10: no full phone number in the logs. Besides this test, every `TestApp`
//! checks the logs of the whole test binary so far when it is dropped, so the
//! traffic of the entire suite is covered.

use crate::support::{Reply, TestApp, captured_logs, full_numbers};
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
    app.calltracking.reply(Reply::Status(500));
    app.phone(64, 1, PLAIN_CATEGORY)
        .await
        .assert_number(REAL, "real");

    let logs = captured_logs();
    // The logs were captured, and they speak of numbers, masked.
    assert!(
        logs.contains("+*********67"),
        "no masked number logged:\n{logs}"
    );
    let leaked = full_numbers(&logs);
    assert!(leaked.is_empty(), "full numbers in the logs: {leaked:?}");
}

#[test]
fn the_scanner_finds_numbers() {
    assert_eq!(
        full_numbers("a +7 916 123-45-67 b +*****67 +123"),
        ["+79161234567"]
    );
}
