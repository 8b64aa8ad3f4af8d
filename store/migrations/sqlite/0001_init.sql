-- The spawn tree. Rows are never deleted; trust, workspace, tree and depth never change.
CREATE TABLE sessions (
    session_id          TEXT PRIMARY KEY NOT NULL,
    workspace_id        TEXT NOT NULL,
    parent_session_id   TEXT REFERENCES sessions (session_id),
    -- Denormalised from the parent so views can redact a direct parent from sandboxed viewers.
    parent_trust_level  TEXT,
    tree_id             TEXT NOT NULL,
    depth               INTEGER NOT NULL,
    trust_level         TEXT NOT NULL CHECK (trust_level IN ('direct', 'sandboxed')),
    agent_name          TEXT NOT NULL,
    -- JSON array: the argv the agent definition named when the session was created.
    agent_command       TEXT NOT NULL,
    title               TEXT NOT NULL,
    status              TEXT NOT NULL
        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'terminated')),
    created_by          TEXT NOT NULL,
    created_at_ms       INTEGER NOT NULL,
    ended_at_ms         INTEGER,
    end_reason          TEXT,
    -- GCRA state of this session's spawn rate limit (theoretical arrival time).
    spawn_tat_ms        INTEGER NOT NULL DEFAULT 0,
    -- Last inbox sequence and last event sequence handed out.
    inbox_seq           INTEGER NOT NULL DEFAULT 0,
    event_seq           INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX sessions_by_workspace ON sessions (workspace_id, status);
CREATE INDEX sessions_by_parent ON sessions (parent_session_id);
CREATE INDEX sessions_by_tree ON sessions (tree_id);

CREATE TABLE messages (
    message_id       TEXT PRIMARY KEY NOT NULL,
    session_id       TEXT NOT NULL REFERENCES sessions (session_id),
    seq              INTEGER NOT NULL,
    sender           TEXT NOT NULL,
    body             TEXT NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    delivered_at_ms  INTEGER,
    UNIQUE (session_id, seq)
);

CREATE TABLE events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id  TEXT NOT NULL REFERENCES sessions (session_id),
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    at_ms       INTEGER NOT NULL,
    detail      TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_by_session ON events (session_id, seq);

-- Sequence counters follow their inserts, so an insert is one statement.
CREATE TRIGGER events_advance_session_seq AFTER INSERT ON events BEGIN
    UPDATE sessions SET event_seq = NEW.seq WHERE session_id = NEW.session_id;
END;
CREATE TRIGGER messages_advance_inbox_seq AFTER INSERT ON messages BEGIN
    UPDATE sessions SET inbox_seq = NEW.seq WHERE session_id = NEW.session_id;
END;

-- Every session starts with a 'created' event and every inbox message has a
-- 'message' event: written here, they cannot be forgotten by a write path.
CREATE TRIGGER sessions_created_event AFTER INSERT ON sessions BEGIN
    INSERT INTO events (session_id, seq, kind, status, at_ms, detail)
    VALUES (NEW.session_id, NEW.event_seq + 1, 'created', NEW.status, NEW.created_at_ms,
            json_object('agent_name', NEW.agent_name, 'title', NEW.title));
END;
CREATE TRIGGER messages_message_event AFTER INSERT ON messages BEGIN
    INSERT INTO events (session_id, seq, kind, status, at_ms, detail)
    SELECT s.session_id, s.event_seq + 1, 'message', s.status, NEW.created_at_ms,
           json_object('message_id', NEW.message_id, 'inbox_sequence', NEW.seq,
                       'bytes', length(CAST(NEW.body AS BLOB)))
    FROM sessions s WHERE s.session_id = NEW.session_id;
END;

CREATE TABLE audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms      INTEGER NOT NULL,
    caller     TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    allowed    INTEGER NOT NULL,
    reason     TEXT NOT NULL,
    detail     TEXT NOT NULL
);
CREATE INDEX audit_by_target ON audit (target);
CREATE INDEX audit_by_caller ON audit (caller);

CREATE TABLE idempotency (
    caller          TEXT NOT NULL,
    action          TEXT NOT NULL,
    request_id      TEXT NOT NULL,
    payload_hash    TEXT NOT NULL,
    result          TEXT NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    PRIMARY KEY (caller, action, request_id)
);

CREATE TABLE signing_keys (
    kid            TEXT PRIMARY KEY NOT NULL,
    secret         BLOB NOT NULL,
    created_at_ms  INTEGER NOT NULL
);

-- Small counters: 'events_pruned_through' is the highest event id pruned.
CREATE TABLE meta (
    key    TEXT PRIMARY KEY NOT NULL,
    value  INTEGER NOT NULL
);
INSERT INTO meta (key, value) VALUES ('events_pruned_through', 0);
