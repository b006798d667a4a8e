//! SQLite's way to a viewer's reveals (migrations/sqlite/0007): a flush's reveals
//! are in viewer order, so one viewer's are consecutive ids, a run.

use sqlx::SqliteConnection;

use super::buckets;
use super::inserts::{sqlite_chunks, sqlite_insert};
use super::{REVEAL_COLUMNS, RevealRow};
use crate::domain::{Reveal, RevealQuery, Viewer};

/// Runs a page reads first; doubled while the page is not settled, up to [`MOST_RUNS`].
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

/// The runs of a flush, `rows` in viewer order; a reveal without a viewer is in none.
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

pub(super) async fn write(
    conn: &mut SqliteConnection,
    runs: &[Run<'_>],
) -> Result<(), sqlx::Error> {
    for chunk in sqlite_chunks(runs, 5) {
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

/// One page of `viewer`'s reveals, newest first, bucket by bucket until
/// settled. `conn` should hold a transaction: runs and rows of one commit.
pub(super) async fn read_page(
    conn: &mut SqliteConnection,
    viewer: &str,
    query: &RevealQuery,
) -> Result<Vec<RevealRow>, sqlx::Error> {
    let limit = usize::try_from(query.limit).unwrap_or(usize::MAX);
    let mut rows: Vec<RevealRow> = Vec::new();
    if limit == 0 {
        return Ok(rows);
    }
    // Not checked against the lowest id left: rows are read by id range.
    let to_walk = buckets::to_walk(conn, buckets::Key::Viewer(viewer), query, i64::MIN).await?;
    for bucket in to_walk {
        if bucket.settles(rows.last().map(|r| r.1), rows.len() == limit) {
            break;
        }
        walk_bucket(conn, (viewer, bucket.bucket), query, limit, &mut rows).await?;
    }
    Ok(rows)
}

/// Adds to `rows` those of one bucket's runs that belong on the page, runs
/// walked by their newest reveal, descending, until settled.
async fn walk_bucket(
    conn: &mut SqliteConnection,
    (viewer, bucket): (&str, i64),
    query: &RevealQuery,
    limit: usize,
    rows: &mut Vec<RevealRow>,
) -> Result<(), sqlx::Error> {
    let (after_at, after_id) = query.after.unwrap_or((i64::MAX, i64::MAX));
    let rows_of_run = format!(
        "SELECT {REVEAL_COLUMNS} FROM reveals \
         WHERE id >= $1 AND id <= $2 AND viewer = $3 \
         AND at_us >= $4 AND at_us < $5 AND (at_us, id) < ($6, $7)"
    );
    // A run can hold a row of the page only if it reaches into the window and
    // holds something no newer than the cursor.
    let runs_before = format!(
        "SELECT max_at_us, last_id, first_id FROM reveal_viewer_runs \
         WHERE {} = $8 AND viewer = $1 AND (max_at_us, last_id) < ($2, $3) \
         AND max_at_us >= $4 AND min_at_us < $5 AND min_at_us <= $6 \
         ORDER BY max_at_us DESC, last_id DESC LIMIT $7",
        buckets::OF_FIRST_ID
    );
    // The runs still to walk are those before `from` (newest, last id).
    let mut from = (i64::MAX, i64::MAX);
    let mut take = FIRST_RUNS;
    loop {
        let runs: Vec<(i64, i64, i64)> = sqlx::query_as(&runs_before)
            .bind(viewer)
            .bind(from.0)
            .bind(from.1)
            .bind(query.since_us)
            .bind(query.until_us)
            .bind(after_at)
            .bind(i64::try_from(take + 1).unwrap_or(i64::MAX))
            .bind(bucket)
            .fetch_all(&mut *conn)
            .await?;
        let (these, next) = runs.split_at(runs.len().min(take));
        for &(_, last_id, first_id) in these {
            let found: Vec<RevealRow> = sqlx::query_as(&rows_of_run)
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
            return Ok(());
        };
        // Every run left in the bucket is no newer than the next one.
        if rows.len() == limit && rows[limit - 1].1 > next_newest {
            return Ok(());
        }
        from = (seen_newest, seen_last_id);
        take = (take * 2).min(MOST_RUNS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reveals::tests::reveal_at;

    fn reveal(at_us: i64, viewer: Option<&str>) -> Reveal {
        reveal_at(at_us, 1, viewer)
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
        let run = |viewer, max_at_us, min_at_us, first_id, last_id| Run {
            viewer,
            max_at_us,
            min_at_us,
            first_id,
            last_id,
        };
        assert_eq!(runs, [run("a", 7, 3, 11, 12), run("b", 9, 1, 13, 14)]);
        // A gap in the ids starts a new run, even for the same viewer.
        let gapped: Vec<(i64, &Reveal)> = vec![(1, &batch[1]), (3, &batch[2])];
        assert_eq!(runs_of(&gapped).len(), 2);
    }
}
