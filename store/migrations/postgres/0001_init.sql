-- The PostgreSQL schema: the same records as SQLite's, plus the counter rows
-- that make a check and its insert atomic across replicas (read FOR NO KEY
-- UPDATE, in the order workspace -> tree -> session, inside the write's
-- transaction). Session rows are never deleted; trust, workspace, tree and
-- depth never change.

-- Active sessions of each workspace, by trust level.
CREATE TABLE workspaces (
    workspace_id      TEXT PRIMARY KEY,
    active_direct     INTEGER NOT NULL DEFAULT 0 CHECK (active_direct >= 0),
    active_sandboxed  INTEGER NOT NULL DEFAULT 0 CHECK (active_sandboxed >= 0)
);

-- Sessions each tree ever held, ended ones included.
CREATE TABLE trees (
    tree_id   TEXT PRIMARY KEY,
    sessions  INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE sessions (
    -- Creation order: the page token of lists.
    row_id              BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    session_id          TEXT PRIMARY KEY,
    workspace_id        TEXT NOT NULL REFERENCES workspaces (workspace_id),
    parent_session_id   TEXT REFERENCES sessions (session_id),
    parent_trust_level  TEXT,
    tree_id             TEXT NOT NULL REFERENCES trees (tree_id),
    depth               INTEGER NOT NULL,
    trust_level         TEXT NOT NULL CHECK (trust_level IN ('direct', 'sandboxed')),
    agent_name          TEXT NOT NULL,
    agent_command       TEXT NOT NULL,
    title               TEXT NOT NULL,
    status              TEXT NOT NULL
        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'terminated')),
    created_by          TEXT NOT NULL,
    created_at_ms       BIGINT NOT NULL,
    ended_at_ms         BIGINT,
    end_reason          TEXT,
    -- GCRA state of this session's spawn rate limit (theoretical arrival time).
    spawn_tat_ms        BIGINT NOT NULL DEFAULT 0,
    -- Children this session ever created.
    children            INTEGER NOT NULL DEFAULT 0,
    -- Last inbox sequence and last event sequence handed out.
    inbox_seq           BIGINT NOT NULL DEFAULT 0,
    event_seq           BIGINT NOT NULL DEFAULT 0,
    traceparent         TEXT,
    spawn_span_id       TEXT
);
CREATE INDEX sessions_by_parent ON sessions (parent_session_id, row_id);
CREATE INDEX sessions_by_workspace ON sessions (workspace_id, row_id);
CREATE INDEX sessions_active ON sessions (row_id) WHERE status IN ('pending', 'running');

CREATE TABLE messages (
    message_id       TEXT PRIMARY KEY,
    session_id       TEXT NOT NULL REFERENCES sessions (session_id),
    seq              BIGINT NOT NULL,
    sender           TEXT NOT NULL,
    body             TEXT NOT NULL,
    created_at_ms    BIGINT NOT NULL,
    delivered_at_ms  BIGINT,
    UNIQUE (session_id, seq)
);

-- Event ids come from this sequence, drawn only under the events lock (see
-- store/postgres/events.rs), so they are handed out in commit order. No
-- foreign key: the inserts made under that lock take no row lock.
CREATE SEQUENCE events_id_seq;
CREATE TABLE events (
    id          BIGINT PRIMARY KEY,
    session_id  TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    at_ms       BIGINT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '{}',
    -- Bytes printed, for output events.
    bytes       BIGINT
);
CREATE INDEX events_output ON events (session_id, id) INCLUDE (bytes) WHERE kind = 'output';

CREATE TABLE audit (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_ms      BIGINT NOT NULL,
    caller     TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    allowed    BOOLEAN NOT NULL,
    reason     TEXT NOT NULL,
    detail     TEXT NOT NULL
);

-- A call's result, by its request id. Inserted first in the call's
-- transaction (result NULL), so a concurrent duplicate waits on the key and
-- then replays the result the first one stored.
CREATE TABLE idempotency (
    caller          TEXT NOT NULL,
    action          TEXT NOT NULL,
    request_id      TEXT NOT NULL,
    payload_hash    TEXT NOT NULL,
    result          TEXT,
    created_at_ms   BIGINT NOT NULL,
    PRIMARY KEY (caller, action, request_id)
);

CREATE TABLE signing_keys (
    kid            TEXT PRIMARY KEY,
    secret         BYTEA NOT NULL,
    created_at_ms  BIGINT NOT NULL
);

-- Small counters: 'events_pruned_through' is the highest event id pruned;
-- 'output_bytes' the output events' bytes kept in all.
CREATE TABLE meta (
    key    TEXT PRIMARY KEY,
    value  BIGINT NOT NULL
);
INSERT INTO meta (key, value) VALUES ('events_pruned_through', 0), ('output_bytes', 0);

-- What each session's agent process did, as the runner reported it.
CREATE TABLE processes (
    session_id       TEXT PRIMARY KEY REFERENCES sessions (session_id),
    runner_seq       BIGINT NOT NULL DEFAULT 0,
    exit_code        INTEGER,
    exit_reason      TEXT,
    output_tail      BYTEA NOT NULL DEFAULT '',
    delivered_seq    BIGINT NOT NULL DEFAULT 0,
    notify_parent    BOOLEAN NOT NULL DEFAULT FALSE,
    output_bytes     BIGINT NOT NULL DEFAULT 0,
    dropped_bytes    BIGINT NOT NULL DEFAULT 0,
    dropped_events   BIGINT NOT NULL DEFAULT 0,
    truncated_event  BIGINT
);
-- The newest end, which the replicas poll when a notification was lost.
CREATE INDEX events_ends ON events (id) WHERE kind IN ('completed', 'failed', 'terminated');
