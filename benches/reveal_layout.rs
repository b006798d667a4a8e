//! The reveal log's SQLite layout, side by side in one run, on the recorded
//! stream's sellers and ads (`benches/load/stream.py`, one of 1,000 viewers a
//! request as `stream_hits.lua` sends them):
//! - `shipped`: the store's own code (`RevealStore::write_reveals`, pages by
//!   `read_reveals`): viewers' runs and sellers' postings, no index entry per
//!   reveal (migrations/sqlite/0007, 0009);
//! - `plain`: the layout before them, in SQL here (not a shipped path): the
//!   same table with `reveals_user (user_id, at_us)` and `reveals_viewer
//!   (viewer, at_us) WHERE viewer IS NOT NULL` (0006), the flush sorted by
//!   viewer, seller and time and inserted without ids, pages by one keyset
//!   query each (the store's read before 0007);
//! - `bucketed`: plain indexes whose key starts with a bucket of the log
//!   (the reveals written before the flush, over 262,144), so that a flush's
//!   index entries land in the newest bucket's part of each index instead of
//!   over the whole of it; pages walk the buckets newest first;
//! - `shipped-bkt`: the store's own code too, its postings' and runs'
//!   indexes keyed first by a bucket of 262,144 ids (a virtual column of
//!   `first_id`), to see whether the bucketed keys hold the shipped layout's
//!   cost flat; writes only (the store's pages do not walk buckets);
//! - `shipped-null`: the store's own code too, every reveal without a reason
//!   (the column NULL, as the log before reasons were kept reads): beside
//!   `shipped`, whose reveals carry the realistic mix of reasons of
//!   [`reason_of`], it is what storing the reason costs the writer and the
//!   file, measured in the same turns;
//! - `blob`: no row per reveal at all, a floor for what a log written by the
//!   flush can cost: a flush is one row holding its reveals packed (varints,
//!   viewers as a dictionary), with the same per-ad counts. Its pages are not
//!   measured (they would scan the flushes, or need an index built apart).
//!
//! Each layout gets a file of its own; they are written in turns, a segment of
//! the stream at a time (flushes of 30,000 reveals, a second apart in the
//! reveals' time), so the machine's noise falls on all of them alike. Per
//! segment: CPU per reveal of the log's writer thread (SQLite's connection
//! thread, from /proc/self/task/*/schedstat) and of the calling thread (the
//! flush's side: sort, statements, binds), bytes the writer thread wrote a
//! reveal (its `wchar`: WAL frames and checkpoints), and the file's size a
//! reveal. After the first segment (a million lines) and at the end: the admin pages'
//! latency, p50 and p99 (by seller: the sale's seller, a warm one, a cold one;
//! by viewer; by ad, the counts).
//!
//! `CARGO_PROFILE_BENCH_LTO=false CARGO_PROFILE_BENCH_CODEGEN_UNITS=16 cargo
//! bench --bench reveal_layout` (REVEAL_LAYOUT_TOTAL, REVEAL_LAYOUT_FLUSH,
//! REVEAL_LAYOUT_SEGMENT, REVEAL_LAYOUT_DIR and REVEAL_LAYOUT_STREAM change
//! the sizes, the directory and the stream file; REVEAL_LAYOUT_ONLY, a comma
//! list of layout names, runs those alone); under `cargo test` it runs
//! small. The files go with the run (about 1.5 GB at 4M reveals a layout).

#![allow(clippy::unwrap_used)]
// A bench measures wall time and exports nothing.
#![allow(unreachable_pub, clippy::disallowed_types)]

use std::collections::HashMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use phones_gateway::domain::reason::{Failure, Origin, Reason, Skip};
use phones_gateway::domain::{
    AdId, CategoryId, Reveal, RevealQuery, RevealsOf, Source, UserId, Viewer,
};
use phones_gateway::store::{Database, RevealStore};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqlitePool, query, query_as};

