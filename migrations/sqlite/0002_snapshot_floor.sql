-- The snapshot floor (SPEC 3): a snapshot at version V speaks for every user,
-- also those it does not list and no change ever named: afterwards they are
-- disabled at V. Stored as the row of user 0 (user ids start at 1): a snapshot's
-- "every row at version <= V takes the snapshot's state" moves it to V in the
-- same statement and transaction as the other rows, a delta reads it as the
-- version of every user without a row, and it reaches other replicas through the
-- change log in order with everything else.
INSERT INTO calltracking_status (user_id, enabled, version, change_seq)
VALUES (0, 0, 0, 0)
ON CONFLICT (user_id) DO NOTHING;
