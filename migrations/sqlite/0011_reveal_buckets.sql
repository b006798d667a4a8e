-- The viewers' runs and the sellers' postings keyed by a bucket of reveal ids
-- first (store/reveals/buckets.rs). Keyed by viewer or seller first, a flush's
-- runs and postings landed on the leaves of every viewer's and seller's range,
-- a page dirtied per distinct seller over indexes that outgrow the writer's
-- cache, so the writer's cost a reveal grew with the log's age (tripled over
-- four million reveals). Keyed by bucket first, a flush's entries land in the
-- newest bucket's part of each index. A bucket is 2^18 ids (262,144 reveals),
-- `first_id >> 18`: an index on that expression, which a query names as it is
-- written here (a virtual column would do the same, but a query naming one
-- counts every column of its table as read, so the postings' index would no
-- longer cover a page's walk). Nothing is added to the rows.
DROP INDEX reveal_seller_postings_user;
CREATE INDEX reveal_seller_postings_bucket_user
    ON reveal_seller_postings ((first_id >> 18), user_id, max_at_us, last_id, min_at_us, first_id);
DROP INDEX reveal_viewer_runs_viewer;
CREATE INDEX reveal_viewer_runs_bucket_viewer
    ON reveal_viewer_runs ((first_id >> 18), viewer, max_at_us, last_id, min_at_us, first_id);
-- A bucket's span in time: no older and no newer than any reveal of its runs
-- and postings (each flush widens it). A page walks the buckets newest first
-- and stops once it is full and newer than every bucket left, whichever way
-- the clock went; one row a bucket, pruned by retention with the last run or
-- posting of its bucket.
CREATE TABLE reveal_buckets (
    bucket    INTEGER PRIMARY KEY,
    min_at_us INTEGER NOT NULL,
    max_at_us INTEGER NOT NULL
);
INSERT INTO reveal_buckets (bucket, min_at_us, max_at_us)
    SELECT bucket, min(min_at_us), max(max_at_us) FROM (
        SELECT first_id >> 18 AS bucket, min_at_us, max_at_us FROM reveal_seller_postings
        UNION ALL
        SELECT first_id >> 18 AS bucket, min_at_us, max_at_us FROM reveal_viewer_runs
    ) GROUP BY bucket;