/// The sale's seller in stream.py.
const HOT_SELLER: u64 = 77_777;
const VIEWERS: u64 = 1_000;
/// A bucket of the `bucketed` layout: 2^18 reveals.
const BUCKET_SHIFT: u32 = 18;
/// The admin pages' default size, asked as the route asks it (one more, to
/// know whether a next page exists).
const PAGE: u32 = 101;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    Shipped,
    ShippedNull,
    ShippedBucketed,
    Plain,
    Bucketed,
    Blob,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Shipped => "shipped",
            Layout::ShippedNull => "shipped-null",
            Layout::ShippedBucketed => "shipped-bkt",
            Layout::Plain => "plain",
            Layout::Bucketed => "bucketed",
            Layout::Blob => "blob",
        }
    }
    /// The writer thread's name prefix (at most 15 bytes with its number).
    fn writer(self) -> &'static str {
        match self {
            Layout::Shipped | Layout::ShippedNull | Layout::ShippedBucketed => "reveal-writer",
            Layout::Plain => "plain-writer",
            Layout::Bucketed => "bucket-writer",
            Layout::Blob => "blob-writer",
        }
    }
}

/// One request of the stream: (seller, ad, category).
type Line = (u64, u64, u64);

fn load_stream(smoke: bool) -> Vec<Line> {
    let path = std::env::var("REVEAL_LAYOUT_STREAM").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/stream/zipf-300000-s1.1-seed38.txt"
        )
        .into()
    });
    let parse = |text: &str| -> Vec<Line> {
        text.lines()
            .filter_map(|line| {
                let q = line.split_once('?')?.1;
                let mut f = q
                    .split('&')
                    .map(|kv| kv.split_once('=')?.1.parse::<u64>().ok());
                Some((f.next()??, f.next()??, f.next()??))
            })
            .collect()
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text),
        Err(_) if smoke => (1..5_000u64)
            .map(|n| (1 + (n * n) % 3_000, 1 + (n * 7) % 4_000, 1 + n % 2))
            .collect(),
        Err(e) => panic!("{path}: {e} (make it with benches/load/stream.py)"),
    }
}

/// The reveal the gateway records for request `n` of the stream (stream.py's
/// simulator rules: category 9 anonymous when (user + ad) % 3 == 0; 404s, for
/// sellers that are multiples of 50, are no reveal and are skipped).
fn reveal_of(line: Line, n: u64, at_us: i64) -> Option<Reveal> {
    let (user, ad, category) = line;
    let kind = if category == 9 && (user + ad) % 3 == 0 {
        Source::Anonymous
    } else if user % 50 == 0 {
        return None;
    } else {
        Source::RealPhone
    };
    Some(Reveal {
        at_us,
        viewer: Some(Viewer::parse(format!("viewer-{}", n % VIEWERS).as_bytes()).unwrap()),
        user: UserId::new(user).unwrap(),
        ad: AdId::new(ad).unwrap(),
        category: CategoryId::new(category).unwrap(),
        kind,
        reason: Some(reason_of(line, n, kind)),
    })
}

/// The reason the rules give request `n` of the stream, at the default
/// order (anonymous, call tracking, real), in the mix of the hit path: the
/// number from the cache for all but one request in a hundred (from the
/// upstream: a refresh, a miss) and one in a thousand (a stale value for a
/// timeout); an anonymous number with nothing above it; a real number below
/// anonymous (not applicable outside category 9, no number inside it) and
/// call tracking (not applicable, but for the simulator's call-tracking
/// sellers, multiples of 4 up to 40,000, where it timed out and fell
/// through).
fn reason_of(line: Line, n: u64, kind: Source) -> Reason {
    let (user, _, category) = line;
    let origin = match n % 1_000 {
        0..=8 => Origin::Upstream,
        9 => Origin::Stale(Failure::Timeout),
        _ => Origin::Cache,
    };
    if kind == Source::Anonymous {
        return Reason::new(origin);
    }
    let anonymous = if category == 9 {
        Skip::NoNumber
    } else {
        Skip::NotApplicable
    };
    let calltracking = if user % 4 == 0 && user <= 40_000 {
        Skip::Failed(Failure::Timeout)
    } else {
        Skip::NotApplicable
    };
    Reason::new(origin)
        .skipped(Source::Anonymous, anonymous)
        .skipped(Source::Calltracking, calltracking)
}

