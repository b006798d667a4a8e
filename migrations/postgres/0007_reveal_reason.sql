-- Why each reveal was of its kind (docs/rules.md, "Why this number"): the
-- reason the selection rules gave, packed into an integer of 22 bits
-- (`Reason::encode` in src/domain/reason.rs), never text. NULL for the reveals
-- recorded before reasons were kept. No number and no phone digit is in it.
-- A nullable column without a default is added without rewriting the table.
ALTER TABLE reveals ADD COLUMN reason INTEGER;
