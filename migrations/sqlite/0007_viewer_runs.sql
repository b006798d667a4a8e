-- A viewer's reveals found through runs, not an index entry per reveal
-- (issue 24: the viewer index was most of what the log cost the hit path on
-- SQLite). A flush writes its reveals in viewer order with ids it assigns, so
-- one viewer's reveals of one flush are one run of consecutive ids; a run is
-- one row here, whatever the rate. Reads walk a viewer's runs newest first and
-- read each run's rows by id (store/reveals/viewer_runs.rs). Runs are inserted
-- in id order, so retention deletes them by id as it deletes the reveals.
CREATE TABLE reveal_viewer_runs (
    id        INTEGER PRIMARY KEY,
    viewer    TEXT NOT NULL,
    max_at_us INTEGER NOT NULL,  -- the newest and oldest at_us of the run
    min_at_us INTEGER NOT NULL,
    first_id  INTEGER NOT NULL,  -- the run's reveals: ids first_id..=last_id
    last_id   INTEGER NOT NULL
);
-- Covering: a page reads no run row. last_id orders runs of one max_at_us.
CREATE INDEX reveal_viewer_runs_viewer
    ON reveal_viewer_runs (viewer, max_at_us, last_id, min_at_us, first_id);
-- The reveals written before: a run each.
INSERT INTO reveal_viewer_runs (viewer, max_at_us, min_at_us, first_id, last_id)
    SELECT viewer, at_us, at_us, id, id FROM reveals WHERE viewer IS NOT NULL ORDER BY id;
DROP INDEX reveals_viewer;
