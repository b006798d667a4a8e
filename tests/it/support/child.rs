//! The `phones-gateway` binary as a child process, its output captured: every
//! line goes through the privacy scanner, and the addresses it bound (port 0)
//! are read back from its "listening" line.

use std::io::BufRead;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::app::{Answer, bearer, get_with};
use super::paths::{READYZ, STATUSES, status_path};
use super::privacy::{assert_no_leaks, scan};
use super::{TOKEN, eventually};

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

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The values of `fields` in the first line logged with `message`,
    /// waiting up to `limit`.
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
    /// Stops the process, reads its output to the end, and fails the test on
    /// any full number so far.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        if std::thread::panicking() {
            // Its WARN and ERROR lines and upstream calls, for the report.
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

/// The real binary, started as operators start it, logging JSON at trace
/// level into the privacy scanner.
pub struct Process {
    pub child: Spawned,
    pub public: String,
    pub admin: String,
    /// The probe listener's URL, when `SERVER__PROBE_ADDR` is set.
    pub probe: Option<String>,
    pub http: reqwest::Client,
}

impl Process {
    pub async fn start(database_url: &str) -> Process {
        Self::start_with(database_url, &[]).await
    }

    /// Starts the binary with extra `PHONES_GATEWAY__*` settings, listeners on
    /// port 0.
    pub async fn start_with(database_url: &str, env: &[(&str, &str)]) -> Process {
        Self::start_under(&[], database_url, env).await
    }

    /// As [`Process::start_with`], run by `wrapper` (a command and its
    /// arguments, as `prlimit --nofile=256:256`); none: the binary itself.
    pub async fn start_under(
        wrapper: &[&str],
        database_url: &str,
        env: &[(&str, &str)],
    ) -> Process {
        let binary = env!("CARGO_BIN_EXE_phones-gateway");
        let mut command = match wrapper.split_first() {
            Some((program, arguments)) => {
                let mut command = Command::new(program);
                command.args(arguments).arg("--").arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command
            .arg("serve")
            .env("PHONES_GATEWAY__SERVER__PUBLIC_ADDR", "127.0.0.1:0")
            .env("PHONES_GATEWAY__SERVER__ADMIN_ADDR", "127.0.0.1:0")
            .env("PHONES_GATEWAY__ADMIN__TOKEN", TOKEN)
            .env("PHONES_GATEWAY__DATABASE__URL", database_url)
            .env("PHONES_GATEWAY__LOG__FILTER", "phones_gateway=trace,info")
            .env("PHONES_GATEWAY__LOG__FORMAT", "json")
            // Cold admission off, as in TestApp's base config (overload.rs
            // tests it); `env` may set it again.
            .env("PHONES_GATEWAY__SERVER__MAX_QUEUE_DELAY_MS", "0")
            .env_remove("RUST_LOG");
        for (key, value) in env {
            command.env(format!("PHONES_GATEWAY__{key}"), value);
        }
        let child = Spawned::spawn(command, "phones-gateway serve");
        let limit = Duration::from_secs(30);
        let addrs = child
            .logged("listening", &["public", "admin", "probe"], limit)
            .await;
        let (public, admin, probe) = (&addrs[0], &addrs[1], &addrs[2]);
        let process = Process {
            child,
            public: format!("http://{public}"),
            admin: format!("http://{admin}"),
            probe: (probe != "off").then(|| format!("http://{probe}")),
            http: crate::support::client(),
        };
        let ready = format!("{}{READYZ}", process.admin);
        eventually("the process to become ready", limit, || async {
            let got = process.http.get(&ready).send().await;
            got.is_ok_and(|r| r.status() == 200)
        })
        .await;
        process
    }

    pub async fn get_public_with(&self, path_and_query: &str, headers: &[(&str, &str)]) -> Answer {
        get_with(&self.http, &self.public, path_and_query, headers).await
    }

    /// A GET on the admin listener with the token.
    pub async fn get_admin(&self, path: &str) -> Answer {
        get_with(
            &self.http,
            &self.admin,
            path,
            &[("authorization", &bearer())],
        )
        .await
    }

    /// Turns call tracking on for every seller of `users`; panics unless 200.
    pub async fn track(&self, users: impl IntoIterator<Item = u64>) {
        for body in super::tracking(users) {
            assert_eq!(self.send(reqwest::Method::POST, body).await, 200);
        }
    }

    pub async fn send(&self, method: reqwest::Method, body: serde_json::Value) -> u16 {
        self.http
            .request(method, format!("{}{STATUSES}", self.admin))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    pub async fn status(&self, user: u64) -> serde_json::Value {
        let response = self
            .http
            .get(format!("{}{}", self.admin, status_path(user)))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        serde_json::from_str(&response.text().await.unwrap()).unwrap()
    }

    pub fn sigterm(mut self) -> std::process::ExitStatus {
        self.child.sigterm()
    }

    pub fn sigkill(mut self) {
        self.child.kill();
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
