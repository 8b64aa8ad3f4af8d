-- Budgets and model usage. One account per session (made with it): its
-- budget (each limit NULL: none of its own), its deadline (its wall-clock
-- budget's end, or its nearest ancestor's, whichever is first), and its
-- usage: its own calls (count, tokens by kind, cost in pico-dollars), its
-- subtree's settled calls (itself and every descendant), and what calls of
-- its subtree have reserved and not yet settled. A session's own and
-- subtree counters change on every row of its path, in the transaction
-- that reserves or settles a call. Account rows are locked root-down
-- (by depth), before any session row, by reservations and settlements
-- only: no transaction holding a session row waits for an account row.
CREATE TABLE accounts (
    session_id       TEXT PRIMARY KEY REFERENCES sessions (session_id),
    depth            BIGINT NOT NULL,
    cost_limit       BIGINT,
    tokens_limit     BIGINT,
    calls_limit      BIGINT,
    wall_ms          BIGINT,
    deadline_ms      BIGINT,
    own_calls        BIGINT NOT NULL DEFAULT 0,
    own_input        BIGINT NOT NULL DEFAULT 0,
    own_output       BIGINT NOT NULL DEFAULT 0,
    own_cache_read   BIGINT NOT NULL DEFAULT 0,
    own_cache_write  BIGINT NOT NULL DEFAULT 0,
    own_cost         BIGINT NOT NULL DEFAULT 0,
    sub_calls        BIGINT NOT NULL DEFAULT 0,
    sub_tokens       BIGINT NOT NULL DEFAULT 0,
    sub_cost         BIGINT NOT NULL DEFAULT 0,
    res_calls        BIGINT NOT NULL DEFAULT 0 CHECK (res_calls >= 0),
    res_tokens       BIGINT NOT NULL DEFAULT 0 CHECK (res_tokens >= 0),
    res_cost         BIGINT NOT NULL DEFAULT 0 CHECK (res_cost >= 0)
);
INSERT INTO accounts (session_id, depth) SELECT session_id, depth FROM sessions;
-- The sessions whose wall-clock budget may run out (the owner's check).
CREATE INDEX accounts_deadline ON accounts (deadline_ms) WHERE deadline_ms IS NOT NULL;

-- A call's worst case, reserved on its session's path until it settles (or
-- is released as stale: its replica died mid-call).
CREATE TABLE reservations (
    reservation_id  TEXT PRIMARY KEY,
    session_id      TEXT NOT NULL REFERENCES sessions (session_id),
    calls           BIGINT NOT NULL,
    tokens          BIGINT NOT NULL,
    cost            BIGINT NOT NULL,
    created_at_ms   BIGINT NOT NULL
);
CREATE INDEX reservations_by_age ON reservations (created_at_ms);

-- Every model call settled, as the provider's answer reported it.
CREATE TABLE model_calls (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id          TEXT NOT NULL REFERENCES sessions (session_id),
    tree_id             TEXT NOT NULL,
    workspace_id        TEXT NOT NULL,
    provider            TEXT NOT NULL,
    model               TEXT NOT NULL,
    input_tokens        BIGINT NOT NULL,
    output_tokens       BIGINT NOT NULL,
    cache_read_tokens   BIGINT NOT NULL,
    cache_write_tokens  BIGINT NOT NULL,
    cost                BIGINT NOT NULL,
    started_at_ms       BIGINT NOT NULL,
    duration_ms         BIGINT NOT NULL,
    outcome             TEXT NOT NULL CHECK (outcome IN ('ok', 'failed', 'cancelled', 'released')),
    http_status         BIGINT
);
CREATE INDEX model_calls_by_session ON model_calls (session_id, id);
CREATE INDEX model_calls_by_tree ON model_calls (tree_id, id);
