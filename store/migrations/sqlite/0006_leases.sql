-- The lease of the background work (the driver, life-span export, pruning):
-- one holder at a time, for a term whose epoch is the fencing token every
-- background write carries and the store checks in its transaction. On
-- SQLite one service owns the database, so its lease is its own, but the
-- rules are the same as PostgreSQL's.
CREATE TABLE leases (
    name           TEXT PRIMARY KEY NOT NULL,
    holder         TEXT NOT NULL,
    epoch          INTEGER NOT NULL,
    -- The database's clock (milliseconds since the epoch), never a replica's.
    expires_at_ms  INTEGER NOT NULL
);

-- CALLBACK mode, chosen at creation: the owner of the background work,
-- whichever service it is, starts the agent with it.
ALTER TABLE sessions ADD COLUMN notify_parent INTEGER NOT NULL DEFAULT 0;

-- A callback the parent is owed: set in the transaction that ends the child,
-- cleared in the one that writes the notice (or finds the parent ended).
ALTER TABLE processes ADD COLUMN callback_due INTEGER NOT NULL DEFAULT 0;
-- The owner asked the runner to stop it (its session had ended).
ALTER TABLE processes ADD COLUMN stopped INTEGER NOT NULL DEFAULT 0;
CREATE INDEX processes_callback_due ON processes (session_id) WHERE callback_due = 1;
