//! SQLite's way to a viewer's reveals: runs, not an index entry per reveal
//! (migrations/sqlite/0007). A flush writes its reveals in viewer order with
//! ids it assigns, so one viewer's reveals of one flush are consecutive ids: a
//! run, one row of `reveal_viewer_runs` with its id range and its newest and
//! oldest `at_us`. A viewer seen many times a flush costs one index entry a
//! flush instead of one a reveal; the index entry per reveal was most of what
//! the log cost the hit path, in b-tree inserts (docs/performance.md, "The
//! reveal log's SQLite layout").
//!
//! A page is still exact and newest first: runs are walked by their newest
//! reveal, descending, and once the page is full and its oldest reveal is newer
//! than the next run's newest, no run left can hold one that belongs on it.
//! The price is on reads: a page reads whole runs (a few rows more than it
//! answers) and skips the index entries of runs newer than its cursor.
//! PostgreSQL keeps its viewer index: COPY made it cheap enough there.

use sqlx::SqliteConnection;

use super::{RevealRow, sqlite_chunks, sqlite_insert};
use crate::domain::{Reveal, RevealQuery, Viewer};

/// Runs a page reads first; doubled each time the page is not yet settled, up
/// to [`MOST_RUNS`]: a viewer seen once a flush needs about one run a row, one
/// seen hundreds of times a flush fills a page from one or two.
const FIRST_RUNS: usize = 16;
const MOST_RUNS: usize = 1_024;

/// One viewer's reveals of one flush: the ids `first_id..=last_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Run<'a> {
    pub viewer: &'a str,
    pub max_at_us: i64,
    pub min_at_us: i64,
    pub first_id: i64,
    pub last_id: i64,
}

/// The runs of a flush: `rows` are its reveals with the ids they are written
/// under, in viewer order. Reveals without a viewer are in none.
pub(super) fn runs_of<'a>(rows: &[(i64, &'a Reveal)]) -> Vec<Run<'a>> {
    let mut runs: Vec<Run<'a>> = Vec::new();
    for &(id, reveal) in rows {
        let Some(viewer) = reveal.viewer.as_ref().map(Viewer::as_str) else {
            continue;
        };
        match runs.last_mut() {
            Some(run) if run.viewer == viewer && run.last_id + 1 == id => {
                run.last_id = id;
                run.max_at_us = run.max_at_us.max(reveal.at_us);
                run.min_at_us = run.min_at_us.min(reveal.at_us);
            }
            _ => runs.push(Run {
                viewer,
                max_at_us: reveal.at_us,
                min_at_us: reveal.at_us,
                first_id: id,
                last_id: id,
            }),
        }
    }
    runs
}

