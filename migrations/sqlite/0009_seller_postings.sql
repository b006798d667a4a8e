-- A seller's reveals found through postings, not an index entry per reveal
-- (issue 24: the seller index was half of what the reveal log's writer spent
-- at the hit path's maximum). A flush writes one row here per seller: the id
-- range and newest and oldest at_us of that seller's reveals in it, and the
-- reveals as (at_us, id) entries in a blob, newest first
-- (store/reveals/seller_postings.rs). Postings are inserted in order of their
-- last id, so retention deletes them by id as it deletes the reveals.
CREATE TABLE reveal_seller_postings (
    id        INTEGER PRIMARY KEY,
    user_id   INTEGER NOT NULL,
    max_at_us INTEGER NOT NULL,  -- the newest and oldest at_us of the posting
    min_at_us INTEGER NOT NULL,
    first_id  INTEGER NOT NULL,  -- its reveals' ids lie in first_id..=last_id
    last_id   INTEGER NOT NULL,
    entries   BLOB               -- NULL: the one reveal (max_at_us, first_id)
);
-- Covering for the walk: a seller's postings newest first from the index alone;
-- a posting's entries are read when the walk reaches it.
CREATE INDEX reveal_seller_postings_user
    ON reveal_seller_postings (user_id, max_at_us, last_id, min_at_us, first_id);
-- The reveals written before: a posting each.
INSERT INTO reveal_seller_postings (user_id, max_at_us, min_at_us, first_id, last_id, entries)
    SELECT user_id, at_us, at_us, id, id, NULL FROM reveals ORDER BY id;
DROP INDEX reveals_user;
