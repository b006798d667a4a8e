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
