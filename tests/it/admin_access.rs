//! docs/admin-access.md: named tokens and scopes against every admin route,
//! the order of refusals, token files rotated under the app, start-up checks.

use std::process::Command;
use std::time::{Duration, Instant};

use phones_gateway::config::Scope;
use phones_gateway::http::api::routes::{self, Access};
use reqwest::Method;

use crate::support::child::Process;
use crate::support::paths::{METRICS, REVEALS, ad_reveals_path, status_path};
use crate::support::{TestApp, captured_logs, eventually};

pub const STATUSES_READ: &str = "tok-statuses-read-5e1f0c";
pub const STATUSES_WRITE: &str = "tok-statuses-write-9a3b2d";
pub const CACHE_INVALIDATE: &str = "tok-cache-invalidate-71c4e8";
pub const REVEALS_READ: &str = "tok-reveals-read-3d9f6a";
pub const DEBUG: &str = "tok-debug-b28e17";
pub const NO_SCOPE: &str = "tok-no-scope-60da4c";
pub const OLD: &str = "tok-rotating-old-c7a1e3";
pub const NEW: &str = "tok-rotating-new-f04b9d";

fn one_token_per_scope() -> String {
    let mut toml = String::new();
    for (scope, value) in [
        (Some(Scope::StatusesRead), STATUSES_READ),
        (Some(Scope::StatusesWrite), STATUSES_WRITE),
        (Some(Scope::CacheInvalidate), CACHE_INVALIDATE),
        (Some(Scope::RevealsRead), REVEALS_READ),
        (Some(Scope::Debug), DEBUG),
        (None, NO_SCOPE),
    ] {
        let (name, scopes) = match scope {
            Some(scope) => (
                scope.as_str().replace(':', "-"),
                format!("[\"{}\"]", scope.as_str()),
            ),
            None => ("no-scope".to_owned(), "[]".to_owned()),
        };
        toml.push_str(&format!(
            "[[admin.tokens]]\nname = \"{name}\"\ntoken = \"{value}\"\nscopes = {scopes}\n"
        ));
    }
    toml
}

fn token_of(scope: Scope) -> &'static str {
    match scope {
        Scope::StatusesRead => STATUSES_READ,
        Scope::StatusesWrite => STATUSES_WRITE,
        Scope::CacheInvalidate => CACHE_INVALIDATE,
        Scope::RevealsRead => REVEALS_READ,
        Scope::Debug => DEBUG,
    }
}

/// A cheap request for each guarded route, and a method it does not serve.
fn request_for(path: &str) -> (Method, String, Method) {
    match path {
        "/admin/v1/calltracking/statuses" => (Method::POST, path.into(), Method::DELETE),
        "/admin/v1/calltracking/statuses/{user_id}" => (Method::GET, status_path(42), Method::POST),
        "/admin/v1/cache/invalidate" => (Method::POST, path.into(), Method::GET),
        // A bad `seconds`: admitted, then refused before any sampling.
        "/admin/v1/debug/pprof/profile" => (Method::GET, format!("{path}?seconds=0"), Method::POST),
        "/admin/v1/reveals" => (Method::GET, format!("{REVEALS}?user_id=42"), Method::POST),
        "/admin/v1/ads/{ad_id}/reveals" => (Method::GET, ad_reveals_path(7), Method::POST),
        "/openapi/admin.json" => (Method::GET, path.into(), Method::POST),
        other => panic!("a guarded route this test does not know: {other} (add it here)"),
    }
}

async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    token: Option<&str>,
) -> crate::support::Answer {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer));
    }
    app.admin_request(method, path, &headers, "{}").await
}

/// Each route admits its scope only; any other is a 403 naming the scope.
#[tokio::test]
async fn each_scope_against_each_admin_route() {
    let app = TestApp::spawn_with(&one_token_per_scope()).await;
    let mut guarded = 0;
    for row in routes::ADMIN {
        let Access::Token(needed) = row.access else {
            continue;
        };
        guarded += 1;
        let (method, path, _) = request_for(row.path);
        for scope in Scope::ALL {
            let got = send(&app, method.clone(), &path, Some(token_of(scope))).await;
            if scope == needed {
                assert!(
                    got.status != 401 && got.status != 403 && got.status < 500,
                    "{method} {path} with {scope}: {got:?}"
                );
            } else {
                got.assert_problem(403);
                let detail = got.body["detail"].as_str().unwrap();
                assert!(
                    detail.contains(needed.as_str()),
                    "{method} {path} with {scope}: {detail}"
                );
            }
        }
        send(&app, method.clone(), &path, Some(NO_SCOPE))
            .await
            .assert_problem(403);
        let all = send(&app, method.clone(), &path, Some(crate::support::TOKEN)).await;
        assert!(
            got_in(all.status, &[200, 400, 404]),
            "{method} {path} with admin.token: {all:?}"
        );
    }
    assert_eq!(guarded, 7);
}

fn got_in(status: u16, set: &[u16]) -> bool {
    set.contains(&status)
}

