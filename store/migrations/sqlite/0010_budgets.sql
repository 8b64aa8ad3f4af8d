-- Budgets and model usage. One account per session (made with it): its
-- budget (each limit NULL: none of its own), its deadline (its wall-clock
-- budget's end, or its nearest ancestor's, whichever is first), and its
-- usage: its own calls (count, tokens by kind, cost in pico-dollars), its
-- subtree's settled calls (itself and every descendant), and what calls of
-- its subtree have reserved and not yet settled. A session's own and
-- subtree counters change on every row of its path, in the transaction
-- that reserves or settles a call.
CREATE TABLE accounts (
    session_id       TEXT PRIMARY KEY NOT NULL REFERENCES sessions (session_id),
    depth            INTEGER NOT NULL,
    cost_limit       INTEGER,
    tokens_limit     INTEGER,
    calls_limit      INTEGER,
    wall_ms          INTEGER,
    deadline_ms      INTEGER,
    own_calls        INTEGER NOT NULL DEFAULT 0,
    own_input        INTEGER NOT NULL DEFAULT 0,
    own_output       INTEGER NOT NULL DEFAULT 0,
    own_cache_read   INTEGER NOT NULL DEFAULT 0,
    own_cache_write  INTEGER NOT NULL DEFAULT 0,
    own_cost         INTEGER NOT NULL DEFAULT 0,
    sub_calls        INTEGER NOT NULL DEFAULT 0,
    sub_tokens       INTEGER NOT NULL DEFAULT 0,
    sub_cost         INTEGER NOT NULL DEFAULT 0,
    res_calls        INTEGER NOT NULL DEFAULT 0 CHECK (res_calls >= 0),
    res_tokens       INTEGER NOT NULL DEFAULT 0 CHECK (res_tokens >= 0),
    res_cost         INTEGER NOT NULL DEFAULT 0 CHECK (res_cost >= 0)
);
INSERT INTO accounts (session_id, depth) SELECT session_id, depth FROM sessions;
-- The sessions whose wall-clock budget may run out (the owner's check).
CREATE INDEX accounts_deadline ON accounts (deadline_ms) WHERE deadline_ms IS NOT NULL;

-- A call's worst case, reserved on its session's path until it settles (or
-- is released as stale: its replica died mid-call).
CREATE TABLE reservations (
    reservation_id  TEXT PRIMARY KEY NOT NULL,
    session_id      TEXT NOT NULL REFERENCES sessions (session_id),
    calls           INTEGER NOT NULL,
    tokens          INTEGER NOT NULL,
    cost            INTEGER NOT NULL,
    created_at_ms   INTEGER NOT NULL
);
CREATE INDEX reservations_by_age ON reservations (created_at_ms);

-- Every model call settled, as the provider's answer reported it.
CREATE TABLE model_calls (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id          TEXT NOT NULL REFERENCES sessions (session_id),
    tree_id             TEXT NOT NULL,
    workspace_id        TEXT NOT NULL,
    provider            TEXT NOT NULL,
    model               TEXT NOT NULL,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cache_read_tokens   INTEGER NOT NULL,
    cache_write_tokens  INTEGER NOT NULL,
    cost                INTEGER NOT NULL,
    started_at_ms       INTEGER NOT NULL,
    duration_ms         INTEGER NOT NULL,
    outcome             TEXT NOT NULL CHECK (outcome IN ('ok', 'failed', 'cancelled', 'released')),
    http_status         INTEGER
);
CREATE INDEX model_calls_by_session ON model_calls (session_id, id);
CREATE INDEX model_calls_by_tree ON model_calls (tree_id, id);
