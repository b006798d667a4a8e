//! The migrations a replica runs at start, one at a time, so `/readyz` and the log
//! can say which one runs ([`Migrations`]). See docs/operations.md, "Migrations at start".

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::migrate::{Migration, Migrator};
use tokio::time::Instant;

use super::error::StoreError;
use super::pool::{ACQUIRE_TIMEOUT, Pg, target};

/// The bound on each part of the start's migrations that does not grow with
/// the data: the connection and its set-up, each probe.
pub const MIGRATION_BOUND: Duration = Duration::from_secs(5);

/// How often a running migration is probed and its progress published.
const PROBE_EVERY: Duration = Duration::from_secs(2);

const LOG_EVERY: Duration = Duration::from_secs(5);

/// Probes in a row that found the migrating session idle, its client waiting,
/// after which it is taken as lost (a silent network leaves it open and idle).
const IDLE_PROBES: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Until {
    /// Up to the last pending migration that is not the reveal log's alone.
    Answers,
    All,
}

/// SQLite's migrations that touch the reveal log's tables alone: run beside
/// the answers. A migration left out runs before a replica is ready.
pub(super) const BESIDE_ANSWERS_SQLITE: &[i64] = &[3, 6, 7, 8, 9, 10, 11];
/// PostgreSQL's, as [`BESIDE_ANSWERS_SQLITE`].
pub(super) const BESIDE_ANSWERS_POSTGRES: &[i64] = &[3, 7];

/// Which migration runs now: written by the start, read by `/readyz`.
#[derive(Debug, Clone, Default)]
pub struct Migrations(Arc<Mutex<Option<Running>>>);

#[derive(Debug, Clone)]
struct Running {
    /// "applying migration 0011 (reveal buckets), 1 of 2 pending", or a lock wait.
    what: String,
    since: Instant,
    progress: Option<String>,
}

impl Migrations {
    pub fn describe(&self) -> Option<String> {
        let running = self.lock().clone()?;
        let mut text = format!(
            "{}, for {} s",
            running.what,
            running.since.elapsed().as_secs()
        );
        if let Some(progress) = running.progress {
            text.push_str("; ");
            text.push_str(&progress);
        }
        Some(text)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        // A panic while holding it leaves a value that is still whole.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn start(&self, what: String) -> Instant {
        let since = Instant::now();
        *self.lock() = Some(Running {
            what,
            since,
            progress: None,
        });
        since
    }

    fn progress(&self, progress: Option<String>) {
        if let Some(running) = self.lock().as_mut() {
            running.progress = progress;
        }
    }

    fn done(&self) {
        *self.lock() = None;
    }

    /// Awaits `run`, described as `what`; `look` is called every [`PROBE_EVERY`]
    /// and says how it goes, or ends it with an error.
    async fn watch<T, L, F>(
        &self,
        what: String,
        run: impl Future<Output = Result<T, StoreError>>,
        look: &mut L,
    ) -> Result<(T, Duration), StoreError>
    where
        L: FnMut() -> F,
        F: Future<Output = Result<Option<String>, StoreError>>,
    {
        let since = self.start(what);
        tokio::pin!(run);
        let mut ticks = tokio::time::interval_at(since + PROBE_EVERY, PROBE_EVERY);
        let mut logged = since;
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                _ = ticks.tick() => {
                    match look().await {
                        Ok(said) => self.progress(said),
                        Err(error) => break Err(error),
                    }
                    if logged.elapsed() >= LOG_EVERY {
                        logged = Instant::now();
                        if let Some(text) = self.describe() {
                            tracing::info!(elapsed_s = since.elapsed().as_secs(), "{text}");
                        }
                    }
                }
            }
        };
        self.done();
        result.map(|value| (value, since.elapsed()))
    }
}

/// The pending migrations a run `until` applies, as indexes into `migrator`:
/// for [`Until::Answers`], those up to the last not in `beside`, or all of
/// them on a first start (it has no log to rebuild).
fn pending(migrator: &Migrator, applied: &[i64], until: Until, beside: &[i64]) -> Vec<usize> {
    let mut pending: Vec<usize> = migrator
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
        .map(|(i, _)| i)
        .collect();
    if until == Until::Answers && !applied.is_empty() {
        let needed = pending
            .iter()
            .rposition(|&i| !beside.contains(&migrator.migrations[i].version));
        pending.truncate(needed.map_or(0, |last| last + 1));
    }
    pending
}

fn split(
    migrator: &Migrator,
    applied: &[i64],
    until: Until,
    beside: &[i64],
) -> (Vec<usize>, usize) {
    let to_run = pending(migrator, applied, until, beside);
    let left = pending(migrator, applied, Until::All, beside).len() - to_run.len();
    (to_run, left)
}

