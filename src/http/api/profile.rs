//! CPU profiling on demand, behind the admin token (docs/api.md): `pprof` samples
//! every thread at 99 Hz for N seconds and answers an SVG flamegraph or the top
//! functions. One profile at a time (409 while one runs).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::RawQuery;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

const SAMPLE_HZ: i32 = 99;
const MAX_SECONDS: u64 = 60;
const TOP_LINES: usize = 30;

static RUNNING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[utoipa::path(
    get,
    path = super::paths::PROFILE,
    tag = "admin",
    security(("bearer" = [])),
    params(
        ("seconds" = Option<u32>, Query, minimum = 1, maximum = 60, description = "How long to sample (default 10)"),
        ("format" = Option<String>, Query, description = "flamegraph (SVG, default) or top (text)"),
    ),
    responses(
        (status = 200, description = "A flamegraph (image/svg+xml) or a text list (text/plain)", body = String, content_type = "image/svg+xml"),
        (status = 400, description = "A bad parameter", body = super::error::Problem),
        (status = 401, description = "No or a wrong token", body = super::error::Problem),
        (status = 409, description = "A profile is already being taken", body = super::error::Problem),
    )
)]
pub async fn profile(RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    let mut seconds = 10;
    let mut top = false;
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*key {
            "seconds" => {
                seconds = value
                    .parse()
                    .ok()
                    .filter(|s| (1..=MAX_SECONDS).contains(s))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "seconds: must be an integer in 1..={MAX_SECONDS}"
                        ))
                    })?;
            }
            "format" => match &*value {
                "flamegraph" => top = false,
                "top" => top = true,
                _ => return Err(ApiError::bad_request("format: must be flamegraph or top")),
            },
            _ => {}
        }
    }
    let Ok(_running) = RUNNING.try_lock() else {
        return Err(ApiError::Conflict("a profile is already being taken"));
    };
    // The profiler guard is not Send: sample on a blocking thread.
    let rendered = tokio::task::spawn_blocking(move || render(Duration::from_secs(seconds), top))
        .await
        .map_err(|_| ApiError::Unavailable {
            detail: "the profiler failed",
        })?
        .map_err(|e| {
            tracing::error!(error = %e, "profiling failed");
            ApiError::Unavailable {
                detail: "the profiler failed",
            }
        })?;
    let content_type = if top {
        "text/plain; charset=utf-8"
    } else {
        "image/svg+xml"
    };
    Ok(([(header::CONTENT_TYPE, content_type)], rendered).into_response())
}

fn render(duration: Duration, top: bool) -> Result<Vec<u8>, pprof::Error> {
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(SAMPLE_HZ)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()?;
    std::thread::sleep(duration);
    let report = guard.report().build()?;
    if !top {
        if report.data.is_empty() {
            // An idle process takes no CPU samples; say so rather than answer nothing.
            let text = format!(
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"40\">\
                 <text x=\"10\" y=\"25\">no CPU samples in {duration:?}: the process was idle</text></svg>"
            );
            return Ok(text.into_bytes());
        }
        let mut svg = Vec::new();
        report.flamegraph(&mut svg)?;
        return Ok(svg);
    }
    let mut own: HashMap<String, isize> = HashMap::new();
    let mut total = 0;
    for (frames, count) in &report.data {
        total += count;
        // The innermost frame; its symbols run from the innermost inlined
        // function to the function the code physically belongs to. Name both.
        let leaf = frames.frames.first().map_or_else(
            || "unknown".to_owned(),
            |inlined| match (inlined.first(), inlined.last()) {
                (Some(inner), Some(outer)) if inlined.len() > 1 => {
                    format!("{} (inlined: {})", outer.name(), inner.name())
                }
                (Some(only), _) => only.name(),
                _ => "unknown".to_owned(),
            },
        );
        *own.entry(leaf).or_default() += count;
    }
    let mut rows: Vec<_> = own.into_iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1));
    let mut text = format!(
        "{total} samples over {duration:?} at {SAMPLE_HZ} Hz; own samples per function (the function the code belongs to, and the innermost inlined one):\n"
    );
    for (name, count) in rows.into_iter().take(TOP_LINES) {
        let share = 100.0 * count as f64 / total.max(1) as f64;
        let _ = writeln!(text, "{count:>8} {share:>6.2}%  {name}");
    }
    Ok(text.into_bytes())
}
