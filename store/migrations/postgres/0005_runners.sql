-- The runners the driver places workspaces on: the embedded `--runner`
-- (named `default`, no lease: lease_expires NULL) and those that register
-- (RegisterRunner), live while their lease is unexpired on the database's
-- clock.
CREATE TABLE runners (
    name           TEXT PRIMARY KEY,
    endpoint       TEXT NOT NULL,
    capacity       BIGINT NOT NULL,
    lease_expires  TIMESTAMPTZ,
    -- Bumped by a registration after a lapse (or under a new endpoint): the
    -- owner then reconciles the runner.
    generation     BIGINT NOT NULL DEFAULT 1
);

-- Where each workspace's persistent container lives. One row per workspace
-- (the key), written in the transaction that records a session's process,
-- which first locks the workspace's counter row.
CREATE TABLE workspace_runner (
    workspace_id  TEXT PRIMARY KEY,
    runner        TEXT NOT NULL
);

-- The runner a session's process was placed on (NULL: never placed). Every
-- process before this migration ran on the embedded runner.
ALTER TABLE processes ADD COLUMN runner TEXT;
UPDATE processes SET runner = 'default';
CREATE INDEX processes_runner ON processes (runner);
