//! SPEC 10: no full phone number in the logs.

use crate::support::{Reply, TestApp, captured_logs};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

/// Every `+` followed by 8 or more digits (separators allowed) in `text`.
fn full_numbers(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (start, _) in text.match_indices('+') {
        let digits: String = text[start + 1..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || matches!(c, ' ' | '-' | '(' | ')'))
            .filter(char::is_ascii_digit)
            .collect();
        if digits.len() >= 8 {
            found.push(format!("+{digits}"));
        }
    }
    found
}

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
