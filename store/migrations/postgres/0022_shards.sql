-- Shards: the background work divides among replicas by workspace. Every
-- session records its workspace's shard (`troupe_domain::shard::Shard::of`,
-- computed by the service); rows written before this release, or by a
-- replica of an older one during a rolling update, hold -1 until the owner
-- of the fleet's upkeep fills them in (`UpkeepStore::shard_sessions`).
ALTER TABLE sessions ADD COLUMN shard INTEGER NOT NULL DEFAULT -1;
CREATE INDEX sessions_unsharded ON sessions (workspace_id) WHERE shard < 0;

-- Each shard's lease is a row of `leases` named `shard:<n>`. The single
-- lease of older releases is held from now on by no one, for ever: a
-- replica of an older release still running loses its term at its next
-- write or renewal, and never takes it again.
INSERT INTO leases (name, holder, epoch, expires_at)
VALUES ('background', 'sharded', 1, 'infinity')
ON CONFLICT (name) DO UPDATE
SET holder = 'sharded', epoch = leases.epoch + 1, expires_at = 'infinity';

-- The replicas alive, each renewing its row with its leases: how many
-- there are decides each one's share of the shards.
CREATE TABLE replicas (
    holder      TEXT PRIMARY KEY,
    expires_ms  BIGINT NOT NULL
);

-- The shards' lease rows, free (`troupe_domain::shard::SHARDS` of them).
INSERT INTO leases (name, holder, epoch, expires_at)
SELECT 'shard:' || n, '', 0, '-infinity' FROM generate_series(0, 63) AS n
ON CONFLICT (name) DO NOTHING;
