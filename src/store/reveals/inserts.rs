//! SQLite's multi-row inserts, shared by the log's writer and its indexes.

/// The most rows one SQLite insert takes. Chunks are powers of two, so a
/// replica prepares at most thirteen statements a table and keeps them cached.
const SQLITE_ROWS_PER_INSERT: usize = 4_096;

/// SQLite's limit on the parameters of one statement (its default since 3.32).
const SQLITE_MAX_PARAMETERS: usize = 32_766;

fn most_rows(columns: usize) -> usize {
    let fit = SQLITE_MAX_PARAMETERS / columns.max(1);
    SQLITE_ROWS_PER_INSERT.min(1 << fit.ilog2())
}

/// `items` in chunks of [`most_rows`], then of decreasing powers of two.
pub(super) fn sqlite_chunks<T>(mut items: &[T], columns: usize) -> impl Iterator<Item = &[T]> {
    let most = most_rows(columns);
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        let n = most.min(1 << items.len().ilog2());
        let (chunk, rest) = items.split_at(n);
        items = rest;
        Some(chunk)
    })
}

/// `head VALUES (?,..),.. tail`, written with `push_str` alone: sqlx's
/// `QueryBuilder` formats each separator, which was costly at a flush's size.
pub(super) fn sqlite_insert(head: &str, columns: usize, rows: usize, tail: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_insert_has_a_placeholder_per_value() {
        assert_eq!(
            sqlite_insert("INSERT INTO t (a, b)", 2, 3, " ON CONFLICT DO NOTHING"),
            "INSERT INTO t (a, b) VALUES (?,?),(?,?),(?,?) ON CONFLICT DO NOTHING"
        );
    }

    #[test]
    fn sqlite_chunks_are_powers_of_two_at_most_the_limit() {
        let rows: Vec<u32> = (0..10_000).collect();
        let sizes: Vec<usize> = sqlite_chunks(&rows, 6).map(<[u32]>::len).collect();
        assert_eq!(sizes, [4_096, 4_096, 1_024, 512, 256, 16]);
        let again: Vec<u32> = sqlite_chunks(&rows, 6).flatten().copied().collect();
        assert_eq!(again, rows, "every row once, in order");
        assert_eq!(sqlite_chunks::<u32>(&[], 6).count(), 0);
        let one: Vec<usize> = sqlite_chunks(&[1], 6).map(<[i32]>::len).collect();
        assert_eq!(one, [1]);
        // Eight values a row: 4,096 rows would be 32,768 parameters.
        let sizes: Vec<usize> = sqlite_chunks(&rows, 8).map(<[u32]>::len).collect();
        assert_eq!(sizes[..4], [2_048; 4]);
        for columns in 1..=16 {
            assert!(most_rows(columns) * columns <= SQLITE_MAX_PARAMETERS);
            assert!(
                most_rows(columns) * 2 * columns > SQLITE_MAX_PARAMETERS
                    || most_rows(columns) == SQLITE_ROWS_PER_INSERT
            );
        }
    }
}
