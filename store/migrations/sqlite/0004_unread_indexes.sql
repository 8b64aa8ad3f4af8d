-- Indexes no query reads: sessions are read from the in-memory ledger by id,
-- events in id order, the audit in id order. Each cost pages of write-ahead
-- log on every create (a random leaf page per index and insert).
DROP INDEX sessions_by_workspace;
DROP INDEX sessions_by_parent;
DROP INDEX sessions_by_tree;
DROP INDEX events_by_session;
DROP INDEX audit_by_target;
DROP INDEX audit_by_caller;