/// Id, name, nanoseconds on CPU and bytes written (`wchar`) of every thread
/// of this process.
fn threads() -> Vec<(String, String, u64, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let dir = task.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let cpu = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let wchar = std::fs::read_to_string(dir.join("io"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("wchar: ")?.trim().parse().ok())
            })
            .unwrap_or(0);
        let tid = task.file_name().to_string_lossy().into_owned();
        out.push((tid, name.trim().to_owned(), cpu, wchar));
    }
    out
}

/// CPU ns and bytes written of a layout's writer thread: the one named
/// `tid` (the store names every log writer alike), else those whose name
/// starts with `prefix`.
fn of_threads(prefix: &str, tid: Option<&str>) -> (u64, u64) {
    threads()
        .into_iter()
        .filter(|(id, name, ..)| tid.map_or(name.starts_with(prefix), |t| t == id))
        .fold((0, 0), |(c, w), (.., cpu, wchar)| (c + cpu, w + wchar))
}

/// The ids of the store's log writer threads.
fn store_writers() -> Vec<String> {
    threads()
        .into_iter()
        .filter(|(_, name, ..)| name.starts_with("reveal-writer"))
        .map(|(id, ..)| id)
        .collect()
}

/// This thread's CPU ns (the flush's side: a current-thread runtime).
fn this_thread_cpu() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Db {
    layout: Layout,
    path: std::path::PathBuf,
    database: Database,
    store: RevealStore,
    /// The plain and bucketed layouts' writer, with the log writer's settings
    /// (one connection, 32 MiB of cache, checkpoints every 8,000 pages), and
    /// their reads' pool, with the shared pool's.
    writer: Option<SqlitePool>,
    reader: Option<SqlitePool>,
    written: u64,
    flushes: u64,
    /// The store's writer thread, for the shipped layouts.
    writer_tid: Option<String>,
}

async fn open(layout: Layout, dir: &std::path::Path) -> Db {
    let path = dir.join(format!("{}.db", layout.name()));
    let url = format!("sqlite://{}", path.display());
    let database = Database::connect(&url, 4).await.unwrap();
    database.migrate().await.unwrap();
    let store = database.reveals();
    let (mut writer, mut reader) = (None, None);
    let mut writer_tid = None;
    if matches!(
        layout,
        Layout::Shipped | Layout::ShippedNull | Layout::ShippedBucketed
    ) {
        if layout == Layout::ShippedBucketed {
            let conn = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(SqliteConnectOptions::from_str(&url).unwrap())
                .await
                .unwrap();
            for sql in [
                "ALTER TABLE reveal_seller_postings ADD COLUMN bucket INTEGER \
                 GENERATED ALWAYS AS (first_id >> 18) VIRTUAL",
                "DROP INDEX reveal_seller_postings_user",
                "CREATE INDEX reveal_seller_postings_user ON reveal_seller_postings \
                 (bucket, user_id, max_at_us, last_id, min_at_us, first_id)",
                "ALTER TABLE reveal_viewer_runs ADD COLUMN bucket INTEGER \
                 GENERATED ALWAYS AS (first_id >> 18) VIRTUAL",
                "DROP INDEX reveal_viewer_runs_viewer",
                "CREATE INDEX reveal_viewer_runs_viewer ON reveal_viewer_runs \
                 (bucket, viewer, max_at_us, last_id, min_at_us, first_id)",
            ] {
                query(sql).execute(&conn).await.unwrap();
            }
            conn.close().await;
        }
        // One reveal opens the store's writer, so its thread is known.
        let before = store_writers();
        let first = reveal_of((2, 2, 1), 0, 0).unwrap();
        store.write_reveals(&[first]).await.unwrap();
        writer_tid = store_writers().into_iter().find(|t| !before.contains(t));
    } else {
        let options = SqliteConnectOptions::from_str(&url)
            .unwrap()
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let name = layout.writer();
        let w = SqlitePoolOptions::new()
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(
                options
                    .clone()
                    .pragma("cache_size", "-32768")
                    .pragma("wal_autocheckpoint", "8000")
                    .thread_name(move |id| format!("{name}{id}")),
            )
            .await
            .unwrap();
        let schema: &[&str] = match layout {
            Layout::Plain => &[
                "CREATE INDEX reveals_user ON reveals (user_id, at_us)",
                "CREATE INDEX reveals_viewer ON reveals (viewer, at_us) WHERE viewer IS NOT NULL",
            ],
            Layout::Blob => &[
                "CREATE TABLE reveal_flushes (id INTEGER PRIMARY KEY, first_at_us INTEGER NOT NULL, \
                 last_at_us INTEGER NOT NULL, body BLOB NOT NULL)",
            ],
            _ => &[
                "ALTER TABLE reveals ADD COLUMN bucket INTEGER NOT NULL DEFAULT 0",
                "CREATE INDEX reveals_user ON reveals (bucket, user_id, at_us)",
                "CREATE INDEX reveals_viewer ON reveals (bucket, viewer, at_us) WHERE viewer IS NOT NULL",
            ],
        };
        for sql in [
            "DROP TABLE reveal_seller_postings",
            "DROP TABLE reveal_viewer_runs",
        ]
        .iter()
        .chain(schema)
        {
            query(sql).execute(&w).await.unwrap();
        }
        writer = Some(w);
        reader = Some(
            SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .unwrap(),
        );
    }
    Db {
        layout,
        path,
        database,
        store,
        writer,
        reader,
        written: 0,
        flushes: 0,
        writer_tid,
    }
}