/// An error for the first of `applied` that `migrator` does not know.
fn known(migrator: &Migrator, applied: &[i64]) -> Result<(), StoreError> {
    match applied
        .iter()
        .find(|&&version| !migrator.iter().any(|m| m.version == version))
    {
        Some(&version) => Err(sqlx::migrate::MigrateError::VersionMissing(version).into()),
        None => Ok(()),
    }
}

/// `migrator`'s migrations up to the one at `index`; another replica's later
/// ones are not its concern (the full run at the end checks them).
fn up_to(migrator: &Migrator, index: usize) -> Migrator {
    let migrations: Vec<Migration> = migrator.migrations[..=index].to_vec();
    Migrator {
        migrations: Cow::Owned(migrations),
        ignore_missing: true,
        ..Migrator::DEFAULT
    }
}

/// Runs `migrator` one pending migration at a time; returns how many are left.
async fn run_each<C, L, F>(
    (migrator, until, beside): (&Migrator, Until, &[i64]),
    conn: &mut C,
    applied: &[i64],
    progress: &Migrations,
    look: &mut L,
) -> Result<usize, StoreError>
where
    C: sqlx::migrate::Migrate + Send,
    L: FnMut() -> F,
    F: Future<Output = Result<Option<String>, StoreError>>,
{
    known(migrator, applied)?;
    let (to_run, left) = split(migrator, applied, until, beside);
    let of = to_run.len();
    for (n, &index) in to_run.iter().enumerate() {
        let migration = &migrator.migrations[index];
        let (version, description) = (migration.version, migration.description.to_string());
        tracing::info!(version, %description, nth = n + 1, of, "migration starts");
        let what = format!(
            "applying migration {version:04} ({description}), {} of {of} pending",
            n + 1
        );
        let step = up_to(migrator, index);
        let run = async { step.run_direct(&mut *conn).await.map_err(StoreError::from) };
        let started = Instant::now();
        let result = progress.watch(what, run, look).await;
        let took = started.elapsed();
        metrics::histogram!("phones_gateway_db_operation_duration_seconds", "operation" => "migrate")
            .record(took.as_secs_f64());
        match result {
            Ok(_) => tracing::info!(
                version,
                %description,
                took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
                "migration applied"
            ),
            Err(error) => {
                tracing::warn!(version, %description, ?took, %error, "migration did not finish");
                return Err(error);
            }
        }
    }
    // The whole list once more: nothing pending, every applied one known and
    // unchanged (a database of a newer release is refused here).
    if until == Until::All {
        migrator.run_direct(conn).await?;
    }
    Ok(left)
}

pub(super) async fn run_sqlite(
    pool: &sqlx::SqlitePool,
    (migrator, until): (&Migrator, Until),
    progress: &Migrations,
) -> Result<usize, StoreError> {
    let mut conn = pool.acquire().await?;
    // None before the migrator's table exists.
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_default();
    let mut look = || async { Ok(None) };
    let plan = (migrator, until, BESIDE_ANSWERS_SQLITE);
    run_each(plan, &mut *conn, &applied, progress, &mut look).await
}

