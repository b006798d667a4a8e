-- flip_seq: the change that last turned a seller's call tracking on or off; a
-- catch-up drops the seller's cached call-tracking numbers when it is newer than
-- what memory had applied (docs/caching.md, "Invalidation"). Invalidations
-- themselves stay local with SQLite (one replica) and are not stored.
ALTER TABLE calltracking_status ADD COLUMN flip_seq INTEGER NOT NULL DEFAULT 0;
