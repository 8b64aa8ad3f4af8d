-- What a tree's snapshot in the web console carries so that its page need
-- not replay the workspace's events: each session's last progress report
-- (the detail of its last progress event, written with it), and the spawns
-- the rules refused (few among the audit entries: a partial index).
ALTER TABLE sessions ADD COLUMN last_progress TEXT;

CREATE INDEX audit_refused_spawns ON audit (id)
    WHERE action = 'create_session' AND NOT allowed;
