//! Whole-app tests: the real router on real sockets, fake upstreams that are real
//! HTTP servers, one module per area.

#![allow(clippy::unwrap_used)]

mod abuse;
mod admin;
mod bad_input;
mod caching;
mod durability;
mod edges_http;
mod faults;
mod feed;
mod limits;
mod operations;
mod pg;
mod privacy;
mod replicas;
mod selection;
mod shutdown;
mod support;

/// Numbers the fake upstreams hand out.
pub const REAL: &str = "+79161234567";
pub const ANON: &str = "+78001112233";
pub const VIRTUAL: &str = "+74951234567";
/// A category where anonymous numbers are sold (default config) and one where not.
pub const ANON_CATEGORY: u64 = 9;
pub const PLAIN_CATEGORY: u64 = 1;
