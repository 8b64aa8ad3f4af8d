-- Shards: the background work divides by workspace (on SQLite one service
-- owns every shard). Every session records its workspace's shard
-- (`troupe_domain::shard::Shard::of`, computed by the service); rows written
-- before this release hold -1 until the service fills them in at its start
-- (`UpkeepStore::shard_sessions`).
ALTER TABLE sessions ADD COLUMN shard INTEGER NOT NULL DEFAULT -1;
CREATE INDEX sessions_unsharded ON sessions (workspace_id) WHERE shard < 0;

-- Each shard's lease is a row of `leases` named `shard:<n>`; the single
-- lease of older releases is held by no one, for ever.
INSERT INTO leases (name, holder, epoch, expires_at_ms)
VALUES ('background', 'sharded', 1, 9223372036854775807)
ON CONFLICT (name) DO UPDATE
SET holder = 'sharded', epoch = leases.epoch + 1, expires_at_ms = 9223372036854775807;

-- The services alive, each renewing its row with its leases (one, here).
CREATE TABLE replicas (
    holder      TEXT PRIMARY KEY NOT NULL,
    expires_ms  INTEGER NOT NULL
);

-- The shards' lease rows, free (`troupe_domain::shard::SHARDS` of them).
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 63)
INSERT INTO leases (name, holder, epoch, expires_at_ms)
SELECT 'shard:' || i, '', 0, 0 FROM n WHERE true
ON CONFLICT (name) DO NOTHING;
