-- The reveal log's indexes, cheaper to write (issue 24; measured in
-- BENCHMARKS.md and README "Measured"):
-- - ascending: a reveal is newer than every row of its seller's (and viewer's)
--   range, so it lands at the range's end, where a descending index put it at
--   the start, splitting pages as it went. Reads newest first walk the same
--   index backwards (the rowid, the last key of every SQLite index, orders
--   reveals of one instant).
-- - no index on at_us: ids grow with time (the flush writes in the order it
--   drains, one interval at a time), so retention deletes the oldest ids whose
--   at_us is past the cutoff (store/reveals.rs) and needs no index of its own.
DROP INDEX reveals_user;
DROP INDEX reveals_viewer;
DROP INDEX reveals_at;
CREATE INDEX reveals_user ON reveals (user_id, at_us);
CREATE INDEX reveals_viewer ON reveals (viewer, at_us) WHERE viewer IS NOT NULL;