/// Writes `runs` (in the flush's transaction).
pub(super) async fn write(
    conn: &mut SqliteConnection,
    runs: &[Run<'_>],
) -> Result<(), sqlx::Error> {
    for chunk in sqlite_chunks(runs) {
        let sql = sqlite_insert(
            "INSERT OR FAIL INTO reveal_viewer_runs \
             (viewer, max_at_us, min_at_us, first_id, last_id)",
            5,
            chunk.len(),
            "",
        );
        let mut query = sqlx::query(&sql);
        for run in chunk {
            query = query
                .bind(run.viewer)
                .bind(run.max_at_us)
                .bind(run.min_at_us)
                .bind(run.first_id)
                .bind(run.last_id);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// One page of `viewer`'s reveals, newest first (see the module doc). `conn`
/// should hold a transaction, so that runs and rows are read from one commit.
pub(super) async fn read_page(
    conn: &mut SqliteConnection,
    viewer: &str,
    query: &RevealQuery,
) -> Result<Vec<RevealRow>, sqlx::Error> {
    let (after_at, after_id) = query.after.unwrap_or((i64::MAX, i64::MAX));
    let limit = usize::try_from(query.limit).unwrap_or(usize::MAX);
    let mut rows: Vec<RevealRow> = Vec::new();
    // The runs still to walk are those before `from` (newest, last id).
    let mut from = (i64::MAX, i64::MAX);
    let mut take = FIRST_RUNS;
    if limit == 0 {
        return Ok(rows);
    }
    loop {
        // A run can hold a row of the page only if it reaches into the window
        // and holds something no newer than the cursor.
        let runs: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT max_at_us, last_id, first_id FROM reveal_viewer_runs \
             WHERE viewer = $1 AND (max_at_us, last_id) < ($2, $3) \
             AND max_at_us >= $4 AND min_at_us < $5 AND min_at_us <= $6 \
             ORDER BY max_at_us DESC, last_id DESC LIMIT $7",
        )
        .bind(viewer)
        .bind(from.0)
        .bind(from.1)
        .bind(query.since_us)
        .bind(query.until_us)
        .bind(after_at)
        .bind(i64::try_from(take + 1).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await?;
        let (these, next) = runs.split_at(runs.len().min(take));
        for &(_, last_id, first_id) in these {
            let found: Vec<RevealRow> = sqlx::query_as(
                "SELECT id, at_us, viewer, user_id, ad_id, category_id, kind FROM reveals \
                 WHERE id >= $1 AND id <= $2 AND viewer = $3 \
                 AND at_us >= $4 AND at_us < $5 AND (at_us, id) < ($6, $7)",
            )
            .bind(first_id)
            .bind(last_id)
            .bind(viewer)
            .bind(query.since_us)
            .bind(query.until_us)
            .bind(after_at)
            .bind(after_id)
            .fetch_all(&mut *conn)
            .await?;
            rows.extend(found);
        }
        rows.sort_unstable_by_key(|r| std::cmp::Reverse((r.1, r.0)));
        // A row in two runs (never written so; cheap to rule out) shows once.
        rows.dedup_by_key(|r| r.0);
        rows.truncate(limit);
        let (Some(&(next_newest, ..)), Some(&(seen_newest, seen_last_id, _))) =
            (next.first(), these.last())
        else {
            break;
        };
        // Every run left is no newer than the next one.
        if rows.len() == limit && rows[limit - 1].1 > next_newest {
            break;
        }
        from = (seen_newest, seen_last_id);
        take = (take * 2).min(MOST_RUNS);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{delete_every_reveal, rows, scan, walk};
    use super::*;
    use crate::domain::{AdId, CategoryId, RevealsOf, Source, UserId};

    fn reveal(at_us: i64, viewer: Option<&str>) -> Reveal {
        Reveal {
            at_us,
            viewer: viewer.map(|v| Viewer::parse(v.as_bytes()).unwrap()),
            user: UserId::new(1).unwrap(),
            ad: AdId::new(1).unwrap(),
            category: CategoryId::new(1).unwrap(),
            kind: Source::Real,
        }
    }

    /// A page walk through runs against the plain query over every row: the
    /// same reveals in the same order, for every viewer, window and page size.
    /// The clock steps back across flushes and instants repeat, so runs
    /// overlap in time and ties fall to the id.
    #[tokio::test]
    async fn pages_through_runs_are_those_of_a_scan_of_every_row() {
        let (_dir, database) = crate::store::Database::scratch().await;
        let store = database.reveals();
        let mut seed: u64 = 7;
        let mut next = move |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let viewers = [Some("a"), Some("b"), Some("c"), None];
        // Forty flushes of a few reveals a viewer: more runs than a page's
        // first look, each overlapping the ten flushes around it in time.
        for flush in 0..40i64 {
            let batch: Vec<Reveal> = (0..12)
                .map(|_| {
                    let at = flush * 20 + i64::try_from(next(20)).unwrap() * 10 - 100;
                    let viewer = viewers[usize::try_from(next(4)).unwrap()];
                    reveal(1_000_000 + at, viewer)
                })
                .collect();
            store.write_reveals(&batch).await.unwrap();
        }
        // Retention of part of the log, so some runs are gone and some cut.
        assert_eq!(
            store
                .delete_reveals_older_than(std::time::Duration::ZERO, 150)
                .await
                .unwrap(),
            150
        );
        let windows = [
            (i64::MIN, i64::MAX),
            (1_000_100, 1_000_400),
            (1_000_250, 1_000_260),
        ];
        for viewer in ["a", "b", "c", "nobody"] {
            let of = RevealsOf::Viewer(Viewer::parse(viewer.as_bytes()).unwrap());
            for (since, until) in windows {
                let expected = scan(&store, &of, since, until).await;
                for limit in [1, 3, 7, 50, 1000] {
                    let got = walk(&store, &of, since, until, limit).await;
                    assert_eq!(got, expected, "{viewer} {since}..{until} by {limit}");
                }
            }
        }
    }

    /// Retention takes the runs whose reveals are all gone, and only those.
    #[tokio::test]
    async fn retention_deletes_the_runs_of_deleted_reveals() {
        let (_dir, database) = crate::store::Database::scratch().await;
        let store = database.reveals();
        for _ in 0..3 {
            let batch: Vec<Reveal> = ["a", "a", "b", "c", "c", "c"]
                .iter()
                .map(|v| reveal(1_000_000, Some(v)))
                .collect();
            store.write_reveals(&batch).await.unwrap();
        }
        assert_eq!(rows(&store, "reveal_viewer_runs").await, 9);
        // Ids 1..=7: the first flush's runs (a, b, c) and the second's "a"
        // (ids 7 and 8) is cut, not gone.
        store
            .delete_reveals_older_than(std::time::Duration::ZERO, 7)
            .await
            .unwrap();
        assert_eq!(rows(&store, "reveal_viewer_runs").await, 6);
        delete_every_reveal(&store).await;
        assert_eq!(rows(&store, "reveal_viewer_runs").await, 0);
    }

    #[test]
    fn a_run_is_one_viewers_consecutive_ids() {
        let batch = [
            reveal(5, None),
            reveal(7, Some("a")),
            reveal(3, Some("a")),
            reveal(9, Some("b")),
            reveal(1, Some("b")),
        ];
        let rows: Vec<(i64, &Reveal)> = (10..).zip(&batch).collect();
        let runs = runs_of(&rows);
        assert_eq!(
            runs,
            [
                Run {
                    viewer: "a",
                    max_at_us: 7,
                    min_at_us: 3,
                    first_id: 11,
                    last_id: 12
                },
                Run {
                    viewer: "b",
                    max_at_us: 9,
                    min_at_us: 1,
                    first_id: 13,
                    last_id: 14
                },
            ]
        );
        // A gap in the ids starts a new run, even for the same viewer.
        let gapped: Vec<(i64, &Reveal)> = vec![(1, &batch[1]), (3, &batch[2])];
        assert_eq!(runs_of(&gapped).len(), 2);
    }
}
