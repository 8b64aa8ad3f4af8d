-- The variables an agent definition gives its command (its front matter's
-- `env`), as a JSON object of names to values; '{}' when it sets none.
ALTER TABLE agents ADD COLUMN env TEXT NOT NULL DEFAULT '{}';
