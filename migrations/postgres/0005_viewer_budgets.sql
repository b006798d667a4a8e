-- Viewer budgets for the fleet (docs/abuse.md). Each replica counts reveals per
-- viewer locally and adds what it spent to these rows once per exchange
-- (rate_limit.exchange_interval_ms), one upsert for all its viewers: never a
-- write per request. `viewer` is a 64-bit hash of X-Viewer-Id, the same on
-- every replica; `kind` 0 is the minute budget (window_id: minutes since the
-- Unix epoch), 1 the day budget (days since the epoch, UTC).
CREATE TABLE viewer_budgets (
    viewer    BIGINT NOT NULL,
    kind      SMALLINT NOT NULL,
    window_id BIGINT NOT NULL,
    spent     BIGINT NOT NULL,
    PRIMARY KEY (viewer, kind, window_id)
);
-- Retention deletes past windows in small batches.
CREATE INDEX viewer_budgets_window ON viewer_budgets (kind, window_id);

-- Viewers past a budget somewhere in the fleet, until when: written by the
-- replica whose exchange saw the total cross, read by every replica at each
-- exchange (the recent ones) and at start (all still in force).
CREATE TABLE viewer_refusals (
    viewer  BIGINT PRIMARY KEY,
    until_s BIGINT NOT NULL,  -- seconds since the Unix epoch
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX viewer_refusals_at ON viewer_refusals (at);
CREATE INDEX viewer_refusals_until ON viewer_refusals (until_s);

-- The replicas that exchanged recently: how many share a budget.
CREATE TABLE budget_replicas (
    replica BIGINT PRIMARY KEY,
    seen_at TIMESTAMPTZ NOT NULL
);
