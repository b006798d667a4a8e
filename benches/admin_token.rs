//! The admin token check, as the admin listener's front runs it before every
//! `/admin/` request: what the webhook path pays for it
//! (`AdminTokens::check`, then the route's scope).
//!
//! - `admin_token/valid`: a request carrying a right token (of `tokens`
//!   entries, the last one, so every comparison is paid);
//! - `admin_token/wrong`: a request carrying a wrong token of the same length.
//!
//! `ADMIN_TOKEN_ENTRIES` sets how many tokens are configured (default 1, the
//! `admin.token` alone, as before named tokens).

#![allow(clippy::unwrap_used)]

use std::hint::black_box;

use axum::http::{HeaderMap, HeaderValue, header};
use criterion::{Criterion, criterion_group, criterion_main};
use phones_gateway::config::{AdminToken, Scope, Scopes, Secret};
use phones_gateway::http::api::access::AdminTokens;

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
    let entries: usize = std::env::var("ADMIN_TOKEN_ENTRIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let tokens = AdminTokens::new(
        (0..entries)
            .map(|i| AdminToken {
                name: format!("t{i}"),
                // Distinct values of TOKEN's length; the last is TOKEN.
                value: Secret::new(if i + 1 == entries {
                    TOKEN.to_owned()
                } else {
                    format!("{i:0>32}")
                }),
                scopes: Scopes::of([Scope::StatusesWrite]),
                file: None,
            })
            .collect(),
    );
    let valid = headers(TOKEN);
    let wrong = headers(&TOKEN.replace('a', "b"));
    let check = |headers: &HeaderMap| {
        tokens
            .check(headers)
            .is_some_and(|id| tokens.allows(id, Scope::StatusesWrite))
    };
    let mut group = c.benchmark_group("admin_token");
    group.bench_function("valid", |b| b.iter(|| black_box(check(black_box(&valid)))));
    group.bench_function("wrong", |b| b.iter(|| black_box(check(black_box(&wrong)))));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
