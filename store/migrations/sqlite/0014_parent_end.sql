-- What happens to a session when its parent ends: 'terminate' (as every
-- session made before), 'abandon' or 'notify'; and whether its parent ended
-- while it stayed active (an orphan).
ALTER TABLE sessions ADD COLUMN on_parent_end TEXT NOT NULL DEFAULT 'terminate';
ALTER TABLE sessions ADD COLUMN orphaned INTEGER NOT NULL DEFAULT 0;
