//! Whole-app tests: the real app on real sockets (or its public front without
//! them, `support::front`) against fake upstreams that are real HTTP servers;
//! mostly a module per page of docs/, named after it. Harness: `support/`.
#![allow(clippy::unwrap_used)]
// A test binary exports nothing (`pub` only shares helpers between its
// modules), and it times real sockets and processes: wall time is meant.
#![allow(unreachable_pub, clippy::disallowed_types)]

mod adaptive;
mod admin_access;
mod admin_record;
mod api_contract;
mod attribution;
mod backoff;
mod budgets;
mod caching;
mod campaign;
mod faults;
mod operations;
mod overload;
mod reasons;
mod resources;
mod reveals;
mod rules;
mod status_bounds;
mod status_sync;
mod support;
mod tracing;
mod upgrade;
mod verdicts;

/// Every admin token value the tests configure: the privacy scanner fails a
/// test on any log line holding one (docs/admin-access.md: a token's name is
/// logged, never its value).
pub const SECRETS: &[&str] = &[
    support::app::TOKEN,
    admin_access::STATUSES_READ,
    admin_access::STATUSES_WRITE,
    admin_access::CACHE_INVALIDATE,
    admin_access::REVEALS_READ,
    admin_access::DEBUG,
    admin_access::NO_SCOPE,
    admin_access::OLD,
    admin_access::NEW,
    admin_access::FILE_OLD,
    admin_access::FILE_NEW,
];

/// Numbers the fake upstreams hand out.
pub const REAL: &str = "+79161234567";
pub const ANON: &str = "+78001112233";
pub const VIRTUAL: &str = "+74951234567";
/// Other numbers tests hand out or send.
pub const NEW_REAL: &str = "+79160000000";
pub const OTHER_VIRTUAL: &str = "+74950000001";
pub const FOREIGN: &str = "+442079460958";
pub const NEW_ANON: &str = "+78009998877";
/// Every number the tests use: the privacy scanner looks for each one's digits
/// in every log line, with or without `+` (`support::leaks_in`).
pub const NUMBERS: &[&str] = &[
    REAL,
    ANON,
    VIRTUAL,
    NEW_REAL,
    OTHER_VIRTUAL,
    FOREIGN,
    NEW_ANON,
];
/// A category where anonymous numbers are sold (default config) and one where not.
pub const ANON_CATEGORY: u64 = 9;
pub const PLAIN_CATEGORY: u64 = 1;
