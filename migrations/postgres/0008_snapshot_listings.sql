-- The listing of the last large snapshot: its version and the ids it enabled,
-- encoded (status::listed: LEB128 gaps between ascending ids, about a byte an
-- id for sellers' ids), written in the snapshot's own transaction with the rows
-- it stamped (change_seq). Another replica that reaches those rows in the
-- change log applies the snapshot from this one row instead of reading every
-- row it stamped: 10,000,000 or more rows took it longer than the 10 s the
-- contract gives (docs/status-sync.md). Only the newest is kept; a replica
-- that needs an older one reads the rows, as before.
CREATE TABLE calltracking_snapshot_listings (
    change_seq BIGINT PRIMARY KEY,
    version    BIGINT NOT NULL,
    ids        BYTEA  NOT NULL
);