/// The start's migrations on PostgreSQL, on a session of their own to
/// PostgreSQL itself (the migrator's lock means nothing through a pooler).
pub(super) async fn run_postgres(
    pg: &Pg,
    (migrator, until): (&Migrator, Until),
    progress: &Migrations,
) -> Result<usize, StoreError> {
    let set_up = async {
        let mut direct = connect(pg).await?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut direct)
            .await?;
        let database: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&mut direct)
            .await?;
        Ok::<_, StoreError>((direct, pid, database))
    };
    let (mut direct, pid, database) = tokio::time::timeout(MIGRATION_BOUND, set_up)
        .await
        .unwrap_or(Err(StoreError::TimedOut {
            operation: "the migrations' connection",
            bound: MIGRATION_BOUND,
        }))?;
    let plan = (migrator, until, BESIDE_ANSWERS_POSTGRES);
    if until == Until::Answers {
        // Nothing that answering needs is pending: no wait for the lock,
        // which a replica migrating the reveal log holds for minutes.
        let applied = applied_postgres(&mut direct).await;
        let (to_run, left) = split(migrator, &applied, until, plan.2);
        if to_run.is_empty() {
            let result = known(migrator, &applied);
            let _ = sqlx::Connection::close(direct).await;
            return result.map(|()| left);
        }
    }
    let idle = AtomicU32::new(0);
    let mut look = || {
        let probe = probe(pg, pid);
        let idle = &idle;
        async move {
            let seen = probe.await?;
            let count = if seen.idle {
                idle.fetch_add(1, Ordering::Relaxed) + 1
            } else {
                idle.store(0, Ordering::Relaxed);
                0
            };
            if count >= IDLE_PROBES {
                return Err(StoreError::Unreachable {
                    target: target(&pg.direct),
                    cause: format!(
                        "the migrating session was idle at {IDLE_PROBES} probes in a row \
                         while its client waited: its connection is lost"
                    ),
                });
            }
            Ok(seen.said)
        }
    };
    let run = async {
        // The migrator's own lock (sqlx takes it again in each step: a session's
        // advisory locks count), waited for without a bound.
        let key = migration_lock_key(&database);
        let take = async {
            sqlx::Executor::execute(&mut direct, "SET lock_timeout = 0").await?;
            sqlx::query("SELECT pg_advisory_lock($1)")
                .bind(key)
                .execute(&mut direct)
                .await?;
            Ok(())
        };
        let what = "waiting for the migrations' lock (another replica or \
                    `phones-gateway migrate` holds it)"
            .to_string();
        progress.watch(what, take, &mut look).await?;
        // Lock waits bounded like every other call's; no statement timeout: a
        // migration's time grows with the data.
        let bound = format!("SET lock_timeout = {}", pg.bounds.lock.as_millis());
        sqlx::Executor::execute(&mut direct, bound.as_str()).await?;
        let applied = applied_postgres(&mut direct).await;
        run_each(plan, &mut direct, &applied, progress, &mut look).await
    };
    let result = run.await;
    // Closing the session releases the lock.
    let _ = sqlx::Connection::close(direct).await;
    result
}

/// The versions applied; none before the migrator's table exists.
async fn applied_postgres(conn: &mut sqlx::PgConnection) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
        .fetch_all(conn)
        .await
        .unwrap_or_default()
}

