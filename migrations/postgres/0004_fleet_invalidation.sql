-- Invalidation for the fleet (docs/caching.md, "Invalidation").
--
-- flip_seq: the change that last turned a seller's call tracking on or off. A
-- replica catching up drops the seller's cached call-tracking numbers when the
-- flip is newer than what it had applied, also when a disable and the next
-- enable both arrive in one catch-up (the forwarding number was released in
-- between). A snapshot that leaves a seller's state as it was does not move it.
ALTER TABLE calltracking_status ADD COLUMN flip_seq BIGINT NOT NULL DEFAULT 0;

-- Cache invalidations, in the change log beside status changes: each write takes
-- the writers' advisory lock and the next calltracking_change_seq value, so the
-- catch-up reads both tables in one order. Rows are pruned by later invalidation
-- writes once older than the longest time a cached entry can still be served.
CREATE TABLE cache_invalidations (
    change_seq BIGINT NOT NULL,
    user_id    BIGINT NOT NULL,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (change_seq, user_id)
);
CREATE INDEX cache_invalidations_at ON cache_invalidations (at);
