//! Child processes (the `phones-gateway` binary, as operators run it) with their
//! output captured: every line of stdout and stderr goes through the privacy
//! scanner, and the addresses they bound (port 0) are read back from their
//! "listening" line, so no port is guessed free and taken later.

use std::io::BufRead;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{assert_no_leaks, scan};

pub struct Spawned {
    child: Child,
    lines: mpsc::Receiver<String>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Spawned {
    /// Spawns `command` with stdout and stderr captured and scanned as `name`.
    pub fn spawn(mut command: Command, name: &str) -> Spawned {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let (sender, lines) = mpsc::channel();
        let mut readers = Vec::new();
        let stdout: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for (stream, output) in [("stdout", stdout), ("stderr", stderr)] {
            let (sender, source) = (sender.clone(), format!("{name} {stream}"));
            readers.push(std::thread::spawn(move || {
                for line in std::io::BufReader::new(output).lines() {
                    let Ok(line) = line else { break };
                    let line = without_ansi(&line);
                    scan(&source, &line);
                    let _ = sender.send(line);
                }
            }));
        }
        Spawned {
            child,
            lines,
            readers,
        }
    }

    /// The values of `fields` in the first line logged with `message` (JSON or
    /// text format), waiting up to `limit`.
    pub async fn logged(&self, message: &str, fields: &[&str], limit: Duration) -> Vec<String> {
        let start = Instant::now();
        loop {
            while let Ok(line) = self.lines.try_recv() {
                let values: Option<Vec<String>> = fields
                    .iter()
                    .map(|field| field_of(&line, message, field))
                    .collect();
                if let Some(values) = values {
                    return values;
                }
            }
            assert!(
                start.elapsed() < limit,
                "no {message:?} line within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The lines written since the last look (or the start), in order.
    pub fn lines_so_far(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// SIGKILL on Unix: no clean shutdown.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then the exit status.
    pub fn sigterm(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.child.wait().unwrap()
    }
}

/// `line` without ANSI colour escapes (the text format colours its output).
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn field_of(line: &str, message: &str, field: &str) -> Option<String> {
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(line) {
        let fields = &json["fields"];
        return (fields["message"] == message)
            .then(|| fields[field].as_str().map(str::to_owned))
            .flatten();
    }
    let (_, after) = line.split_once(&format!(": {message} "))?;
    let (_, value) = after.split_once(&format!("{field}="))?;
    Some(value.split_whitespace().next()?.to_owned())
}

impl Drop for Spawned {
    /// Stops the process, reads its output to the end, and fails the test if
    /// any line of it (or of anything else so far) held a full number.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            // What the process said last, for the failure's report: its WARN
            // and ERROR lines and the upstream calls (its log never holds a
            // full number; the scan above checks that on every passing run).
            let lines: Vec<String> = self
                .lines
                .try_iter()
                .filter(|l| {
                    ["WARN", "ERROR", "upstream", "resolve"]
                        .iter()
                        .any(|w| l.contains(w))
                })
                .collect();
            eprintln!("--- the process's last log lines ---");
            for line in &lines[lines.len().saturating_sub(60)..] {
                eprintln!("{line}");
            }
        } else {
            assert_no_leaks();
        }
    }
}

#[test]
fn listening_lines_are_read_in_both_formats() {
    let json = r#"{"timestamp":"x","level":"INFO","fields":{"message":"listening","public":"127.0.0.1:1","admin":"127.0.0.1:2"}}"#;
    assert_eq!(
        field_of(json, "listening", "admin").as_deref(),
        Some("127.0.0.1:2")
    );
    let text = "2026-01-01T00:00:00Z  INFO phones_gateway: simulator listening addr=127.0.0.1:3";
    assert_eq!(
        field_of(text, "simulator listening", "addr").as_deref(),
        Some("127.0.0.1:3")
    );
    assert_eq!(field_of(text, "listening", "addr"), None);
    let coloured = "\x1b[2mphones_gateway\x1b[0m\x1b[2m:\x1b[0m simulator listening \x1b[3maddr\x1b[0m\x1b[2m=\x1b[0m127.0.0.1:4";
    assert_eq!(
        field_of(&without_ansi(coloured), "simulator listening", "addr").as_deref(),
        Some("127.0.0.1:4")
    );
}
