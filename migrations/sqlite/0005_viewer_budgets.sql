-- Viewer budgets (docs/abuse.md). With SQLite there is one replica: the rows
-- keep what a viewer spent across a restart. See the PostgreSQL migration.
CREATE TABLE viewer_budgets (
    viewer    INTEGER NOT NULL,
    kind      INTEGER NOT NULL,  -- 0 minute, 1 day
    window_id INTEGER NOT NULL,
    spent     INTEGER NOT NULL,
    PRIMARY KEY (viewer, kind, window_id)
) WITHOUT ROWID;
CREATE INDEX viewer_budgets_window ON viewer_budgets (kind, window_id);

CREATE TABLE viewer_refusals (
    viewer  INTEGER PRIMARY KEY,
    until_s INTEGER NOT NULL
);
CREATE INDEX viewer_refusals_until ON viewer_refusals (until_s);
