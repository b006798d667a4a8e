-- Why each reveal was of its kind (docs/rules.md, "Why this number"): the
-- reason the selection rules gave, packed into an integer of 22 bits
-- (`Reason::encode` in src/domain/reason.rs), never text: SQLite stores it in
-- 0 to 3 bytes (an answer from a fresh cache entry with nothing above it is 0).
-- NULL for the reveals recorded before reasons were kept. No number and no
-- phone digit is in it. Adding a nullable column rewrites no row.
ALTER TABLE reveals ADD COLUMN reason INTEGER;
