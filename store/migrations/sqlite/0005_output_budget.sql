-- Output is kept within byte budgets, per session and in total. Each output
-- event records its size (the bytes the agent printed); each session, what
-- it keeps and what was dropped, and the event that marks the drop (an
-- output event turned into 'output_truncated'); meta, the total kept. The
-- index finds a session's oldest output, covering the sizes.
ALTER TABLE events ADD COLUMN bytes INTEGER;
-- Base64 in JSON: three bytes printed for four stored, near enough.
UPDATE events SET bytes = length(detail) * 3 / 4 WHERE kind = 'output';
CREATE INDEX events_output ON events (session_id, id, bytes) WHERE kind = 'output';

ALTER TABLE processes ADD COLUMN output_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE processes ADD COLUMN dropped_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE processes ADD COLUMN dropped_events INTEGER NOT NULL DEFAULT 0;
ALTER TABLE processes ADD COLUMN truncated_event INTEGER;
UPDATE processes SET output_bytes = (
    SELECT COALESCE(SUM(bytes), 0) FROM events
    WHERE events.session_id = processes.session_id AND kind = 'output'
);
INSERT INTO meta (key, value)
    SELECT 'output_bytes', COALESCE(SUM(bytes), 0) FROM events WHERE kind = 'output';