/// The key of the advisory lock sqlx's migrator takes on PostgreSQL (its
/// `generate_lock_id`): 0x3d32ad9e times the CRC-32 (ISO-HDLC) of the
/// database's name. Whoever holds it is migrating that database.
pub fn migration_lock_key(database: &str) -> i64 {
    let mut crc = !0u32;
    for byte in database.bytes() {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    0x3d32_ad9e * i64::from(!crc)
}

async fn connect(pg: &Pg) -> Result<sqlx::PgConnection, StoreError> {
    let connect = <sqlx::PgConnection as sqlx::Connection>::connect_with(&pg.direct);
    match tokio::time::timeout(ACQUIRE_TIMEOUT, connect).await {
        Ok(connected) => connected.map_err(|error| StoreError::Unreachable {
            target: target(&pg.direct),
            cause: error.to_string(),
        }),
        Err(_) => Err(StoreError::Unreachable {
            target: target(&pg.direct),
            cause: format!("no answer within {ACQUIRE_TIMEOUT:?}"),
        }),
    }
}

/// A probe's row: state, wait, index build phase, rows done, rows in all.
type ProbeRow = (
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

struct Seen {
    idle: bool,
    said: Option<String>,
}

/// The migrating session `pid`, seen from another connection: gone (an
/// error), idle, waiting for a lock, or building an index.
async fn probe(pg: &Pg, pid: i32) -> Result<Seen, StoreError> {
    let look = async {
        let mut conn = connect(pg).await?;
        let row: Option<ProbeRow> = sqlx::query_as(
            "SELECT coalesce(a.state, ''), a.wait_event_type, p.phase, \
                 p.tuples_done, p.tuples_total \
                 FROM pg_stat_activity a \
                 LEFT JOIN pg_stat_progress_create_index p ON p.pid = a.pid \
                 WHERE a.pid = $1",
        )
        .bind(pid)
        .fetch_optional(&mut conn)
        .await?;
        let _ = sqlx::Connection::close(conn).await;
        Ok::<_, StoreError>(row)
    };
    let row = tokio::time::timeout(MIGRATION_BOUND, look)
        .await
        .unwrap_or(Err(StoreError::TimedOut {
            operation: "the probe of a running migration",
            bound: MIGRATION_BOUND,
        }))?;
    let Some((state, wait, phase, done, total)) = row else {
        return Err(StoreError::Unreachable {
            target: target(&pg.direct),
            cause: "the migrating session is gone".into(),
        });
    };
    let said = match (wait.as_deref(), phase) {
        (Some("Lock"), _) => {
            Some("waiting for a lock (another replica migrating, or a long transaction)".into())
        }
        (_, Some(phase)) => Some(match (done, total) {
            (Some(done), Some(total)) if total > 0 => {
                format!("index build: {phase}, {done} of {total} rows")
            }
            _ => format!("index build: {phase}"),
        }),
        _ => None,
    };
    Ok(Seen {
        idle: state.starts_with("idle"),
        said,
    })
}

#[cfg(test)]
mod tests {
    use super::{
        BESIDE_ANSWERS_POSTGRES, BESIDE_ANSWERS_SQLITE, Migrator, Until, migration_lock_key,
        pending,
    };

    /// The versions of the migrations [`pending`] runs, `applied` applied.
    fn left(migrator: &Migrator, applied: &[i64], until: Until, beside: &[i64]) -> Vec<i64> {
        let version = |i: usize| migrator.migrations[i].version;
        let indexes = pending(migrator, applied, until, beside);
        indexes.into_iter().map(version).collect()
    }

    #[test]
    fn answers_wait_for_every_migration_up_to_the_last_that_is_not_the_reveal_logs() {
        let sqlite = sqlx::migrate!("migrations/sqlite");
        let (beside, none) = (BESIDE_ANSWERS_SQLITE, Vec::<i64>::new());
        let to = |last: i64| (1..=last).collect::<Vec<i64>>();
        let answers = |applied: &[i64]| left(&sqlite, applied, Until::Answers, beside);
        let all = |applied: &[i64]| left(&sqlite, applied, Until::All, beside);
        assert_eq!(answers(&[]), to(11));
        assert_eq!(answers(&to(2)), [3, 4, 5]);
        assert_eq!(answers(&to(5)), none);
        assert_eq!(answers(&to(10)), none);
        assert_eq!(all(&to(5)), [6, 7, 8, 9, 10, 11]);
        assert_eq!(all(&to(10)), [11]);
        let postgres = sqlx::migrate!("migrations/postgres");
        let beside = BESIDE_ANSWERS_POSTGRES;
        let answers = |applied: &[i64]| left(&postgres, applied, Until::Answers, beside);
        // The reveal log's 0007 comes before 0008, which answering needs.
        assert_eq!(answers(&to(6)), [7, 8]);
        assert_eq!(answers(&to(8)), none);
    }

    /// The SQL of a migration in lower case, without its `--` comments.
    fn code_of(sql: &str) -> String {
        sql.lines()
            .map(|line| line.split("--").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
            .to_lowercase()
    }

    fn created(sql: &str) -> Vec<String> {
        sql.split("create table")
            .skip(1)
            .filter_map(|rest| {
                let rest = rest.trim_start();
                let rest = rest.strip_prefix("if not exists").unwrap_or(rest);
                let name: String = rest
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                (!name.is_empty()).then_some(name)
            })
            .collect()
    }

    fn names(sql: &str, word: &str) -> bool {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        sql.match_indices(word).any(|(at, _)| {
            let before = sql[..at].chars().next_back().is_none_or(|c| !ident(c));
            let after = sql[at + word.len()..]
                .chars()
                .next()
                .is_none_or(|c| !ident(c));
            before && after
        })
    }

    /// A migration run beside the answers creates only the reveal log's tables
    /// and names no other: whatever it locks or rewrites, answering does not read.
    #[test]
    fn the_migrations_beside_answers_touch_the_reveal_log_alone() {
        let reveal_log = |table: &str| {
            table == "reveals"
                || table.starts_with("reveal_")
                || table.starts_with("ad_reveal_counts")
        };
        let postgres = sqlx::migrate!("migrations/postgres");
        for (migrator, beside) in [
            (sqlx::migrate!("migrations/sqlite"), BESIDE_ANSWERS_SQLITE),
            (postgres, BESIDE_ANSWERS_POSTGRES),
        ] {
            let listed = |version: i64| beside.contains(&version);
            let others: Vec<String> = migrator
                .iter()
                .filter(|m| !listed(m.version))
                .flat_map(|m| created(&code_of(&m.sql)))
                .collect();
            let status = others.iter().any(|t| t == "calltracking_status");
            assert!(status, "{others:?}");
            for &version in beside {
                let migration = migrator.iter().find(|m| m.version == version);
                let sql = code_of(&migration.expect("a listed migration exists").sql);
                for table in created(&sql) {
                    assert!(reveal_log(&table), "{version:04} creates {table}");
                }
                for table in &others {
                    assert!(
                        reveal_log(table) || !names(&sql, table),
                        "{version:04} names {table}, outside the reveal log"
                    );
                }
            }
        }
    }

    /// CRC-32 (ISO-HDLC)'s check value: the CRC of "123456789" is 0xCBF43926.
    #[test]
    fn the_lock_key_is_sqlxs() {
        let key = 0x3d32_ad9e * 0xCBF4_3926_i64;
        assert_eq!(migration_lock_key("123456789"), key);
    }
}
