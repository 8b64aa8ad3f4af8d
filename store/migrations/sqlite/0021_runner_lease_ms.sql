-- PostgreSQL's 0021 keeps a runner's lease expiry in milliseconds, as
-- SQLite always did (`lease_expires_ms`); nothing changes here.
SELECT 1;
