//! docs/tracing.md: W3C trace context continued to the upstreams, and OTLP
//! export to a collector the test runs (the `export_*` tests).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

use crate::support::child::Process;
use crate::support::paths::{BATCH, phone_path};
use crate::support::{Fake, Reply, TestApp, Traced, Upstream, eventually, leaks_in, read};
use crate::{ANON, ANON_CATEGORY, PLAIN_CATEGORY, REAL, VIRTUAL};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A `traceparent` as W3C level 1 writes it: (version, trace id, parent id, flags).
fn parse(traceparent: &str) -> (String, String, String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent:?}");
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    assert!(
        parts[0] == "00"
            && hex(parts[1], 32)
            && hex(parts[2], 16)
            && hex(parts[3], 2)
            && parts[1] != "0".repeat(32)
            && parts[2] != "0".repeat(16),
        "not a valid traceparent: {traceparent:?}"
    );
    (
        parts[0].to_owned(),
        parts[1].to_owned(),
        parts[2].to_owned(),
        parts[3].to_owned(),
    )
}

/// A seller with call tracking: one request makes two upstream calls.
async fn two_call_app() -> TestApp {
    let app = TestApp::spawn().await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.track(1..=10).await;
    app
}

#[tokio::test]
async fn a_callers_trace_is_continued_with_a_span_of_ours_per_upstream_call() {
    let app = two_call_app().await;
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    app.get_public_with(
        &phone_path(1, 1, PLAIN_CATEGORY),
        &[
            ("traceparent", &traceparent),
            ("tracestate", "vendor=opaque"),
            ("x-request-id", "req-trace-1"),
        ],
    )
    .await
    .assert_number(VIRTUAL, "calltracking");
    let calls: Vec<_> = app
        .real
        .traces()
        .into_iter()
        .chain(app.calltracking.traces())
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    let mut parents = Vec::new();
    for (traceparent, tracestate) in &calls {
        let (_, trace_id, parent, flags) = parse(traceparent);
        assert_eq!(trace_id, TRACE_ID, "the caller's trace");
        assert_ne!(
            parent, CALLER_SPAN,
            "the parent is our span, not the caller's"
        );
        assert_eq!(flags, "01", "the caller's sampled flag");
        assert_eq!(tracestate.as_deref(), Some("vendor=opaque"));
        parents.push(parent);
    }
    assert_ne!(parents[0], parents[1], "a span per upstream call");
    // The request id goes on beside it.
    assert_eq!(app.real.request_ids(), ["req-trace-1"]);
    assert_eq!(app.calltracking.request_ids(), ["req-trace-1"]);
    // The caller's unsampled flag is kept too.
    let unsampled = format!("00-{TRACE_ID}-{CALLER_SPAN}-00");
    app.get_public_with(
        &phone_path(2, 1, PLAIN_CATEGORY),
        &[("traceparent", &unsampled)],
    )
    .await
    .assert_number(VIRTUAL, "calltracking");
    let (traceparent, tracestate) = app.real.traces().pop().unwrap();
    let (_, trace_id, _, flags) = parse(&traceparent);
    assert_eq!((trace_id.as_str(), flags.as_str()), (TRACE_ID, "00"));
    assert_eq!(tracestate, None);
}

#[tokio::test]
async fn a_request_without_a_traceparent_starts_a_trace_of_its_own() {
    let app = two_call_app().await;
    for user in [1, 2] {
        app.get_public_with(&phone_path(user, 1, PLAIN_CATEGORY), &[])
            .await
            .assert_number(VIRTUAL, "calltracking");
    }
    let (real, calltracking) = (app.real.traces(), app.calltracking.traces());
    assert_eq!((real.len(), calltracking.len()), (2, 2));
    let ids = |calls: &[Traced]| -> Vec<(String, String)> {
        calls
            .iter()
            .map(|(traceparent, _)| {
                let (_, trace_id, parent, _) = parse(traceparent);
                (trace_id, parent)
            })
            .collect()
    };
    let (real, calltracking) = (ids(&real), ids(&calltracking));
    for request in 0..2 {
        assert_eq!(
            real[request].0, calltracking[request].0,
            "one trace per request"
        );
        assert_ne!(real[request].1, calltracking[request].1);
    }
    assert_ne!(real[0].0, real[1].0, "a new trace per request");
}

