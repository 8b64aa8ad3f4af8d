-- A session's write scope: the directories under /workspace its agent may
-- write, as a JSON array of normalised absolute paths; '[]' is the whole
-- workspace (no scope), as for every session made before.
ALTER TABLE sessions ADD COLUMN writable_paths TEXT NOT NULL DEFAULT '[]';
