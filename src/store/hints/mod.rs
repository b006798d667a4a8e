//! Change hints: the change log may have grown, so the sync loop catches up
//! now rather than at its next poll. PostgreSQL only (`LISTEN`); a hint too
//! after every (re)connection, since notifications meanwhile are lost.

mod postgres;

use std::time::Duration;

use super::pool::Backend;

/// The channel the status store notifies on with every write (PostgreSQL).
pub(super) const CHANNEL: &str = "calltracking_status";

pub struct ChangeHints {
    postgres: Option<postgres::Listening>,
}

impl ChangeHints {
    pub(super) fn of(backend: &Backend, retry: Duration, listen: bool) -> Self {
        ChangeHints {
            postgres: match backend {
                Backend::Postgres(pg) if listen => {
                    Some(postgres::Listening::new(pg, CHANNEL, retry))
                }
                Backend::Postgres(_) | Backend::Sqlite(_) => None,
            },
        }
    }

    /// Completes at the next hint; with SQLite, or with listening off, never.
    /// Cancel-safe: a caller may race it against a poll timer.
    pub async fn next(&mut self) {
        match &mut self.postgres {
            Some(listening) => listening.next().await,
            None => std::future::pending().await,
        }
    }
}
