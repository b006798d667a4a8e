//! Change hints: the change log may have grown, so the sync loop catches up
//! now rather than at its next poll; it never touches a database driver
//! itself.
//!
//! PostgreSQL: hints are `LISTEN calltracking_status` notifications ([`CHANNEL`],
//! which the status store notifies on with every write), plus one after every
//! (re)connection of the listener, since notifications sent while it was away
//! are lost. SQLite serves one replica: it has no hints (the local writer
//! catches up itself), so this store has a PostgreSQL side only.

mod postgres;

use std::time::Duration;

use super::pool::Backend;

/// The notification channel of status changes: the status store notifies on
/// it with every write (PostgreSQL), and the change hints listen on it.
pub(super) const CHANNEL: &str = "calltracking_status";

/// A source of change hints; see the module doc. Made by
/// `Database::change_hints`.
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

    /// Completes at the next hint; with SQLite, or with listening off, never. Cancel-safe: a caller may
    /// race it against a poll timer and call it again.
    pub async fn next(&mut self) {
        match &mut self.postgres {
            Some(listening) => listening.next().await,
            None => std::future::pending().await,
        }
    }
}
