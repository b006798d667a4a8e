//! docs/admin-access.md: what every admin call leaves on record, read on a
//! gateway process of its own (its log and `/metrics`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use crate::admin_access::{DEBUG, REVEALS_READ};
use crate::support::TOKEN;
use crate::support::child::Process;
use crate::support::paths::{METRICS, REVEALS, STATUSES, ad_reveals_path};

/// How long a line written may take to come through the process's pipe.
const LOG_LAG: Duration = Duration::from_secs(10);

/// `[[admin.tokens]]` as an environment value.
fn tokens() -> String {
    format!(
        "[{{name=\"reveals-read\",token=\"{REVEALS_READ}\",scopes=[\"reveals:read\"]}},\
         {{name=\"debug\",token=\"{DEBUG}\",scopes=[\"debug\"]}}]"
    )
}

async fn gateway(dir: &tempfile::TempDir) -> Process {
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    Process::start_with(&url, &[("ADMIN__TOKENS", &tokens())]).await
}

/// An admin request with `token` (none: no `Authorization`), its status.
async fn call(process: &Process, method: Method, path: &str, token: Option<&str>) -> u16 {
    let mut request = process
        .http
        .request(method.clone(), format!("{}{path}", process.admin));
    if method == Method::POST {
        request = request
            .header("content-type", "application/json")
            .body(r#"{"items": [{"user_id": 4245, "enabled": true, "version": 1}]}"#);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().status().as_u16()
}

/// The JSON log lines with `message` so far (appended to `seen`).
fn logged(process: &Process, seen: &mut Vec<Value>, message: &str) -> Vec<Value> {
    seen.extend(
        process
            .child
            .lines_so_far()
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok()),
    );
    seen.iter()
        .filter(|line| line["fields"]["message"] == message)
        .cloned()
        .collect()
}

/// A field of a JSON log line as text (numbers and strings alike).
fn field(line: &Value, name: &str) -> String {
    match &line["fields"][name] {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The series `name{labels}` on the process's /metrics (0 when absent).
async fn series(process: &Process, series: &str) -> f64 {
    let text = process
        .http
        .get(format!("{}{METRICS}", process.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    crate::support::series_value(&text, series).unwrap_or(0.0)
}

/// Each admin call: one INFO line and one count by token name (never its value).
#[tokio::test]
async fn every_admin_call_is_on_its_own_record_by_token_name() {
    let dir = tempfile::tempdir().unwrap();
    let process = gateway(&dir).await;
    let reveals = format!("{REVEALS}?user_id=4242");
    assert_eq!(
        call(&process, Method::GET, &reveals, Some(REVEALS_READ)).await,
        200
    );
    assert_eq!(
        call(&process, Method::GET, &reveals, Some(DEBUG)).await,
        403
    );
    assert_eq!(
        call(&process, Method::GET, &reveals, Some("nope")).await,
        401
    );
    assert_eq!(call(&process, Method::GET, &reveals, None).await, 401);
    assert_eq!(
        call(&process, Method::POST, STATUSES, Some(TOKEN)).await,
        200
    );

    let expected: BTreeMap<(String, String, String, String), usize> = [
        (("reveals-read", "GET", REVEALS, "200"), 1),
        (("debug", "GET", REVEALS, "403"), 1),
        (("none", "GET", REVEALS, "401"), 2),
        (("admin.token", "POST", STATUSES, "200"), 1),
    ]
    .into_iter()
    .map(|((token, method, route, status), n)| {
        let key = (token.into(), method.into(), route.into(), status.into());
        (key, n)
    })
    .collect();
    let mut seen = Vec::new();
    let on_record = |seen: &mut Vec<Value>| {
        let mut found: BTreeMap<(String, String, String, String), usize> = BTreeMap::new();
        for line in logged(&process, seen, "admin call") {
            assert_eq!(line["level"], "INFO", "{line}");
            let key = ["token", "method", "route", "status"].map(|f| field(&line, f));
            let [token, method, route, status] = key;
            *found.entry((token, method, route, status)).or_default() += 1;
        }
        found
    };
    // Each line is written before its answer is sent; the pipe may lag.
    let asked = Instant::now();
    let mut found = on_record(&mut seen);
    while found != expected && asked.elapsed() < LOG_LAG {
        tokio::time::sleep(Duration::from_millis(10)).await;
        found = on_record(&mut seen);
    }
    assert_eq!(found, expected, "the admin call lines");

    for ((token, _, route, status), n) in &expected {
        let counted = series(
            &process,
            &format!(
                "phones_gateway_admin_requests_total{{token=\"{token}\",route=\"{route}\",status=\"{status}\"}}"
            ),
        )
        .await;
        assert_eq!(counted, *n as f64, "{token} {route} {status}");
    }
}

/// Each read of the reveal log is one INFO line naming reader and subject.
#[tokio::test]
async fn a_read_of_the_reveal_log_is_logged_at_info_with_the_reader_and_the_subject() {
    let dir = tempfile::tempdir().unwrap();
    let process = gateway(&dir).await;
    for (path, token) in [
        (format!("{REVEALS}?user_id=4242"), REVEALS_READ),
        (format!("{REVEALS}?viewer=v-4243"), REVEALS_READ),
        (ad_reveals_path(4244), REVEALS_READ),
        (format!("{REVEALS}?user_id=4245"), TOKEN),
    ] {
        assert_eq!(
            call(&process, Method::GET, &path, Some(token)).await,
            200,
            "{path}"
        );
    }
    let expected = [
        ("reveals-read", "user_id", "4242"),
        ("reveals-read", "viewer", "v-4243"),
        ("reveals-read", "ad_id", "4244"),
        ("admin.token", "user_id", "4245"),
    ];
    let mut seen = Vec::new();
    let asked = Instant::now();
    let mut lines = logged(&process, &mut seen, "reveal log read");
    while lines.len() < expected.len() && asked.elapsed() < LOG_LAG {
        tokio::time::sleep(Duration::from_millis(10)).await;
        lines = logged(&process, &mut seen, "reveal log read");
    }
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, (token, subject, value)) in lines.iter().zip(expected) {
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(field(line, "token"), token, "{line}");
        assert_eq!(field(line, subject), value, "{line}");
        for other in ["user_id", "viewer", "ad_id"] {
            if other != subject {
                assert_eq!(field(line, other), "", "one subject only: {line}");
            }
        }
    }
}
