-- Sign-ins of the web console (`--console-listen`): each an operator's
-- browser holding a random id in an HttpOnly cookie. Only the id's SHA-256
-- is kept, so a copy of the database signs no one in. Every service on the
-- database answers for every console session.
CREATE TABLE console_sessions (
    -- Hex SHA-256 of the cookie's id.
    id_hash        TEXT PRIMARY KEY,
    -- Required in a header of every state-changing request of this sign-in.
    csrf_token     TEXT NOT NULL,
    created_at_ms  BIGINT NOT NULL,
    expires_at_ms  BIGINT NOT NULL
);

CREATE INDEX console_sessions_expiry ON console_sessions (expires_at_ms);
