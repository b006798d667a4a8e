-- The call-tracking status set. change_seq orders changes for catch-up: every
-- write transaction takes the next value and stamps every row it changes.
CREATE TABLE calltracking_status (
    user_id    INTEGER PRIMARY KEY,
    enabled    INTEGER NOT NULL,
    version    INTEGER NOT NULL,
    change_seq INTEGER NOT NULL
);
CREATE INDEX calltracking_status_change ON calltracking_status (change_seq, user_id);

-- The status feed's cursor (one row), stored with the changes it brought.
CREATE TABLE status_feed_cursor (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    cursor TEXT NOT NULL
);
