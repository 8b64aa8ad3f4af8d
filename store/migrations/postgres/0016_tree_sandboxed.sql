-- Of a tree's sessions, the sandboxed ones: what is left of the tree quota
-- is told a sandboxed spawner counting only the sessions it may see.
ALTER TABLE trees ADD COLUMN sandboxed INTEGER NOT NULL DEFAULT 0;
UPDATE trees SET sandboxed = (
    SELECT COUNT(*) FROM sessions s
    WHERE s.tree_id = trees.tree_id AND s.trust_level = 'sandboxed');