/// A batch is one request: without a `traceparent`, its items' upstream calls
/// share one new trace (a span id per call).
#[tokio::test]
async fn a_batch_without_a_traceparent_is_one_trace() {
    let app = two_call_app().await;
    let items = |users: [u64; 3]| {
        let items: Vec<_> = users
            .iter()
            .map(|user| serde_json::json!({"user_id": user, "ad_id": 1, "category_id": PLAIN_CATEGORY}))
            .collect();
        serde_json::json!({ "items": items }).to_string()
    };
    let mut traces = Vec::new();
    for users in [[1, 2, 3], [4, 5, 6]] {
        let before = (app.real.traces().len(), app.calltracking.traces().len());
        let answer = app.post_public(BATCH, items(users)).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        let calls: Vec<_> = app.real.traces()[before.0..]
            .iter()
            .chain(&app.calltracking.traces()[before.1..])
            .map(|(traceparent, tracestate)| {
                assert_eq!(*tracestate, None);
                let (_, trace_id, parent, flags) = parse(traceparent);
                assert_eq!(flags, "00", "export off: nothing is sampled");
                (trace_id, parent)
            })
            .collect();
        // Three real numbers, then three call-tracking numbers.
        assert_eq!(calls.len(), 6, "{calls:?}");
        assert!(
            calls.iter().all(|(trace, _)| *trace == calls[0].0),
            "one trace for the batch: {calls:?}"
        );
        let mut parents: Vec<_> = calls.iter().map(|(_, parent)| parent).collect();
        parents.sort();
        parents.dedup();
        assert_eq!(parents.len(), 6, "a span id per call: {calls:?}");
        traces.push(calls[0].0.clone());
    }
    assert_ne!(traces[0], traces[1], "a new trace per batch");
}

/// A refresh ahead and a miss made by one request without a `traceparent`
/// continue one trace.
#[tokio::test]
async fn a_refresh_ahead_and_a_miss_of_one_request_are_one_trace() {
    // Within 2 s of expiry after 1 s: a hit then starts a refresh.
    let app = TestApp::spawn_with(
        "[cache.real_phone]\nttl_s = 3\nnegative_ttl_s = 3\nmax_stale_s = 60\nrefresh_ahead_s = 2",
    )
    .await;
    app.real.reply(Reply::Phone(REAL));
    app.calltracking.reply(Reply::Phone(VIRTUAL));
    app.get_public_with(&phone_path(1, 1, PLAIN_CATEGORY), &[])
        .await
        .assert_number(REAL, "real");
    // Call tracking on: the next request's call-tracking lookup misses.
    app.enable_calltracking(1, 1).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    app.get_public_with(&phone_path(1, 1, PLAIN_CATEGORY), &[])
        .await
        .assert_number(VIRTUAL, "calltracking");
    eventually(
        "the refresh ahead is made",
        Duration::from_secs(10),
        || async { app.real.calls() == 2 },
    )
    .await;
    let trace_of = |traced: &Traced| parse(&traced.0).1;
    let (real, calltracking) = (app.real.traces(), app.calltracking.traces());
    assert_eq!(calltracking.len(), 1);
    assert_eq!(
        trace_of(&real[1]),
        trace_of(&calltracking[0]),
        "the refresh and the miss of one request"
    );
    assert_ne!(
        trace_of(&real[0]),
        trace_of(&real[1]),
        "a trace per request"
    );
}