/// `head VALUES (?,..),..`: as the store's `sqlite_insert`.
fn insert_sql(head: &str, columns: usize, rows: usize, tail: &str) -> String {
    let row = format!("({})", vec!["?"; columns].join(","));
    let mut sql = String::with_capacity(head.len() + 8 + rows * (row.len() + 1) + tail.len());
    sql.push_str(head);
    sql.push_str(" VALUES ");
    for i in 0..rows {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str(&row);
    }
    sql.push_str(tail);
    sql
}

/// As the store's `sqlite_chunks`: 4,096 rows, then powers of two.
fn chunks<T>(mut items: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        let n = 4_096.min(1 << items.len().ilog2());
        let (chunk, rest) = items.split_at(n);
        items = rest;
        Some(chunk)
    })
}

/// The plain and bucketed layouts' flush: the store's before 0007 (one
/// transaction: the rows in viewer, seller and time order, then the per-ad
/// counts), with the statements built as the store builds them now.
async fn write_plain(writer: &SqlitePool, layout: Layout, reveals: &[Reveal], before: u64) {
    let mut counts: foldhash::HashMap<(u64, &str), i64> = foldhash::HashMap::default();
    for r in reveals {
        *counts.entry((r.ad.get(), r.kind.as_str())).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_unstable();
    // The blob keeps arrival order: no sort.
    let mut ordered: Vec<&Reveal> = reveals.iter().filter(|_| layout != Layout::Blob).collect();
    ordered.sort_unstable_by(|a, b| {
        (a.viewer.as_ref().map(Viewer::as_str), a.user, a.at_us).cmp(&(
            b.viewer.as_ref().map(Viewer::as_str),
            b.user,
            b.at_us,
        ))
    });
    let bucketed = layout == Layout::Bucketed;
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await.unwrap();
    if layout == Layout::Blob {
        let body = packed(reveals);
        query("INSERT INTO reveal_flushes (first_at_us, last_at_us, body) VALUES (?, ?, ?)")
            .bind(reveals.first().map_or(0, |r| r.at_us))
            .bind(reveals.last().map_or(0, |r| r.at_us))
            .bind(body)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    for chunk in chunks(&ordered) {
        let sql = if bucketed {
            insert_sql(
                "INSERT OR FAIL INTO reveals (at_us, viewer, user_id, ad_id, category_id, kind, bucket)",
                7,
                chunk.len(),
                "",
            )
        } else {
            insert_sql(
                "INSERT OR FAIL INTO reveals (at_us, viewer, user_id, ad_id, category_id, kind)",
                6,
                chunk.len(),
                "",
            )
        };
        let mut q = query(&sql);
        for r in chunk {
            q = q
                .bind(r.at_us)
                .bind(r.viewer.as_ref().map(Viewer::as_str))
                .bind(r.user.get() as i64)
                .bind(r.ad.get() as i64)
                .bind(r.category.get() as i64)
                .bind(r.kind.as_str());
            if bucketed {
                q = q.bind((before >> BUCKET_SHIFT) as i64);
            }
        }
        q.execute(&mut *tx).await.unwrap();
    }
    for chunk in chunks(&counts) {
        let sql = insert_sql(
            "INSERT OR FAIL INTO ad_reveal_counts (ad_id, kind, n)",
            3,
            chunk.len(),
            " ON CONFLICT (ad_id, kind) DO UPDATE SET n = ad_reveal_counts.n + excluded.n",
        );
        let mut q = query(&sql);
        for ((ad, kind), n) in chunk {
            q = q.bind(*ad as i64).bind(*kind).bind(*n);
        }
        q.execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A flush's reveals in arrival order, packed: the viewers' dictionary, then
/// per reveal the step in `at_us`, the viewer's number (0: none), seller, ad,
/// category and kind.
fn packed(reveals: &[Reveal]) -> Vec<u8> {
    let mut out = Vec::with_capacity(reveals.len() * 12);
    let mut dictionary: foldhash::HashMap<&str, u64> = foldhash::HashMap::default();
    let mut names: Vec<&str> = Vec::new();
    let mut body = Vec::with_capacity(reveals.len() * 12);
    let mut at = reveals.first().map_or(0, |r| r.at_us);
    for r in reveals {
        put_varint(&mut body, r.at_us.abs_diff(at));
        at = r.at_us;
        let viewer = r.viewer.as_ref().map_or(0, |v| {
            *dictionary.entry(v.as_str()).or_insert_with(|| {
                names.push(v.as_str());
                names.len() as u64
            })
        });
        put_varint(&mut body, viewer);
        put_varint(&mut body, r.user.get());
        put_varint(&mut body, r.ad.get());
        put_varint(&mut body, r.category.get());
        body.push(r.kind.as_str().as_bytes()[0]);
    }
    put_varint(&mut out, names.len() as u64);
    for name in names {
        put_varint(&mut out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
    }
    out.extend_from_slice(&body);
    out
}

type Row = (i64, i64, Option<String>, i64, i64, i64, String);

/// One page, newest first, `(at_us, id)` of its rows.
async fn page(db: &Db, of: &RevealsOf, after: Option<(i64, i64)>) -> Vec<(i64, i64)> {
    let query_of = RevealQuery {
        after,
        ..RevealQuery::newest(of.clone(), PAGE)
    };
    let Some(reader) = &db.reader else {
        let rows = db.store.read_reveals(&query_of).await.unwrap();
        return rows.iter().map(|r| (r.reveal.at_us, r.id)).collect();
    };
    let (column, key_int, key_text) = match of {
        RevealsOf::Seller(user) => ("user_id", user.get() as i64, None),
        RevealsOf::Viewer(viewer) => ("viewer", 0, Some(viewer.as_str().to_owned())),
    };
    let (after_at, after_id) = after.unwrap_or((i64::MAX, i64::MAX));
    let key_text = key_text.as_deref();
    let bind = |sql: String| async move {
        let q = query_as::<_, Row>(&sql);
        let q = match key_text {
            Some(v) => q.bind(v),
            None => q.bind(key_int),
        };
        q.fetch_all(reader).await.unwrap()
    };
    if db.layout == Layout::Plain {
        let rows = bind(format!(
            "SELECT id, at_us, viewer, user_id, ad_id, category_id, kind FROM reveals \
             WHERE {column} = $1 AND (at_us, id) < ({after_at}, {after_id}) \
             ORDER BY at_us DESC, id DESC LIMIT {PAGE}"
        ))
        .await;
        return rows.iter().map(|r| (r.1, r.0)).collect();
    }
    // Bucketed: the buckets newest first, from the cursor's, until the page is
    // full (a bucket's reveals are all newer than an older bucket's). The
    // newest and oldest are index lookups, the cursor's a row by id.
    let (top,): (Option<i64>,) = query_as("SELECT max(bucket) FROM reveals")
        .fetch_one(reader)
        .await
        .unwrap();
    let (low,): (Option<i64>,) = query_as("SELECT min(bucket) FROM reveals")
        .fetch_one(reader)
        .await
        .unwrap();
    let (Some(top), Some(low)) = (top, low) else {
        return Vec::new();
    };
    let mut bucket = match after {
        Some((_, id)) => query_as::<_, (i64,)>("SELECT bucket FROM reveals WHERE id = $1")
            .bind(id)
            .fetch_optional(reader)
            .await
            .unwrap()
            .map_or(top, |(b,)| b),
        None => top,
    };
    let mut out = Vec::new();
    while bucket >= low && out.len() < PAGE as usize {
        let want = PAGE as usize - out.len();
        let rows = bind(format!(
            "SELECT id, at_us, viewer, user_id, ad_id, category_id, kind FROM reveals \
             WHERE bucket = {bucket} AND {column} = $1 AND (at_us, id) < ({after_at}, {after_id}) \
             ORDER BY at_us DESC, id DESC LIMIT {want}"
        ))
        .await;
        out.extend(rows.iter().map(|r| (r.1, r.0)));
        bucket -= 1;
    }
    out
}

fn quantiles(mut times: Vec<Duration>) -> (Duration, Duration) {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

async fn reads(dbs: &[Db], targets: &[(String, RevealsOf)], rounds: usize) {
    for (label, of) in targets {
        for db in dbs.iter().filter(|db| {
            !matches!(
                db.layout,
                Layout::Blob | Layout::ShippedBucketed | Layout::ShippedNull
            )
        }) {
            // The first page, then the page after it (the cursor a client sends).
            let first = page(db, of, None).await;
            let cursor = first.get(PAGE as usize - 2).copied();
            let mut times = [Vec::new(), Vec::new()];
            for _ in 0..rounds {
                let t = Instant::now();
                let rows = page(db, of, None).await;
                times[0].push(t.elapsed());
                assert_eq!(
                    rows,
                    first,
                    "{} {label}: a page is stable",
                    db.layout.name()
                );
                if let Some(c) = cursor {
                    let t = Instant::now();
                    page(db, of, Some(c)).await;
                    times[1].push(t.elapsed());
                }
            }
            let [one, two] = times;
            let (p50, p99) = quantiles(one);
            let next = if two.is_empty() {
                "no second page".to_owned()
            } else {
                let (a, b) = quantiles(two);
                format!("second page p50 {a:.2?} p99 {b:.2?}")
            };
            println!(
                "{:>9} | {label}: {} rows, first page p50 {p50:.2?} p99 {p99:.2?}; {next}",
                db.layout.name(),
                first.len()
            );
        }
    }
    for db in dbs {
        let ad = AdId::new(1).unwrap();
        let mut times = Vec::new();
        for _ in 0..rounds {
            let t = Instant::now();
            db.store.ad_reveal_counts(ad).await.unwrap();
            times.push(t.elapsed());
        }
        let (p50, p99) = quantiles(times);
        println!(
            "{:>9} | by ad (the counts of the top ad): p50 {p50:.2?} p99 {p99:.2?}",
            db.layout.name()
        );
    }
}

fn file_bytes(path: &std::path::Path) -> u64 {
    let wal = path.with_extension("db-wal");
    [path.to_path_buf(), wal]
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let env = |key: &str, bench: u64, small: u64| {
        std::env::var(key)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if smoke { small } else { bench })
    };
    let total = env("REVEAL_LAYOUT_TOTAL", 4_000_000, 40_000);
    let flush = env("REVEAL_LAYOUT_FLUSH", 30_000, 5_000) as usize;
    let segment = env("REVEAL_LAYOUT_SEGMENT", 1_000_000, 20_000);
    let rounds = if smoke { 5 } else { 200 };
    let stream = load_stream(smoke);
    let base = std::env::var("REVEAL_LAYOUT_DIR").map_or_else(
        |_| tempfile::tempdir().unwrap(),
        |d| tempfile::tempdir_in(d).unwrap(),
    );
    // The sellers to read: the sale's, one of the stream's 100th most
    // frequent, and one seen once in it.
    let mut seen: HashMap<u64, u64> = HashMap::new();
    for &(user, ..) in &stream {
        *seen.entry(user).or_default() += 1;
    }
    let mut by_count: Vec<(u64, u64)> = seen.iter().map(|(&u, &n)| (n, u)).collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    let warm = by_count[100.min(by_count.len() - 1)];
    let cold = by_count
        .iter()
        .find(|(n, u)| *n == 1 && u % 50 != 0)
        .copied()
        .unwrap_or(by_count[by_count.len() - 1]);
    let seller = |u: u64| RevealsOf::Seller(UserId::new(u).unwrap());
    let targets = vec![
        (
            format!(
                "seller {HOT_SELLER} (the sale's, {} of the stream's lines)",
                seen.get(&HOT_SELLER).copied().unwrap_or(0)
            ),
            seller(HOT_SELLER),
        ),
        (
            format!("seller {} ({} of the stream's lines)", warm.1, warm.0),
            seller(warm.1),
        ),
        (
            format!("seller {} (1 of the stream's lines)", cold.1),
            seller(cold.1),
        ),
        (
            "viewer-1".to_owned(),
            RevealsOf::Viewer(Viewer::parse(b"viewer-1").unwrap()),
        ),
    ];
    println!(
        "stream: {} lines, {} sellers; flushes of {flush} reveals a second apart, {total} reveals a layout in segments of {segment}",
        stream.len(),
        seen.len()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut dbs = Vec::new();
        let only = std::env::var("REVEAL_LAYOUT_ONLY").ok();
        for layout in [
            Layout::Shipped,
            Layout::ShippedNull,
            Layout::ShippedBucketed,
            Layout::Plain,
            Layout::Bucketed,
            Layout::Blob,
        ] {
            if only
                .as_deref()
                .is_some_and(|only| !only.split(',').any(|name| name == layout.name()))
            {
                continue;
            }
            dbs.push(open(layout, base.path()).await);
        }
        let start_us = phones_gateway::reveals::now_us() - 30 * 86_400_000_000;
        let mut done = 0u64;
        let mut read_done = false;
        while done < total {
            let upto = (done + segment).min(total);
            for db in &mut dbs {
                let (w_cpu0, w_bytes0) = of_threads(db.layout.writer(), db.writer_tid.as_deref());
                let me0 = this_thread_cpu();
                let wall = Instant::now();
                let mut n = done;
                while n < upto {
                    let at0 = start_us + db.flushes as i64 * 1_000_000;
                    let batch: Vec<Reveal> = (0..flush as u64)
                        .take_while(|i| n + i < upto)
                        .filter_map(|i| {
                            let k = n + i;
                            let at = at0 + (i as i64 * 1_000_000) / flush as i64;
                            let reveal =
                                reveal_of(stream[(k % stream.len() as u64) as usize], k, at)?;
                            Some(match db.layout {
                                Layout::ShippedNull => Reveal {
                                    reason: None,
                                    ..reveal
                                },
                                _ => reveal,
                            })
                        })
                        .collect();
                    let len = (upto - n).min(flush as u64);
                    match &db.writer {
                        None => db.store.write_reveals(&batch).await.unwrap(),
                        Some(w) => write_plain(w, db.layout, &batch, db.written).await,
                    }
                    db.written += batch.len() as u64;
                    n += len;
                    db.flushes += 1;
                }
                let wall = wall.elapsed();
                let (w_cpu1, w_bytes1) = of_threads(db.layout.writer(), db.writer_tid.as_deref());
                let me1 = this_thread_cpu();
                let lines = (upto - done) as f64;
                println!(
                    "{:>9} | lines {done}..{upto}: writer {:.2} us/reveal, flush side {:.2} us/reveal, writer wrote {:.0} B/reveal; file {:.0} B/reveal of {} written; wall {wall:.2?}",
                    db.layout.name(),
                    (w_cpu1 - w_cpu0) as f64 / 1e3 / lines,
                    (me1 - me0) as f64 / 1e3 / lines,
                    (w_bytes1 - w_bytes0) as f64 / lines,
                    file_bytes(&db.path) as f64 / db.written as f64,
                    db.written,
                );
            }
            done = upto;
            if !read_done && done >= segment {
                println!("reads at {done} lines:");
                reads(&dbs, &targets, rounds).await;
                read_done = true;
            }
        }
        println!("reads at {done} lines:");
        reads(&dbs, &targets, rounds).await;
        for db in dbs {
            db.database.close().await;
            if let Some(w) = db.writer {
                w.close().await;
            }
            if let Some(r) = db.reader {
                r.close().await;
            }
        }
    });
}
