-- Named groups of sessions (CreateGroup, AddGroupMembers, PostToGroup):
-- a name is unique per workspace; members are sessions of that workspace.
CREATE TABLE groups (
    group_id       TEXT PRIMARY KEY NOT NULL,
    workspace_id   TEXT NOT NULL,
    name           TEXT NOT NULL,
    created_by     TEXT NOT NULL REFERENCES sessions (session_id),
    created_at_ms  BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);

CREATE TABLE group_members (
    group_id     TEXT NOT NULL REFERENCES groups (group_id),
    session_id   TEXT NOT NULL REFERENCES sessions (session_id),
    added_at_ms  BIGINT NOT NULL,
    PRIMARY KEY (group_id, session_id)
);
CREATE INDEX group_members_by_session ON group_members (session_id);

-- Each session's message rate state (the theoretical arrival time of the
-- generic cell rate algorithm): every message a session sends counts.
CREATE TABLE message_rates (
    session_id  TEXT PRIMARY KEY NOT NULL REFERENCES sessions (session_id),
    tat_ms      BIGINT NOT NULL
);