#[tokio::test]
async fn an_invalid_traceparent_starts_a_new_trace_and_the_request_is_answered() {
    let app = two_call_app().await;
    let upper = format!("00-{}-{CALLER_SPAN}-01", TRACE_ID.to_uppercase());
    let zeros = format!("00-{}-{CALLER_SPAN}-01", "0".repeat(32));
    let version_ff = format!("ff-{TRACE_ID}-{CALLER_SPAN}-01");
    let long = format!("00-{TRACE_ID}-{CALLER_SPAN}-01-extra");
    let invalid = [
        "garbage",
        upper.as_str(),
        zeros.as_str(),
        version_ff.as_str(),
        long.as_str(),
        "",
    ];
    for (user, traceparent) in (1..).zip(invalid) {
        app.get_public_with(
            &phone_path(user, 1, PLAIN_CATEGORY),
            &[("traceparent", traceparent), ("tracestate", "vendor=x")],
        )
        .await
        .assert_number(VIRTUAL, "calltracking");
        let (sent, tracestate) = app.calltracking.traces().pop().unwrap();
        let (_, trace_id, _, flags) = parse(&sent);
        assert_ne!(trace_id, TRACE_ID, "{traceparent:?} was not continued");
        assert_eq!(flags, "00", "a new trace without export is not sampled");
        assert_eq!(
            tracestate, None,
            "tracestate goes only with a valid traceparent"
        );
        let (real_sent, _) = app.real.traces().pop().unwrap();
        assert_eq!(
            parse(&real_sent).1,
            trace_id,
            "one new trace for the request"
        );
    }
}

/// What the test's collector received: each POST's content type and body.
#[derive(Clone, Default)]
struct Collector {
    posts: Arc<Mutex<Vec<(String, Bytes)>>>,
}

impl Collector {
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let posts = self.posts.clone();
        let router = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let posts = posts.clone();
                async move {
                    let content_type = headers
                        .get("content-type")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    posts.lock().unwrap().push((content_type, body));
                    // An empty ExportTraceServiceResponse.
                    (
                        StatusCode::OK,
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, router).await });
        url
    }

    /// Every span received, with its service name checked.
    fn spans(&self) -> Vec<Span> {
        let mut spans = Vec::new();
        for (content_type, body) in self.posts.lock().unwrap().iter() {
            assert_eq!(content_type, "application/x-protobuf");
            let request = ExportTraceServiceRequest::decode(body.clone()).expect("OTLP protobuf");
            for resource in request.resource_spans {
                let service = resource
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| kv.value.clone()?.value);
                assert_eq!(
                    service,
                    Some(AnyValue::StringValue("phones-gateway".into()))
                );
                for scope in resource.scope_spans {
                    spans.extend(scope.spans);
                }
            }
        }
        spans
    }

    /// Fails on any phone number in the raw bytes or the decoded spans.
    fn assert_no_numbers(&self) {
        for (_, body) in self.posts.lock().unwrap().iter() {
            let raw = String::from_utf8_lossy(body);
            assert_eq!(leaks_in(&raw), Vec::<String>::new(), "in the raw export");
        }
        let decoded = format!("{:?}", self.spans());
        assert_eq!(leaks_in(&decoded), Vec::<String>::new(), "in {decoded}");
        for number in [REAL, VIRTUAL, ANON] {
            let digits = number.trim_start_matches('+');
            assert!(!decoded.contains(digits), "{number} exported");
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn string_attribute(
    attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue],
    key: &str,
) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.clone()?.value? {
            AnyValue::StringValue(s) => Some(s),
            AnyValue::IntValue(i) => Some(i.to_string()),
            _ => None,
        })
}

/// What one run of the real binary with export on exported (`exported_run`).
struct Export {
    spans: Vec<Span>,
    collector: Collector,
    /// What the upstreams were sent: (trace id, parent id, flags).
    sent: Vec<(String, String, String)>,
}

impl Export {
    /// The spans of `trace`.
    fn of_trace(&self, trace: &str) -> Vec<&Span> {
        self.spans
            .iter()
            .filter(|s| hex(&s.trace_id) == trace)
            .collect()
    }

    /// The request span of the caller's sampled trace.
    fn callers_request(&self) -> &Span {
        self.spans
            .iter()
            .find(|s| hex(&s.trace_id) == TRACE_ID && s.name == "request")
            .expect("the request span")
    }

