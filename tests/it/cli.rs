//! The binary's command line as operators meet it: `check-config` and a start
//! with a bad configuration (every mistake in one run, keys as documented, the
//! file's absolute path, no backtrace), mistyped environment prefixes, and log
//! lines without colour when they do not go to a terminal.

use std::process::{Command, Output};

use crate::support::scan;

fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_phones-gateway"));
    // The settings of whoever runs the tests are not the test's.
    for (name, _) in std::env::vars() {
        if name.starts_with("PHONES_GATEWAY") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    command
}

/// Runs `command` to its end with stdout and stderr to pipes; both are scanned
/// for phone numbers like every other log.
fn run(mut command: Command, name: &str) -> (Output, String, String) {
    let output = command.output().expect("the binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    scan(&format!("{name} stdout"), &stdout);
    scan(&format!("{name} stderr"), &stderr);
    (output, stdout, stderr)
}

#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = binary();
    command
        .arg("migrate")
        .env(
            "PHONES_GATEWAY__DATABASE__URL",
            format!("sqlite://{}/gateway.db", dir.path().display()),
        )
        .env("PHONES_GATEWAY__LOG__FORMAT", "text");
    let (output, stdout, stderr) = run(command, "phones-gateway migrate");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("migrations applied"), "{stdout}\n{stderr}");
    for (stream, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !text.contains("\x1b["),
            "escape codes on {stream}: {text:?}"
        );
    }
}

/// A file with three mistakes: an unknown key, a value of the wrong type, a
/// value out of range.
const THREE_MISTAKES: &str = "[server]\npublic_adr = \"0.0.0.0:1\"\n\
    [upstreams.real_phone]\ntimeout_ms = \"fast\"\n\
    [cache.anonymous]\ncapacity = 0\n";
const THREE_KEYS: [&str; 3] = [
    "server.public_adr",
    "upstreams.real_phone.timeout_ms",
    "cache.anonymous.capacity",
];

/// `command` (`check-config` or `serve`) on [`THREE_MISTAKES`], given by a path
/// relative to where it runs, with `RUST_BACKTRACE=1`: one run names all three
/// keys as documented (no figment profile), the file by its absolute path, and
/// prints no backtrace.
fn names_every_mistake_at_once(command: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gw.toml"), THREE_MISTAKES).unwrap();
    let mut binary = binary();
    binary
        .args([command, "--config", "gw.toml"])
        .current_dir(dir.path())
        .env("RUST_BACKTRACE", "1")
        .env(
            "PHONES_GATEWAY__DATABASE__URL",
            format!("sqlite://{}/gateway.db", dir.path().display()),
        );
    let (output, stdout, stderr) = run(binary, &format!("phones-gateway {command}"));
    assert_eq!(output.status.code(), Some(2), "{stdout}\n{stderr}");
    for key in THREE_KEYS {
        assert!(stderr.contains(key), "{key} not named: {stderr}");
    }
    assert!(!stderr.contains("default."), "{stderr}");
    let absolute = dir.path().join("gw.toml").display().to_string();
    assert!(
        stderr.contains(&format!("(in {absolute})")),
        "no {absolute}: {stderr}"
    );
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
    assert!(!stderr.contains("  0: "), "a backtrace: {stderr}");
}

#[test]
fn check_config_names_every_mistake_in_one_run() {
    names_every_mistake_at_once("check-config");
}

#[test]
fn a_start_with_a_bad_configuration_names_every_mistake_in_one_run() {
    names_every_mistake_at_once("serve");
}

#[test]
fn check_config_warns_of_a_mistyped_environment_prefix() {
    let mut command = binary();
    command
        .arg("check-config")
        .env("PHONES_GATEWAY_ADMIN__TOKEN", "not-read-0123456789");
    let (output, stdout, stderr) = run(command, "phones-gateway check-config");
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("warning: environment variable PHONES_GATEWAY_ADMIN__TOKEN is not read"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("not-read-0123456789"),
        "the value: {stderr}"
    );
}

#[tokio::test]
async fn a_start_warns_of_a_mistyped_environment_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = binary();
    command
        .arg("serve")
        .env("PHONES_GATEWAY__SERVER__PUBLIC_ADDR", "127.0.0.1:0")
        .env("PHONES_GATEWAY__SERVER__ADMIN_ADDR", "127.0.0.1:0")
        .env(
            "PHONES_GATEWAY__DATABASE__URL",
            format!("sqlite://{}/gateway.db", dir.path().display()),
        )
        .env("PHONES_GATEWAY__LOG__FORMAT", "json")
        .env("PHONES_GATEWAY_ADMIN__TOKEN", "not-read-0123456789");
    let child = crate::support::child::Spawned::spawn(command, "phones-gateway serve");
    let named = child
        .logged(
            "environment variable not read: overrides start with PHONES_GATEWAY__",
            &["variable"],
            std::time::Duration::from_secs(30),
        )
        .await;
    assert_eq!(named, ["PHONES_GATEWAY_ADMIN__TOKEN"]);
}
