-- The reveal log (who was shown which seller's number; never the number) and
-- the per-ad counts. Rows are written in batches (multi-row inserts) by each replica's flush;
-- the counts are upserted once per ad and kind per flush, in the same
-- transaction, so log and counts always agree.
CREATE TABLE reveals (
    id          INTEGER PRIMARY KEY,
    at_us       INTEGER NOT NULL,  -- microseconds since the Unix epoch
    viewer      TEXT,             -- X-Viewer-Id, or NULL
    user_id     INTEGER NOT NULL,
    ad_id       INTEGER NOT NULL,
    category_id INTEGER NOT NULL,
    kind        TEXT NOT NULL     -- anonymous, calltracking, real
);
-- "A seller's last 100 reveals" and "a viewer's": keyset pages, newest first.
CREATE INDEX reveals_user ON reveals (user_id, at_us DESC, id DESC);
CREATE INDEX reveals_viewer ON reveals (viewer, at_us DESC, id DESC) WHERE viewer IS NOT NULL;
-- Retention deletes the oldest rows in small batches.
CREATE INDEX reveals_at ON reveals (at_us);

CREATE TABLE ad_reveal_counts (
    ad_id INTEGER NOT NULL,
    kind  TEXT NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (ad_id, kind)
);
