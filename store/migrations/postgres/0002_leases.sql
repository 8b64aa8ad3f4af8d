-- The lease of the background work (the driver, life-span export, pruning):
-- one replica holds it at a time, for a term whose epoch is the fencing
-- token every background write carries. Each such write reads this row
-- FOR SHARE in its own transaction (epoch, holder and expiry, on the
-- database's clock), so a takeover, which updates the row, waits for it,
-- and a stale owner's write is refused.
CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       BIGINT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL
);

-- CALLBACK mode, chosen at creation: the owner of the background work,
-- whichever replica it is, starts the agent with it.
ALTER TABLE sessions ADD COLUMN notify_parent BOOLEAN NOT NULL DEFAULT FALSE;

-- A callback the parent is owed: set in the transaction that ends the child,
-- cleared in the one that writes the notice (or finds the parent ended).
ALTER TABLE processes ADD COLUMN callback_due BOOLEAN NOT NULL DEFAULT FALSE;
-- The owner asked the runner to stop it (its session had ended).
ALTER TABLE processes ADD COLUMN stopped BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX processes_callback_due ON processes (session_id) WHERE callback_due;