/// 401 before anything else, 403 before the route's 404 or 405.
#[tokio::test]
async fn unauthorized_then_forbidden_then_not_found_or_not_allowed() {
    let app = TestApp::spawn_with(&one_token_per_scope()).await;
    for row in routes::ADMIN.iter().filter(|r| r.access != Access::Open) {
        let Access::Token(needed) = row.access else {
            unreachable!()
        };
        let (_, path, wrong_method) = request_for(row.path);
        for token in [None, Some("nope"), Some(OLD)] {
            send(&app, wrong_method.clone(), &path, token)
                .await
                .assert_problem(401);
        }
        let other = Scope::ALL.into_iter().find(|s| *s != needed).unwrap();
        let forbidden = send(&app, wrong_method.clone(), &path, Some(token_of(other))).await;
        forbidden.assert_problem(403);
        send(&app, wrong_method.clone(), &path, Some(token_of(needed)))
            .await
            .assert_problem(405);
    }
    for token in [NO_SCOPE, STATUSES_WRITE] {
        for method in [Method::GET, Method::POST] {
            send(&app, method, "/admin/v1/nothing/here", Some(token))
                .await
                .assert_problem(404);
        }
    }
    send(&app, Method::GET, "/admin/v1/nothing/here", None)
        .await
        .assert_problem(401);
}

/// A rewritten token file: the old value works until the new one does, then
/// stops; an emptied or removed file keeps the last good value and says so.
#[tokio::test]
async fn a_rotated_token_file_takes_over_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rotating");
    std::fs::write(&file, format!("{OLD}\n")).unwrap();
    let app = TestApp::spawn_with(&format!(
        "[[admin.tokens]]\nname = \"rotating\"\ntoken_file = {file:?}\nscopes = [\"statuses:read\"]\n"
    ))
    .await;
    let path = status_path(42);
    let ok = |token: &'static str| {
        let (app, path) = (&app, &path);
        async move { send(app, Method::GET, path, Some(token)).await.status == 200 }
    };
    assert!(ok(OLD).await);
    assert!(!ok(NEW).await);
    replace_file(&file, NEW);
    let written = Instant::now();
    loop {
        // Once the new value works, the old must already fail.
        if ok(NEW).await {
            assert!(
                !ok(OLD).await,
                "the old value still works after the new one did, {:?} after the write",
                written.elapsed()
            );
            break;
        }
        // Unless the swap came in between, the old one still works.
        if !ok(OLD).await {
            assert!(ok(NEW).await, "neither the old nor the new value worked");
            break;
        }
        assert!(
            written.elapsed() < Duration::from_secs(10),
            "not rotated within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        written.elapsed() < Duration::from_secs(10),
        "{:?}",
        written.elapsed()
    );
    assert!(ok(NEW).await && !ok(OLD).await);
    assert!(
        captured_logs().contains("admin token rotated"),
        "the rotation is logged"
    );

    std::fs::write(&file, "").unwrap();
    eventually("an empty file counted", Duration::from_secs(10), || async {
        reload_errors(&app).await >= 1
    })
    .await;
    assert!(ok(NEW).await, "an empty file keeps the last good value");
    std::fs::remove_file(&file).unwrap();
    let before = reload_errors(&app).await;
    eventually(
        "a missing file counted",
        Duration::from_secs(10),
        || async { reload_errors(&app).await > before },
    )
    .await;
    assert!(ok(NEW).await && !ok(OLD).await);
    assert!(captured_logs().contains("admin token file unusable; keeping its last good value"));
}

async fn reload_errors(app: &TestApp) -> u64 {
    let text = app.get_admin_without_token(METRICS).await.text;
    reload_errors_in(&text, "rotating")
}

fn check_config(toml: &str, dir: &std::path::Path) -> (Option<i32>, String) {
    std::fs::write(dir.join("gw.toml"), toml).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_phones-gateway"));
    for (name, _) in std::env::vars() {
        if name.starts_with("PHONES_GATEWAY") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    let output = command
        .args(["check-config", "--config", "gw.toml"])
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    crate::support::scan("check-config stderr", &stderr);
    crate::support::scan(
        "check-config stdout",
        &String::from_utf8_lossy(&output.stdout),
    );
    (output.status.code(), stderr)
}

/// `check-config` refuses bad tokens naming the key, never the value.
#[test]
fn bad_tokens_are_refused_at_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let entry = |name: &str, value: &str, scopes: &str| {
        format!("[[admin.tokens]]\nname = \"{name}\"\n{value}\nscopes = {scopes}\n")
    };
    let missing = dir.path().join("missing");
    let cases = [
        (
            entry("a", &format!("token = \"{OLD}\""), "[\"statuses:wrote\"]"),
            "admin.tokens[0].scopes",
        ),
        (
            entry("a", &format!("token = \"{OLD}\""), "[]")
                + &entry("a", &format!("token = \"{NEW}\""), "[]"),
            "admin.tokens[1].name",
        ),
        (
            entry("a", &format!("token = \"{OLD}\""), "[]")
                + &entry("b", &format!("token = \"{OLD}\""), "[]"),
            "admin.tokens[1].token",
        ),
        (
            entry("a", &format!("token_file = {missing:?}"), "[]"),
            "admin.tokens[0].token_file",
        ),
    ];
    for (toml, key) in cases {
        let (code, stderr) = check_config(&toml, dir.path());
        assert_eq!(code, Some(2), "{toml}: {stderr}");
        assert!(stderr.contains(key), "{key} not named: {stderr}");
        assert!(!stderr.contains(OLD) && !stderr.contains(NEW), "{stderr}");
    }
    let (code, stderr) = check_config(
        &entry(
            "a",
            &format!("token = \"{OLD}\""),
            "[\"statuses:read\", \"debug\"]",
        ),
        dir.path(),
    );
    assert_eq!(code, Some(0), "{stderr}");
}