    /// The trace started for the request without a `traceparent`, as its
    /// upstream call was told; asserts it was sampled.
    fn new_trace(&self) -> String {
        self.sent
            .iter()
            .find(|(trace, _, _)| trace != TRACE_ID && trace != UNSAMPLED_TRACE)
            .map(|(trace, _, flags)| {
                assert_eq!(flags, "01", "ratio 1.0 samples a new trace");
                trace.clone()
            })
            .expect("a call of the request without traceparent")
    }
}

/// The trace a caller sends unsampled.
const UNSAMPLED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// The real binary exporting to the test's collector: a request in a sampled
/// caller trace, one in an unsampled one, one without `traceparent` twice, then
/// SIGTERM to flush. Run once, for the first test that asks (again if it failed).
async fn exported_run() -> &'static Export {
    static EXPORT: tokio::sync::OnceCell<Export> = tokio::sync::OnceCell::const_new();
    EXPORT.get_or_init(export_run).await
}

async fn export_run() -> Export {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let real = Fake::start(Upstream::RealPhone).await;
    let anonymous = Fake::start(Upstream::Anonymous).await;
    let calltracking = Fake::start(Upstream::Calltracking).await;
    real.reply(Reply::Phone(REAL));
    anonymous.reply(Reply::Phone(ANON));
    calltracking.reply(Reply::NotFound);
    let (_dir, url) = crate::support::sqlite_file("gw.db");
    let process = Process::start_with(
        &url,
        &[
            ("UPSTREAMS__REAL_PHONE__BASE_URL", &real.url),
            ("UPSTREAMS__ANONYMOUS__BASE_URL", &anonymous.url),
            ("UPSTREAMS__CALLTRACKING__BASE_URL", &calltracking.url),
            ("TRACING__OTLP_ENDPOINT", &endpoint),
            ("TRACING__SAMPLE_RATIO", "1.0"),
        ],
    )
    .await;
    // Sampled by the caller: anonymous and real asked at once.
    let sampled = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    process
        .get_public_with(
            &phone_path(7, 1, ANON_CATEGORY),
            &[("traceparent", &sampled)],
        )
        .await
        .assert_number(ANON, "anonymous");
    // Unsampled by the caller: the upstream is told so, nothing is exported.
    let unsampled = format!("00-{UNSAMPLED_TRACE}-b7ad6b7169203331-00");
    process
        .get_public_with(
            &phone_path(8, 1, PLAIN_CATEGORY),
            &[("traceparent", &unsampled)],
        )
        .await
        .assert_number(REAL, "real");
    // No traceparent: a new trace; then again, from the cache (traced too).
    for _ in 0..2 {
        process
            .get_public_with(&phone_path(9, 1, PLAIN_CATEGORY), &[])
            .await
            .assert_number(REAL, "real");
    }
    // The sampled request's real-number call may still be on its way.
    eventually("four upstream calls", Duration::from_secs(10), || {
        let calls = real.calls() + anonymous.calls();
        async move { calls == 4 }
    })
    .await;
    let sent = real
        .traces()
        .iter()
        .chain(anonymous.traces().iter())
        .map(|(traceparent, _)| {
            let (_, trace, parent, flags) = parse(traceparent);
            (trace, parent, flags)
        })
        .collect();
    let status = tokio::task::spawn_blocking(move || process.sigterm())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    Export {
        spans: collector.spans(),
        collector,
        sent,
    }
}

#[tokio::test]
async fn export_upstreams_are_told_the_callers_sampling_or_a_sampled_new_trace() {
    let export = exported_run().await;
    let sent = &export.sent;
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert!(
        sent.iter()
            .any(|(trace, _, flags)| trace == UNSAMPLED_TRACE && flags == "00"),
        "{sent:?}"
    );
    export.new_trace();
}

#[tokio::test]
async fn export_flushes_at_sigterm_and_leaves_out_a_callers_unsampled_trace() {
    let spans = &exported_run().await.spans;
    assert!(!spans.is_empty(), "nothing exported");
    assert!(
        spans.iter().all(|s| hex(&s.trace_id) != UNSAMPLED_TRACE),
        "the caller's unsampled trace was exported"
    );
}

