-- The call-tracking status set. change_seq orders changes for catch-up: every
-- write transaction takes the advisory lock, then the next sequence value, and
-- stamps every row it changes, so sequence values commit in order.
CREATE TABLE calltracking_status (
    user_id    BIGINT PRIMARY KEY,
    enabled    BOOLEAN NOT NULL,
    version    BIGINT NOT NULL,
    change_seq BIGINT NOT NULL
);
CREATE INDEX calltracking_status_change ON calltracking_status (change_seq, user_id);
CREATE SEQUENCE calltracking_change_seq;

-- The status feed's cursor (one row), stored with the changes it brought.
CREATE TABLE status_feed_cursor (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    cursor TEXT NOT NULL
);