pub const FILE_OLD: &str = "tok-file-old-8d2e5a";
pub const FILE_NEW: &str = "tok-file-new-3b7c91";

/// `path` written as an editor or kubelet writes it: a new file moved over.
fn replace_file(path: &std::path::Path, contents: &str) {
    let staged = path.with_extension("staged");
    std::fs::write(&staged, contents).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

fn reload_errors_in(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("phones_gateway_admin_token_reload_errors_total")
                && l.contains(&format!("name=\"{name}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// docs/admin-access.md, "Rotation", on the binary: the value is trimmed; one
/// no header can carry, or none, keeps the last good one and says so.
#[tokio::test]
async fn whitespace_around_a_token_file_s_value_is_not_part_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{FILE_OLD}\n")).unwrap();
    let url = format!("sqlite://{}/gw.db", dir.path().display());
    let tokens = format!(
        "[{{name=\"rotating\",token_file={:?},scopes=[\"statuses:read\"]}}]",
        file.display().to_string()
    );
    let process = Process::start_with(&url, &[("ADMIN__TOKENS", &tokens)]).await;
    let path = status_path(42);
    let status = |token: &'static str| {
        let (process, path) = (&process, &path);
        async move {
            process
                .http
                .get(format!("{}{path}", process.admin))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status(FILE_OLD).await, 200);
    assert_eq!(status(FILE_NEW).await, 401);

    replace_file(&file, &format!("\n  {FILE_NEW} \r\n\n\n"));
    let written = Instant::now();
    // Once the old value fails, the new one must work.
    while status(FILE_OLD).await == 200 {
        assert!(
            written.elapsed() < Duration::from_secs(10),
            "not rotated within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status(FILE_NEW).await,
        200,
        "neither the old nor the new value works: the whitespace around the \
         file's value was taken as part of the token"
    );
    assert_eq!(status(FILE_OLD).await, 401);

    // A space inside the value: no header carries it as one token.
    replace_file(&file, &format!("{FILE_OLD} {FILE_NEW}\n"));
    let logged = process
        .child
        .logged(
            "admin token file unusable; keeping its last good value",
            &["token", "reason"],
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(logged[0], "rotating");
    assert!(logged[1].contains("cannot carry"), "{logged:?}");
    assert!(
        !logged[1].contains(FILE_OLD) && !logged[1].contains(FILE_NEW),
        "the reason never quotes the value: {logged:?}"
    );
    let errors = reload_errors_in(&process.get_admin(METRICS).await.text, "rotating");
    assert!(errors >= 1, "{errors}");
    assert_eq!(status(FILE_NEW).await, 200, "the last good value is kept");

    replace_file(&file, "\n \n");
    eventually(
        "the emptied file counted",
        Duration::from_secs(10),
        || async { reload_errors_in(&process.get_admin(METRICS).await.text, "rotating") > errors },
    )
    .await;
    assert_eq!(status(FILE_NEW).await, 200, "the last good value is kept");
    assert_eq!(status(FILE_OLD).await, 401);
}

/// `check-config` refuses a token file value no header can carry, naming the
/// key, never the value; a configured token is verbatim, so a line end fails.
#[test]
fn a_token_file_a_header_cannot_carry_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let toml = format!(
        "[[admin.tokens]]\nname = \"a\"\ntoken_file = {:?}\nscopes = []\n",
        file.display().to_string()
    );
    for contents in [
        format!("{FILE_OLD} {FILE_NEW}\n"),
        format!("{FILE_OLD}\t{FILE_NEW}"),
        format!("{FILE_OLD}\u{7}"),
        format!("{FILE_OLD}é"),
        "\n\n  \n".to_owned(),
    ] {
        std::fs::write(&file, &contents).unwrap();
        let (code, stderr) = check_config(&toml, dir.path());
        assert_eq!(code, Some(2), "{contents:?} accepted: {stderr}");
        assert!(
            stderr.contains("admin.tokens[0].token_file"),
            "the key not named: {stderr}"
        );
        assert!(!stderr.contains(FILE_OLD), "{stderr}");
    }
    std::fs::write(&file, format!("\n\n {FILE_OLD}  \r\n\n")).unwrap();
    let (code, stderr) = check_config(&toml, dir.path());
    assert_eq!(code, Some(0), "{stderr}");

    let (code, stderr) = check_config(&format!("[admin]\ntoken = \"{FILE_OLD}\\n\"\n"), dir.path());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("admin.token"), "{stderr}");
    assert!(!stderr.contains(FILE_OLD), "{stderr}");
}