/// The caller's trace: the request span, child of the caller's span; two
/// upstream spans under it, whose ids the upstreams received as parent-id.
#[tokio::test]
async fn export_puts_the_request_under_the_callers_span_and_each_upstream_call_under_it() {
    let export = exported_run().await;
    let sent = &export.sent;
    let traced = export.of_trace(TRACE_ID);
    let request = export.callers_request();
    assert_eq!(hex(&request.parent_span_id), CALLER_SPAN);
    assert_eq!(
        string_attribute(&request.attributes, "http.response.status_code").as_deref(),
        Some("200")
    );
    let upstream: Vec<&&Span> = traced.iter().filter(|s| s.name == "upstream").collect();
    assert_eq!(upstream.len(), 2, "{traced:?}");
    for span in &upstream {
        assert_eq!(span.parent_span_id, request.span_id);
        let id = hex(&span.span_id);
        assert!(
            sent.iter()
                .any(|(trace, parent, flags)| trace == TRACE_ID && *parent == id && flags == "01"),
            "upstream span {id} is not the parent the upstream was told: {sent:?}"
        );
    }
    let mut names: Vec<String> = upstream
        .iter()
        .filter_map(|s| string_attribute(&s.attributes, "upstream"))
        .collect();
    names.sort();
    assert_eq!(names, ["anonymous", "real_phone"]);
}

/// The cache outcomes and the decision, as events of the request span.
#[tokio::test]
async fn export_records_the_cache_outcome_and_the_decision_as_events_of_the_request() {
    let request = exported_run().await.callers_request();
    let events: Vec<(String, Option<String>, Option<String>)> = request
        .events
        .iter()
        .map(|e| {
            (
                e.name.clone(),
                string_attribute(&e.attributes, "outcome"),
                string_attribute(&e.attributes, "kind"),
            )
        })
        .collect();
    assert!(
        events.contains(&("cache".into(), Some("miss".into()), None)),
        "{events:?}"
    );
    assert!(
        events.contains(&(
            "decision".into(),
            Some("answered".into()),
            Some("anonymous".into())
        )),
        "{events:?}"
    );
}

/// The new trace: exported too, the second request a hit (no upstream span).
#[tokio::test]
async fn export_includes_a_new_trace_and_a_cache_hit() {
    let export = exported_run().await;
    let new = export.of_trace(&export.new_trace());
    assert!(
        new.iter()
            .any(|s| s.name == "request" && s.parent_span_id.is_empty())
    );
    assert!(new.iter().any(|s| s.name == "upstream"));
    let hits = export
        .spans
        .iter()
        .filter(|s| {
            s.name == "request"
                && s.events.iter().any(|e| {
                    e.name == "cache"
                        && string_attribute(&e.attributes, "outcome").as_deref() == Some("hit")
                })
        })
        .count();
    assert!(hits >= 1, "the hit's request span");
}

#[tokio::test]
async fn export_holds_no_phone_number() {
    exported_run().await.collector.assert_no_numbers();
}

/// docs/tracing.md#coalesced-fetches: a fetch that a second request joins
/// carries the trace of the request that started it, and only that one.
#[tokio::test]
async fn a_coalesced_fetch_carries_the_trace_of_the_request_that_started_it() {
    let app = TestApp::spawn().await;
    app.real
        .reply_after(Reply::Phone(REAL), Duration::from_millis(150));
    let first_trace = "11111111111111111111111111111111";
    let second_trace = "22222222222222222222222222222222";
    let path = phone_path(5, 1, PLAIN_CATEGORY);
    let send = |trace: &str| {
        let request = app
            .http
            .get(format!("{}{path}", app.public))
            .header("traceparent", format!("00-{trace}-{CALLER_SPAN}-01"));
        async move { read(request.send().await.unwrap()).await }
    };
    let first = tokio::spawn(send(first_trace));
    app.real
        .until_calls("the first request's fetch", 1, Duration::from_secs(5))
        .await;
    let second = send(second_trace).await;
    second.assert_number(REAL, "real");
    first.await.unwrap().assert_number(REAL, "real");
    let traces = app.real.traces();
    assert_eq!(traces.len(), 1, "one fetch served both: {traces:?}");
    assert_eq!(parse(&traces[0].0).1, first_trace);
}
