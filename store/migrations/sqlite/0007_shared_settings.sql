-- What every service on this database shares rather than reads from its own
-- disk: the operator token, and agent definitions applied by operators.

-- One row: the operator token the first service to start stored (later ones
-- adopt it; a configured one that differs stops a service from starting).
CREATE TABLE operator_token (
    id             INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    token          TEXT NOT NULL,
    created_at_ms  INTEGER NOT NULL
);

-- Agent definitions, looked up before the files: a workspace's own, then the
-- one for every workspace (workspace_id ''). `definition` is the Markdown as
-- applied; the other columns are what parsing it gave.
CREATE TABLE agents (
    workspace_id   TEXT NOT NULL,
    name           TEXT NOT NULL,
    description    TEXT,
    -- JSON array: the argv a session of this agent runs.
    command        TEXT NOT NULL,
    prompt         TEXT NOT NULL,
    definition     TEXT NOT NULL,
    updated_at_ms  INTEGER NOT NULL,
    updated_by     TEXT NOT NULL,
    PRIMARY KEY (workspace_id, name)
);
