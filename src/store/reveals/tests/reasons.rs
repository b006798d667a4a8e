//! The reasons stored with the reveals, read back as they were written.

use super::{every_page, exec, migrate_from, migrated_before, reveal, reveal_at, scratch};
use super::{seller, sqlite, store_on, viewer};
use crate::domain::reason::{Failure, Origin, Reason, Skip};
use crate::domain::{Reveal, RevealQuery, Source};

/// Reasons of every shape the rules give, and none.
fn some_reasons() -> Vec<Option<Reason>> {
    use Source::{Anonymous, Calltracking, RealPhone};
    vec![
        Some(Reason::new(Origin::Cache)),
        Some(Reason::new(Origin::Upstream).skipped(Anonymous, Skip::NotApplicable)),
        Some(
            Reason::new(Origin::Cache)
                .skipped(Anonymous, Skip::NoNumber)
                .skipped(Calltracking, Skip::Failed(Failure::CircuitOpen)),
        ),
        Some(
            Reason::new(Origin::Stale(Failure::Deadline))
                .skipped(Calltracking, Skip::Failed(Failure::Timeout))
                .skipped(Anonymous, Skip::NotApplicable),
        ),
        Some(Reason::new(Origin::Phone).skipped(RealPhone, Skip::Failed(Failure::Rejected))),
        None,
    ]
}

/// Each reason is read back as written, by seller and by viewer.
#[tokio::test]
async fn a_reason_is_read_back_as_it_was_written() {
    let (_dir, store) = scratch().await;
    let reasons = some_reasons();
    let viewers = [Some("a"), Some("b"), None];
    // Three flushes, so that pages cross postings and runs.
    let mut written: Vec<Reveal> = Vec::new();
    for flush in 0..3u64 {
        let batch: Vec<Reveal> = (0..12u64)
            .map(|n| Reveal {
                at_us: 1_700_000_000_000_000 + i64::try_from(flush * 100 + n).unwrap(),
                reason: reasons[usize::try_from((flush + n) % 6).unwrap()],
                ..reveal(
                    1 + flush * 100 + n,
                    Source::RealPhone,
                    viewers[(n % 3) as usize],
                )
            })
            .collect();
        store.write_reveals(&batch).await.unwrap();
        written.extend(batch);
    }
    let reason_of_ad = |ad: u64| written.iter().find(|r| r.ad.get() == ad).unwrap().reason;
    let by_seller = every_page(&store, seller(42), 5).await;
    let by_viewer = every_page(&store, viewer("b"), 5).await;
    assert_eq!(by_seller.len(), written.len());
    assert_eq!(by_viewer.len(), 12);
    for row in by_seller.iter().chain(&by_viewer) {
        let written = reason_of_ad(row.reveal.ad.get());
        assert_eq!(row.reveal.reason, written, "{row:?}");
    }
    let seen: Vec<Option<Reason>> = by_seller.iter().map(|r| r.reveal.reason).collect();
    for reason in &reasons {
        assert!(seen.contains(reason), "{reason:?} not read back");
    }
    // Stored as the integer, never as text.
    let (kinds,): (String,) =
        sqlx::query_as("SELECT group_concat(DISTINCT typeof(reason)) FROM reveals")
            .fetch_one(sqlite(&store))
            .await
            .unwrap();
    let mut kinds: Vec<&str> = kinds.split(',').collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["integer", "null"]);
}

/// A stored integer that is no reason (by hand, or a later version's) reads
/// as none: the page is answered, nothing panics.
#[tokio::test]
async fn a_reason_that_does_not_decode_reads_as_none() {
    let (_dir, store) = scratch().await;
    let good = Reason::new(Origin::Upstream);
    let batch: Vec<Reveal> = (1..=4u64)
        .map(|ad| Reveal {
            reason: Some(good),
            ..reveal(ad, Source::RealPhone, Some("v"))
        })
        .collect();
    store.write_reveals(&batch).await.unwrap();
    // An unknown failure; a negative number; one past 32 bits.
    for (id, bits) in [(1, 2_i64 << 12 | 14 << 14), (2, -1), (3, 1 << 40)] {
        sqlx::query("UPDATE reveals SET reason = ?1 WHERE id = ?2")
            .bind(bits)
            .bind(id)
            .execute(sqlite(&store))
            .await
            .unwrap();
    }
    let page = every_page(&store, viewer("v"), 10).await;
    let mut reasons: Vec<(i64, Option<Reason>)> =
        page.iter().map(|r| (r.id, r.reveal.reason)).collect();
    reasons.sort_unstable_by_key(|r| r.0);
    assert_eq!(reasons, [(1, None), (2, None), (3, None), (4, Some(good))]);
}

/// Migration 0010 on an older log: its reveals read back with no reason.
#[tokio::test]
async fn the_reveals_before_reasons_read_back_without_one() {
    let (_dir, pool) = migrated_before(10).await;
    let log = "INSERT INTO reveals (id, at_us, viewer, user_id, ad_id, category_id, kind) VALUES \
         (1, 100, 'a', 7, 1, 1, 'real'); \
         INSERT INTO reveal_viewer_runs (viewer, max_at_us, min_at_us, first_id, last_id) \
         VALUES ('a', 100, 100, 1, 1); \
         INSERT INTO reveal_seller_postings \
         (user_id, max_at_us, min_at_us, first_id, last_id, entries) \
         VALUES (7, 100, 100, 1, 1, NULL)";
    exec(&pool, log).await;
    // 0010 and those after it (0011's buckets).
    migrate_from(&pool, 10).await;
    let store = store_on(pool);
    let cache = Reason::new(Origin::Cache);
    let cached = Reveal {
        at_us: 200,
        reason: Some(cache),
        ..reveal_at(200, 7, Some("a"))
    };
    store.write_reveals(&[cached]).await.unwrap();
    let query = RevealQuery::newest(seller(7), 10);
    let page = store.read_reveals(&query).await.unwrap();
    let reasons: Vec<(i64, Option<Reason>)> =
        page.iter().map(|r| (r.id, r.reveal.reason)).collect();
    assert_eq!(reasons, [(2, Some(cache)), (1, None)]);
}
