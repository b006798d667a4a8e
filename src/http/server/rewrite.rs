//! Hyper's automatic answers (400, 414, 431, no body), rewritten as problem
//! documents (docs/api.md). Hyper writes them without calling our service and
//! offers no hook, so [`ProblemIo`] wraps the socket, recognises such a head as
//! it is written (no `content-type`: every answer of ours has one), and sends the
//! same status line with a problem document instead. A normal write pays one
//! comparison. Limit: a head behind an unsent pipelined answer stays bare.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::api::error::ApiError;

/// A connection's IO that rewrites hyper's automatic error answers.
pub struct ProblemIo<T> {
    inner: T,
    /// The problem-document limit, for the 431's detail.
    max_header_bytes: usize,
    /// A rewritten answer not yet fully sent.
    pending: Bytes,
}

impl<T> ProblemIo<T> {
    pub fn new(inner: T, max_header_bytes: usize) -> Self {
        ProblemIo {
            inner,
            max_header_bytes,
            pending: Bytes::new(),
        }
    }
}

impl<T: AsyncWrite + Unpin> ProblemIo<T> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending = self.pending.slice(n..);
        }
        Poll::Ready(Ok(()))
    }

    /// `buf` is hyper's automatic head: queue its rewrite and report `buf` as written.
    fn rewrite(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
        status: u16,
    ) -> Poll<io::Result<usize>> {
        self.pending = rewritten(buf, status, self.max_header_bytes).into();
        // Pending is fine here: flush and shutdown finish it, and a later write
        // waits for it.
        if let Poll::Ready(Err(error)) = self.poll_pending(cx) {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(buf.len()))
    }
}

/// The status of hyper's automatic error head if `buf` starts with one.
fn automatic_error(buf: &[u8]) -> Option<u16> {
    // "HTTP/1.1 4xx ": the first digit is the whole cost for a normal answer.
    if buf.len() < 13 || buf[9] != b'4' || !buf.starts_with(b"HTTP/1.") || buf[12] != b' ' {
        return None;
    }
    let status = match &buf[9..12] {
        b"400" => 400,
        b"414" => 414,
        b"431" => 431,
        _ => return None,
    };
    let end = find(buf, b"\r\n\r\n")?;
    let head = &buf[..end + 2];
    let has = |name: &[u8]| {
        head.windows(name.len())
            .any(|window| window.eq_ignore_ascii_case(name))
    };
    (has(b"\r\ncontent-length: 0\r\n") && !has(b"\r\ncontent-type:")).then_some(status)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Hyper's head `head` (recognised by [`automatic_error`]) as a problem document.
fn rewritten(head: &[u8], status: u16, max_header_bytes: usize) -> Vec<u8> {
    let error = match status {
        431 => ApiError::HeadersTooLarge(max_header_bytes),
        414 => ApiError::UriTooLong,
        _ => ApiError::bad_request("the request line or a header could not be parsed"),
    };
    let body = serde_json::to_vec(&error.problem()).unwrap_or_default();
    let end = find(head, b"\r\n\r\n").unwrap_or(head.len());
    let mut lines = head[..end]
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let mut out = Vec::with_capacity(end + 96 + body.len());
    let mut line = |text: &[u8]| {
        out.extend_from_slice(text);
        out.extend_from_slice(b"\r\n");
    };
    if let Some(status_line) = lines.next() {
        line(status_line);
    }
    line(b"content-type: application/problem+json");
    line(format!("content-length: {}", body.len()).as_bytes());
    let mut closes = false;
    for header in lines {
        let lower = header.to_ascii_lowercase();
        if lower.starts_with(b"content-length:") {
            continue;
        }
        closes |= lower.starts_with(b"connection: close");
        line(header);
    }
    if !closes {
        line(b"connection: close");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    out
}

impl<T: AsyncRead + Unpin> AsyncRead for ProblemIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ProblemIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some(status) = automatic_error(buf) {
            return this.rewrite(cx, buf, status);
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        // Hyper's automatic answer has no body: its head is the only slice.
        if let [head] = bufs {
            if let Some(status) = automatic_error(head) {
                return this.rewrite(cx, head, status);
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// What hyper 1.12 writes (captured from a socket).
    const HYPER_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Mon, 23 Nov 2026 05:31:54 GMT\r\n\r\n";

    async fn through(writes: &[&[u8]], vectored: bool) -> String {
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        let mut io = ProblemIo::new(near, 16384);
        for write in writes {
            if vectored {
                let n = io.write_vectored(&[io::IoSlice::new(write)]).await.unwrap();
                assert_eq!(n, write.len());
            } else {
                io.write_all(write).await.unwrap();
            }
        }
        io.shutdown().await.unwrap();
        let mut out = String::new();
        far.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn hyper_s_bare_431_becomes_a_problem_document() {
        for vectored in [false, true] {
            let out = through(&[HYPER_431], vectored).await;
            let (head, body) = out.split_once("\r\n\r\n").unwrap();
            let status = "HTTP/1.1 431 Request Header Fields Too Large\r\n";
            assert!(head.starts_with(status), "{out}");
            let length = format!("\r\ncontent-length: {}\r\n", body.len());
            let problem = "\r\ncontent-type: application/problem+json\r\n";
            let (close, date) = ("\r\nconnection: close\r\n", "\r\ndate: Mon, 23 Nov 2026");
            for part in [problem, length.as_str(), close, date] {
                assert!(head.contains(part), "{part:?}: {out}");
            }
            assert!(!head.contains("content-length: 0"), "{out}");
            let problem: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(problem["status"], 431);
            assert!(problem["detail"].as_str().unwrap().contains("16384"));
        }
    }

    #[tokio::test]
    async fn answers_of_ours_pass_unchanged() {
        let ours: &[&[u8]] = &[
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n",
            b"{}",
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ncontent-type: application/problem+json\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 4",
        ];
        for vectored in [false, true] {
            let expected = String::from_utf8(ours.concat()).unwrap();
            assert_eq!(through(ours, vectored).await, expected);
        }
    }

    #[test]
    fn recognises_each_automatic_status() {
        for (status, reason) in [(400, "Bad Request"), (414, "URI Too Long"), (431, "x")] {
            let head = format!(
                "HTTP/1.1 {status} {reason}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
            );
            assert_eq!(automatic_error(head.as_bytes()), Some(status));
            let out = rewritten(head.as_bytes(), status, 1);
            let text = String::from_utf8(out).unwrap();
            assert!(text.ends_with('}'), "{text}");
            assert_eq!(text.matches("connection: close").count(), 1, "{text}");
        }
    }
}
