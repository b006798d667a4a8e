//! The admin token check, as the admin listener's front runs it before every
//! `/admin/` request: what the webhook path pays for it.
//!
//! - `admin_token/valid`: a request carrying the right token;
//! - `admin_token/wrong`: a request carrying a wrong token of the same length.

#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use axum::http::{HeaderMap, HeaderValue, header};
use criterion::{Criterion, criterion_group, criterion_main};
use phones_gateway::config::Secret;
use phones_gateway::http::api::admin::has_token;

const TOKEN: &str = "a3f9c2e1b7d64f0a9e8c1d2b3a4f5e6d";

fn headers(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers
}

fn bench(c: &mut Criterion) {
    let secret = Secret::new(TOKEN);
    let valid = headers(TOKEN);
    let wrong = headers(&TOKEN.replace('a', "b"));
    let mut group = c.benchmark_group("admin_token");
    group.bench_function("valid", |b| {
        b.iter(|| black_box(has_token(black_box(&secret), black_box(&valid))))
    });
    group.bench_function("wrong", |b| {
        b.iter(|| black_box(has_token(black_box(&secret), black_box(&wrong))))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
