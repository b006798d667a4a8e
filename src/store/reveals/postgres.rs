//! The reveal log on PostgreSQL: a flush is one `COPY` and one upsert of its counts.

use super::{RevealRow, reason_column};
use crate::domain::{AdId, Reveal, RevealQuery, RevealsOf, Source, Viewer};
use crate::store::error::StoreError;
use crate::store::pool::{Pg, signed};

pub(super) async fn write(
    pg: &Pg,
    reveals: &[Reveal],
    counts: &[(AdId, Source, u64)],
) -> Result<(), StoreError> {
    let mut tx = pg.begin().await?;
    let mut copy = tx
        .copy_in_raw(
            "COPY reveals (at_us, viewer, user_id, ad_id, category_id, kind, reason) FROM STDIN",
        )
        .await?;
    copy.send(copy_text(reveals).as_bytes()).await?;
    copy.finish().await?;
    let ads: Vec<i64> = counts.iter().map(|c| signed(c.0.get())).collect();
    let kinds: Vec<&str> = counts.iter().map(|c| c.1.as_str()).collect();
    let ns: Vec<i64> = counts.iter().map(|c| signed(c.2)).collect();
    sqlx::query(
        "INSERT INTO ad_reveal_counts (ad_id, kind, n) \
         SELECT * FROM UNNEST($1::int8[], $2::text[], $3::int8[]) \
         ON CONFLICT (ad_id, kind) DO UPDATE SET n = ad_reveal_counts.n + excluded.n",
    )
    .persistent(false)
    .bind(&ads)
    .bind(&kinds)
    .bind(&ns)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

enum ColumnValue {
    Int(i64),
    Text(String),
}

pub(super) async fn read(pg: &Pg, query: &RevealQuery) -> Result<Vec<RevealRow>, StoreError> {
    let (column, key) = match &query.of {
        RevealsOf::Seller(user) => ("user_id", ColumnValue::Int(signed(user.get()))),
        RevealsOf::Viewer(viewer) => ("viewer", ColumnValue::Text(viewer.as_str().to_owned())),
    };
    let (after_at, after_id) = query.after.unwrap_or((i64::MAX, i64::MAX));
    // `reason` is an `integer` (int4), read as the row type's int8.
    let sql = format!(
        "SELECT id, at_us, viewer, user_id, ad_id, category_id, kind, reason::int8 FROM reveals \
         WHERE {column} = $1 AND at_us >= $2 AND at_us < $3 AND (at_us, id) < ($4, $5) \
         ORDER BY at_us DESC, id DESC LIMIT $6"
    );
    let mut tx = pg.begin().await?;
    let q = sqlx::query_as(&sql).persistent(false);
    let q = match key {
        ColumnValue::Int(v) => q.bind(v),
        ColumnValue::Text(v) => q.bind(v),
    };
    let rows = q
        .bind(query.since_us)
        .bind(query.until_us)
        .bind(after_at)
        .bind(after_id)
        .bind(i64::from(query.limit))
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows)
}

pub(super) async fn delete_older_than(
    pg: &Pg,
    keep_us: i64,
    batch: i64,
) -> Result<u64, StoreError> {
    // `now()` is the transaction's start, a moment ago.
    let mut tx = pg.begin().await?;
    let deleted = sqlx::query(
        "DELETE FROM reveals WHERE id IN \
         (SELECT id FROM reveals \
          WHERE at_us < (EXTRACT(EPOCH FROM now()) * 1000000)::int8 - $1 \
          ORDER BY at_us LIMIT $2)",
    )
    .persistent(false)
    .bind(keep_us)
    .bind(batch)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(deleted)
}

/// Reveals in COPY's text format: tab-separated, `\N` for null; a backslash
/// is the one character of a viewer id (visible ASCII) to escape.
pub(super) fn copy_text(reveals: &[Reveal]) -> String {
    let mut text = String::with_capacity(reveals.len() * 64);
    let mut number = itoa::Buffer::new();
    for r in reveals {
        text.push_str(number.format(r.at_us));
        text.push('\t');
        match r.viewer.as_ref().map(Viewer::as_str) {
            Some(viewer) if viewer.contains('\\') => {
                text.push_str(&viewer.replace('\\', "\\\\"));
            }
            Some(viewer) => text.push_str(viewer),
            None => text.push_str("\\N"),
        }
        for id in [r.user.get(), r.ad.get(), r.category.get()] {
            text.push('\t');
            text.push_str(number.format(id));
        }
        text.push('\t');
        text.push_str(r.kind.as_str());
        text.push('\t');
        match reason_column(r) {
            Some(bits) => text.push_str(number.format(bits)),
            None => text.push_str("\\N"),
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::reason::{Origin, Reason};
    use crate::store::reveals::tests::reveal;

    #[test]
    fn copy_text_escapes_and_marks_nulls() {
        let upstream = Reason::new(Origin::Upstream);
        let text = copy_text(&[
            reveal(1, Source::RealPhone, Some("a\\b")),
            Reveal {
                reason: Some(upstream),
                ..reveal(2, Source::Anonymous, None)
            },
            Reveal {
                reason: Some(Reason::new(Origin::Cache)),
                ..reveal(3, Source::Calltracking, Some("v-1"))
            },
        ]);
        assert_eq!(upstream.encode(), 4096);
        assert_eq!(
            text,
            "1700000000000000\ta\\\\b\t42\t1\t9\treal\t\\N\n\
             1700000000000000\t\\N\t42\t2\t9\tanonymous\t4096\n\
             1700000000000000\tv-1\t42\t3\t9\tcalltracking\t0\n"
        );
    }
}
