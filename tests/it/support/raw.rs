//! Both ends of HTTP/1.1 on a bare socket, for what a client library would
//! hide or refuse: `RawServer`, an upstream showing what arrives on the wire
//! and answering as a well-behaved server would not; `raw_request`, a client
//! writing any bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::REAL;

/// What the raw server answers to every request.
#[derive(Clone, Copy)]
pub enum RawReply {
    /// 200 with a phone, keep-alive.
    Phone,
    /// 200 with a phone padded to 8 MiB (valid JSON: only the bound refuses).
    Huge,
    /// 200 with its head at once and the body one byte every 100 ms.
    Trickle,
    /// 302 to the same server.
    Redirect,
}

/// An upstream on a bare socket: counts connections, keeps request heads.
pub struct RawServer {
    pub url: String,
    connections: Arc<Mutex<usize>>,
    heads: Arc<Mutex<Vec<String>>>,
}

impl RawServer {
    pub async fn start(reply: RawReply) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(Mutex::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (count, seen, location) = (connections.clone(), heads.clone(), url.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                *count.lock().unwrap() += 1;
                tokio::spawn(serve(stream, reply, seen.clone(), location.clone()));
            }
        });
        RawServer {
            url,
            connections,
            heads,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        *self.connections.lock().unwrap()
    }

    /// The request heads read so far, in order.
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn serve(
    mut stream: TcpStream,
    reply: RawReply,
    heads: Arc<Mutex<Vec<String>>>,
    url: String,
) {
    let mut buffer = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let Ok(n) = stream.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buffer.extend_from_slice(&chunk[..n]);
        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
            buffer.drain(..end + 4);
            heads.lock().unwrap().push(head);
            let ok = match reply {
                RawReply::Phone => {
                    let body = format!("{{\"phone\":\"{REAL}\"}}");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    stream.write_all(answer.as_bytes()).await.is_ok()
                }
                RawReply::Huge => {
                    let head = "HTTP/1.1 200 OK\r\ncontent-length: 8388608\r\n\r\n";
                    let phone = format!("{{\"phone\":\"{REAL}\"}}");
                    let mut first = vec![b' '; 64 * 1024];
                    first[..phone.len()].copy_from_slice(phone.as_bytes());
                    if stream.write_all(head.as_bytes()).await.is_err()
                        || stream.write_all(&first).await.is_err()
                    {
                        return;
                    }
                    let block = vec![b' '; 64 * 1024];
                    for _ in 1..128 {
                        if stream.write_all(&block).await.is_err() {
                            return;
                        }
                    }
                    true
                }
                RawReply::Trickle => {
                    let body = format!("{{\"phone\":\"{REAL}\"}}");
                    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    for byte in body.bytes() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if stream.write_all(&[byte]).await.is_err() {
                            return;
                        }
                    }
                    true
                }
                RawReply::Redirect => {
                    let answer = format!(
                        "HTTP/1.1 302 Found\r\nlocation: {url}/v1/users/1/phone?ad_id=1\r\ncontent-length: 0\r\n\r\n"
                    );
                    stream.write_all(answer.as_bytes()).await.is_ok()
                }
            };
            if !ok {
                return;
            }
        }
    }
}

/// An answer off a bare socket: status, headers (lower case) and body text.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl RawAnswer {
    /// Asserts a whole problem document with this status (content type, a
    /// matching `content-length`, `title` and `status`).
    #[track_caller]
    pub fn assert_problem(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.headers.get("content-type").map(String::as_str),
            Some("application/problem+json"),
            "{self:?}"
        );
        assert_eq!(
            self.headers.get("content-length"),
            Some(&self.body.len().to_string()),
            "{self:?}"
        );
        let problem: Value = serde_json::from_str(&self.body).unwrap_or(Value::Null);
        assert_eq!(problem["status"], status, "{self:?}");
        assert!(problem["title"].is_string(), "{self:?}");
        problem
    }
}

/// Writes `request` on a fresh connection to `base` and reads the answer until
/// the server closes (parsed requests should say `connection: close`).
pub async fn raw_request(base: &str, request: &[u8]) -> RawAnswer {
    let mut stream = TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    // The server may answer and close before reading everything.
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "no end of answer: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&answer)));
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    RawAnswer {
        status,
        headers,
        body: String::from_utf8_lossy(&answer[end + 4..]).into_owned(),
    }
}

/// `METHOD path HTTP/1.1` with `extra` header lines and `connection: close`.
pub fn raw_head(method: &str, path: &str, extra: &str) -> Vec<u8> {
    format!("{method} {path} HTTP/1.1\r\nhost: x\r\n{extra}connection: close\r\n\r\n").into_bytes()
}

pub fn raw_get(path: &str, extra: &str) -> Vec<u8> {
    raw_head("GET", path, extra)
}
