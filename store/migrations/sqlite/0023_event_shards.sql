-- The event log ordered per shard, as on PostgreSQL (see its 0023). On
-- SQLite the one writer commits in order anyway; the positions are kept
-- the same way so both backends answer the same cursors.
ALTER TABLE events ADD COLUMN shard INTEGER NOT NULL DEFAULT -1;
ALTER TABLE events ADD COLUMN shard_seq INTEGER NOT NULL DEFAULT 0;
UPDATE events SET shard_seq = id,
    shard = COALESCE((SELECT s.shard FROM sessions s WHERE s.session_id = events.session_id), -1);
CREATE UNIQUE INDEX events_by_shard ON events (shard, shard_seq);
CREATE INDEX events_unsharded ON events (session_id) WHERE shard < 0;

CREATE TABLE event_shards (
    shard           INTEGER PRIMARY KEY,
    seq             INTEGER NOT NULL,
    pruned_through  INTEGER NOT NULL,
    work_seq        INTEGER NOT NULL DEFAULT 0,
    ends_seq        INTEGER NOT NULL DEFAULT 0
);
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 63)
INSERT INTO event_shards (shard, seq, pruned_through)
SELECT i, (SELECT COALESCE(MAX(id), 0) FROM events),
    (SELECT value FROM meta WHERE key = 'events_pruned_through')
FROM n;

CREATE TABLE output_stripes (
    shard  INTEGER PRIMARY KEY,
    bytes  INTEGER NOT NULL
);
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 63)
INSERT INTO output_stripes (shard, bytes)
SELECT i, CASE WHEN i = 0 THEN (SELECT value FROM meta WHERE key = 'output_bytes') ELSE 0 END
FROM n;
DELETE FROM meta WHERE key IN ('output_bytes', 'events_pruned_through');

-- Each insert moves its session's and its shard's counters on (an insert
-- stays one statement; see the store's `insert_event!`).
DROP TRIGGER events_advance_session_seq;
CREATE TRIGGER events_advance_seqs AFTER INSERT ON events BEGIN
    UPDATE sessions SET event_seq = NEW.seq WHERE session_id = NEW.session_id;
    UPDATE event_shards SET seq = NEW.shard_seq WHERE shard = NEW.shard;
END;
