//! The privacy scanner (docs/README.md#privacy): every log line the test
//! binary writes (text and JSON, trace level) is scanned as written, and every
//! full phone number or admin token value found is recorded; `TestApp`'s and
//! `Process`'s drop fail the test on any leak so far.

use std::sync::{Mutex, OnceLock};

/// Characters a number may be written with between its digits.
fn is_separator(c: char) -> bool {
    matches!(c, ' ' | '-' | '(' | ')' | '.' | '/')
}

/// `%XX` escapes decoded (lossy); other text kept as is.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        let escape = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| Some(hex(bytes[i + 1])? * 16 + hex(bytes[i + 2])?))
            .flatten();
        match escape {
            Some(byte) => {
                out.push(byte as u8);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The full phone numbers in one log line, as written and percent-decoded:
/// `+` then 8 or more digits (separators allowed), a fixture number's digits
/// (`crate::NUMBERS`), a mask showing more than the last two digits; and any
/// admin token value (`crate::SECRETS`), named by its index, never quoted.
pub fn leaks_in(line: &str) -> Vec<String> {
    let decoded = percent_decoded(line);
    let mut found = Vec::new();
    for (i, secret) in crate::SECRETS.iter().enumerate() {
        if line.contains(secret) || decoded.contains(secret) {
            found.push(format!("admin token value SECRETS[{i}]"));
        }
    }
    for text in [line, decoded.as_str()] {
        let mut chars: Vec<char> = text.chars().collect();
        // A lone `*` is an operator (as in SQL sqlx logs), not a mask: a
        // mask's stars touch each other or the digits they hide.
        let part_of_mask = |c: Option<&char>| c.is_some_and(|c| c.is_ascii_digit() || *c == '*');
        for k in 0..chars.len() {
            if chars[k] == '*'
                && !part_of_mask(k.checked_sub(1).and_then(|b| chars.get(b)))
                && !part_of_mask(chars.get(k + 1))
            {
                chars[k] = ' ';
            }
        }
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if !(c.is_ascii_digit() || c == '*' || c == '+') {
                i += 1;
                continue;
            }
            let mut run = String::new();
            if c == '+' {
                run.push('+');
                i += 1;
            }
            loop {
                if i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '*') {
                    run.push(chars[i]);
                    i += 1;
                    continue;
                }
                let mut j = i;
                while j < chars.len() && is_separator(chars[j]) {
                    j += 1;
                }
                let continues = j > i
                    && j < chars.len()
                    && (chars[j].is_ascii_digit() || chars[j] == '*')
                    && run.len() > usize::from(run.starts_with('+'));
                if !continues {
                    break;
                }
                i = j;
            }
            let digits: String = run.chars().filter(char::is_ascii_digit).collect();
            let masked = run.contains('*');
            let leak = if masked {
                digits.len() > 2
            } else {
                (run.starts_with('+') && digits.len() >= 8)
                    || crate::NUMBERS
                        .iter()
                        .any(|n| digits.contains(n.trim_start_matches('+')))
            };
            if leak && !found.contains(&run) {
                found.push(run);
            }
        }
    }
    found
}

/// Every full number found so far, with where.
static LEAKS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Everything the test binary logged (text format).
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Scans `text` line by line and records any leak, naming `source`.
pub fn scan(source: &str, text: &str) {
    for line in text.lines() {
        let leaks = leaks_in(line);
        if !leaks.is_empty() {
            LEAKS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(format!("{source}: {leaks:?} in {line:?}"));
        }
    }
}

/// Fails the calling test if any log line so far, by any test, held a full
/// number. Leaks are never cleared: every later check fails too.
#[track_caller]
pub fn assert_no_leaks() {
    let leaks = LEAKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert!(
        leaks.is_empty(),
        "full phone numbers in the logs: {leaks:#?}"
    );
}

/// Everything the app logged in this test binary so far, text format.
pub fn captured_logs() -> String {
    String::from_utf8_lossy(
        &LOGS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned()
}

/// One event's output, scanned when the formatter is done with it.
struct ScanningWriter {
    json: bool,
    buffer: Vec<u8>,
}

impl std::io::Write for ScanningWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ScanningWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buffer);
        let thread = std::thread::current();
        let source = format!(
            "{} log of thread {}",
            if self.json { "json" } else { "text" },
            thread.name().unwrap_or("?")
        );
        scan(&source, &text);
        if !self.json {
            LOGS.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(&self.buffer);
        }
    }
}

/// Both production formats, the crate at trace level, every line scanned.
pub(super) fn init_logs() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let text = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(|| ScanningWriter {
                json: false,
                buffer: Vec::new(),
            });
        let json = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(|| ScanningWriter {
                json: true,
                buffer: Vec::new(),
            });
        let _ = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new(
                "phones_gateway=trace,info",
            ))
            .with(text)
            .with(json)
            .try_init();
    });
}

#[test]
fn the_scanner_finds_numbers_in_every_disguise() {
    assert_eq!(
        leaks_in(&format!("authorization=Bearer {}", crate::SECRETS[1])),
        ["admin token value SECRETS[1]"],
        "a token value is a leak too"
    );
    let finds = |line: &str| !leaks_in(line).is_empty();
    // With `+` and the separators input may use, and more.
    assert_eq!(leaks_in("a +7 916 123-45-67 b"), ["+79161234567"]);
    assert!(finds("+7(916)1234567"));
    assert!(finds("phone=+7.916.123.45.67"));
    assert!(finds("phone=+7/916/123/45/67"));
    assert!(finds("+12345678")); // any number, not only fixtures
    // A fixture's digits without `+`, alone or in a longer run.
    assert!(finds(
        "invalid type: integer `79161234567`, expected a string"
    ));
    assert!(finds("user=1 phone=74951234567 x"));
    assert!(finds("7-916-123-45-67"));
    // Percent-encoded, as the call-tracking URL carries it.
    assert!(finds(
        "GET /v1/virtual-numbers?user_id=1&phone=%2B79161234567"
    ));
    assert!(finds("%2B12345678901"));
    // A mask that shows more than the last two digits.
    assert!(finds("phone=+*******4567"));
    assert!(finds("phone=7916*****67"));
    assert!(finds("+7916*****67"));
    assert!(finds(r#"{"fields":{"phone":"+79161234567"}}"#));
}

#[test]
fn the_scanner_lets_masks_ids_and_times_pass() {
    for line in [
        "phone=+*********67 user_id=42 ad_id=1001",
        r#"{"timestamp":"2026-11-23T10:00:00.123456Z","level":"DEBUG","fields":{"phone":"+*********67"}}"#,
        "2026-11-23T10:00:00.123456789Z DEBUG request{id=0123456789abcdef}: took 12.5ms",
        "+123 +1234567 and user 9223372036854775807",
        "listening on 127.0.0.1:41234",
        "slow statement: WHERE at_us < (EXTRACT(EPOCH FROM now()) * 1000000)::int8 - $1",
    ] {
        assert_eq!(leaks_in(line), Vec::<String>::new(), "{line}");
    }
}
