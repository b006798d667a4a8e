//! SQLite's multi-row inserts, shared by the log's writer and its indexes
//! (the viewers' runs, the sellers' postings): a batch in chunks of a power
//! of two rows, and the statement text for a chunk.

/// The most rows one SQLite insert takes: six parameters a row, under SQLite's
/// limit of 32,766 per statement. A batch goes in statements of a power of two
/// rows (4,096, then the binary digits of the rest: see [`sqlite_chunks`]), so
/// that a replica prepares at most thirteen statements and keeps them cached,
/// rather than a new one for each flush's last chunk.
const SQLITE_ROWS_PER_INSERT: usize = 4_096;

/// `items` in chunks of [`SQLITE_ROWS_PER_INSERT`], then of decreasing powers
/// of two: 10,000 rows are 4,096 + 4,096 + 1,024 + 512 + 256 + 16.
pub(super) fn sqlite_chunks<T>(mut items: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        let n = SQLITE_ROWS_PER_INSERT.min(1 << items.len().ilog2());
        let (chunk, rest) = items.split_at(n);
        items = rest;
        Some(chunk)
    })
}

/// `head VALUES (?,..),.. tail`: an insert of `rows` rows of `columns` values,
/// written with `push_str` alone. sqlx's `QueryBuilder` writes each separator
/// through `write!`, seven a reveal, which with the sort was most of the flush
/// thread's profile at the hit path's maximum.
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
        let sizes: Vec<usize> = sqlite_chunks(&rows).map(<[u32]>::len).collect();
        assert_eq!(sizes, [4_096, 4_096, 1_024, 512, 256, 16]);
        let again: Vec<u32> = sqlite_chunks(&rows).flatten().copied().collect();
        assert_eq!(again, rows, "every row once, in order");
        assert_eq!(sqlite_chunks::<u32>(&[]).count(), 0);
        assert_eq!(
            sqlite_chunks(&[1]).map(<[i32]>::len).collect::<Vec<_>>(),
            [1]
        );
    }
}
