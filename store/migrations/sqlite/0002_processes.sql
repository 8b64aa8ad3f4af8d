-- What each session's agent process did, as the runner reported it. One row
-- per session that was ever started.
CREATE TABLE processes (
    session_id     TEXT PRIMARY KEY NOT NULL REFERENCES sessions (session_id),
    -- Last runner event applied: a re-attached watch resumes after it.
    runner_seq     INTEGER NOT NULL DEFAULT 0,
    exit_code      INTEGER,
    exit_reason    TEXT,
    -- The last bytes the agent printed, stdout and stderr in order.
    output_tail    BLOB NOT NULL DEFAULT x'',
    -- Last inbox sequence written to the agent's stdin.
    delivered_seq  INTEGER NOT NULL DEFAULT 0,
    -- CALLBACK mode: tell the parent when this session ends.
    notify_parent  INTEGER NOT NULL DEFAULT 0
);
