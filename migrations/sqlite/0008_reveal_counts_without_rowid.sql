-- The per-ad counts keyed by their primary key alone (issue 24): as a rowid
-- table, each new ad was two b-tree inserts (the row, then the primary key's
-- index); WITHOUT ROWID it is one, and an upsert one lookup. A cold request is
-- usually a new ad, so this was one of the reveal log's inserts per miss.
CREATE TABLE ad_reveal_counts_new (
    ad_id INTEGER NOT NULL,
    kind  TEXT NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (ad_id, kind)
) WITHOUT ROWID;
INSERT INTO ad_reveal_counts_new (ad_id, kind, n) SELECT ad_id, kind, n FROM ad_reveal_counts;
DROP TABLE ad_reveal_counts;
ALTER TABLE ad_reveal_counts_new RENAME TO ad_reveal_counts;
