-- Leases: a duty that one replica at a time performs (the status feed's
-- poll) is held by whoever renewed its row last, until expires_at, on the
-- database's clock (docs/status-sync.md, "Leadership"). A row needs no session
-- of its own, so it works behind a transaction-mode pooler too.
--
-- holder: the replica that holds it (host, process and a random part), empty
-- before the first take. epoch: the fencing token, one more at every take;
-- every write the holder makes for the duty checks it in the same transaction,
-- so a holder that lost the lease (frozen, cut off) cannot write after its
-- successor. expires_at: the lease ends then unless renewed.
CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       BIGINT NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL,
    renewed_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);

-- The status feed's lease, expired: the first replica to ask takes it.
INSERT INTO leases (name, holder, epoch, acquired_at, renewed_at, expires_at)
VALUES ('status_feed', '', 0, '-infinity', '-infinity', '-infinity');
