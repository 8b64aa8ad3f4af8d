-- The event log ordered per shard: no commit waits on another shard's.
-- Each event records its session's shard and its position in that shard's
-- order (`shard_seq`, handed out under the shard's row of `event_shards`,
-- the last lock of its transaction). Events written before this release
-- keep their id as their position (ids were handed out in commit order),
-- and every shard's counter starts past them.
-- A workspace's shard in SQL, equal to `troupe_domain::shard::Shard::of`
-- (FNV-1a 64 modulo 64, whose low six bits depend only on the low six bits
-- of each step): for rows written by replicas of older releases during a
-- rolling update, which know nothing of shards.
CREATE FUNCTION troupe_shard(workspace TEXT) RETURNS INTEGER
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    h INTEGER := 37;
    b BYTEA := convert_to(workspace, 'UTF8');
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        h := ((h # (get_byte(b, i) & 63)) * 51) & 63;
    END LOOP;
    RETURN h;
END $$;
UPDATE sessions SET shard = troupe_shard(workspace_id) WHERE shard < 0;
CREATE FUNCTION troupe_session_shard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.shard := troupe_shard(NEW.workspace_id);
    RETURN NEW;
END $$;
CREATE TRIGGER sessions_shard BEFORE INSERT ON sessions
FOR EACH ROW WHEN (NEW.shard < 0) EXECUTE FUNCTION troupe_session_shard();

ALTER TABLE events ADD COLUMN shard INTEGER NOT NULL DEFAULT -1;
ALTER TABLE events ADD COLUMN shard_seq BIGINT NOT NULL DEFAULT 0;
UPDATE events SET shard_seq = id,
    shard = COALESCE((SELECT s.shard FROM sessions s WHERE s.session_id = events.session_id), -1);
CREATE UNIQUE INDEX events_by_shard ON events (shard, shard_seq);
CREATE INDEX events_unsharded ON events (session_id) WHERE shard < 0;

-- Per shard: the last position handed out (`seq`), the last pruned
-- (`pruned_through`), and counters that move with commits which may make
-- the driver work (`work_seq`) or end sessions (`ends_seq`): replicas
-- compare them to learn which shards changed. `output_bytes` is one stripe
-- of the output kept in all (their sum): each output write adds to its own
-- shard's stripe, so output of different shards takes no common lock.
CREATE TABLE event_shards (
    shard           INTEGER PRIMARY KEY,
    seq             BIGINT NOT NULL,
    pruned_through  BIGINT NOT NULL,
    work_seq        BIGINT NOT NULL DEFAULT 0,
    ends_seq        BIGINT NOT NULL DEFAULT 0
);
INSERT INTO event_shards (shard, seq, pruned_through)
SELECT n, (SELECT COALESCE(MAX(id), 0) FROM events),
    (SELECT value FROM meta WHERE key = 'events_pruned_through')
FROM generate_series(0, 63) AS n;

-- An event written by a replica of an older release (no position): its
-- session's shard and the shard's next position, under the shard's row
-- (held to its commit, as this release's writes hold it).
CREATE FUNCTION troupe_event_position() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT shard INTO NEW.shard FROM sessions WHERE session_id = NEW.session_id;
    UPDATE event_shards SET seq = seq + 1, work_seq = work_seq + 1
    WHERE shard = NEW.shard RETURNING seq INTO NEW.shard_seq;
    RETURN NEW;
END $$;
CREATE TRIGGER events_position BEFORE INSERT ON events
FOR EACH ROW WHEN (NEW.shard_seq = 0) EXECUTE FUNCTION troupe_event_position();

CREATE TABLE output_stripes (
    shard  INTEGER PRIMARY KEY,
    bytes  BIGINT NOT NULL
);
INSERT INTO output_stripes (shard, bytes)
SELECT n, CASE WHEN n = 0 THEN (SELECT value FROM meta WHERE key = 'output_bytes') ELSE 0 END
FROM generate_series(0, 63) AS n;
DELETE FROM meta WHERE key IN ('output_bytes', 'events_pruned_through');
